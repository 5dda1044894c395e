"""Peak-context predictors: what BASIN reserves for a session at its first call.

At a session's first call the controller asks a :class:`PeakPredictor` for the
session's peak context (its largest prompt plus output,
:attr:`basin.workload.records.Session.peak_context_tokens`) and keeps the
answer until the session ends. Three implementations:

* :class:`RidgePeakPredictor`: the paper's predictor (section 6.5), a ridge
  regression of log peak on TF-IDF features of the task text and the log
  lengths of the task text and first prompt, one model per workload
  (:mod:`basin.predict.ridge` has the model and how its unpenalised length
  terms are fitted);
* :class:`OraclePredictor`: the true peak (the "exact peaks" ablation);
* :class:`NoisyOraclePredictor`: the true peak times ``exp(sigma * z)`` with
  ``z`` standard normal, drawn from ``(seed, session_id)`` only (the
  "lognormal error sigma" ablation).

:func:`make_predictor` builds one from a short spec ("ridge", "ridge:FILE",
"oracle", "noisy:0.5", "noisy:0.5:7").

**Cross-fitting at run time.** A ridge predictor is fitted on the same
workload the simulator then replays. Answering with a model that saw the
session's own peak would be in-sample and flatter the controller, so
:class:`RidgePeakPredictor` keeps the cross-fitted fold models as well as the
model fitted on everything: a session whose task (its task text; its id when
it has no text) was in the training data is answered by the model of the fold
that held that task out, which is exactly the prediction ``basin predict eval``
scores. Unseen tasks get the all-data model. Folds hold whole tasks (every
rerun of a task text in one fold), so reruns cannot leak a task's peak into
its own prediction.

**Floor.** A session's peak is at least its first prompt, which is known at
the first call, so every ridge prediction is raised to at least
``first_prompt_tokens`` (evaluation scores the floored predictions too).

**Sessions without task text** have an empty TF-IDF row and a log task length
of 0 (``log(1 + 0)``); a workload without any text (``terminalbench-claude``)
is predicted from the first-prompt length alone.

**Saved models.** ``basin predict fit`` and the "ridge" spec store the fitted
predictor with joblib under ``$BASIN_CACHE_DIR/predict/`` (default
``$XDG_CACHE_HOME/basin-serve`` or ``~/.cache/basin-serve``), one file per
workload named ``<workload>-<fingerprint>.joblib``. The fingerprint hashes
the training sessions (ids, texts, first prompts, peaks) and the fit settings,
so a changed workload or predictor version refits instead of loading a stale
model.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from basin import diskcache
from basin.errors import BasinInputError, where
from basin.workload.presets import resolve_workload
from basin.workload.records import Session, Workload

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

#: Bump when the model, its features or the saved layout change: older cache
#: files are then refitted instead of loaded.
MODEL_FORMAT = 2

#: Default cross-fitting folds (whole tasks per fold) and seed.
DEFAULT_FOLDS = 10
DEFAULT_SEED = 0

SPEC_HELP = ("ridge, ridge:FILE, ridge|ridge-text|knn|gbt|quantile|auto[:q=LEVEL], growth:FACTOR, oracle, "
             "noisy:SIGMA or noisy:SIGMA:SEED")

#: Model kinds of the calibrated predictors (:mod:`basin.predict.calibrated`).
CALIBRATED_KINDS = ("ridge", "ridge-text", "knn", "gbt", "quantile", "auto")


@runtime_checkable
class PeakPredictor(Protocol):
    """What the controller asks at a session's first call."""

    def predict_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None) -> float:
        """Predicted peak context (tokens, > 0) of the session.

        ``oracle_peak_tokens`` is the true peak when the driver knows it (the
        simulator does); only the oracle predictors read it.
        """
        ...


# ---------------------------------------------------------------------------
# Input checks


def _check_call(task_text: object, first_prompt_tokens: object, session_id: object) -> None:
    if task_text is not None and not isinstance(task_text, str):
        raise BasinInputError(f"{where(field='task_text')}: expected a string or None, got "
                              f"{type(task_text).__name__}; pass the session's task text or None")
    if (isinstance(first_prompt_tokens, bool) or not isinstance(first_prompt_tokens, numbers.Integral)
            or first_prompt_tokens < 0):
        raise BasinInputError(f"{where(field='first_prompt_tokens')}: expected a whole number of tokens "
                              f">= 0, got {first_prompt_tokens!r}; pass the first call's prompt_tokens")
    if not isinstance(session_id, str) or not session_id:
        raise BasinInputError(f"{where(field='session_id')}: expected a non-empty string, got "
                              f"{session_id!r}; pass the session's id")


def _check_oracle(oracle_peak_tokens: object) -> int:
    if oracle_peak_tokens is None:
        raise BasinInputError(f"{where(field='oracle_peak_tokens')}: the oracle predictors need the "
                              "session's true peak; pass Session.peak_context_tokens, or use the "
                              "'ridge' predictor where true peaks are unknown (the gateway)")
    if (isinstance(oracle_peak_tokens, bool) or not isinstance(oracle_peak_tokens, numbers.Integral)
            or oracle_peak_tokens <= 0):
        raise BasinInputError(f"{where(field='oracle_peak_tokens')}: expected a positive whole number "
                              f"of tokens, got {oracle_peak_tokens!r}; pass Session.peak_context_tokens")
    return int(oracle_peak_tokens)


# ---------------------------------------------------------------------------
# Length only


class GrowthPredictor:
    """The first prompt times a fixed growth factor.

    For traffic no trained model describes (a gateway in front of a new
    workload): it keeps the ordering by size that the first prompt carries
    and reserves room for the session to grow.
    """

    name = "growth"

    def __init__(self, factor: float):
        if not math.isfinite(factor) or factor < 1.0:
            raise BasinInputError(f"{where(field='predictor')}: growth factor must be a number >= 1, got "
                                  f"{factor!r}; e.g. growth:1.5")
        self.factor = float(factor)

    def predict_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None = None) -> float:
        _check_call(task_text, first_prompt_tokens, session_id)
        return max(self.factor * first_prompt_tokens, 1.0)

    def __repr__(self) -> str:
        return f"GrowthPredictor(factor={self.factor:g})"


# ---------------------------------------------------------------------------
# Oracles


class OraclePredictor:
    """The true peak: ``predict_peak_tokens`` returns ``oracle_peak_tokens`` exactly."""

    name = "oracle"

    def predict_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None) -> float:
        _check_call(task_text, first_prompt_tokens, session_id)
        return float(_check_oracle(oracle_peak_tokens))

    def __repr__(self) -> str:
        return "OraclePredictor()"


class NoisyOraclePredictor:
    """The true peak times ``exp(sigma * z)``, ``z ~ N(0, 1)``.

    ``z`` is drawn from a generator seeded by ``seed`` and a hash of the
    session id alone, so a session gets the same error in every run, whatever
    order sessions arrive in and whichever policy runs. The error is
    median-unbiased (its log has mean 0 and standard deviation ``sigma``);
    its mean is ``exp(sigma^2 / 2)``. ``sigma = 0`` is the oracle.
    """

    def __init__(self, sigma: float, seed: int = 0):
        if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not math.isfinite(sigma) or sigma < 0:
            raise BasinInputError(f"{where(field='sigma')}: expected a finite number >= 0, got {sigma!r}; "
                                  "use e.g. noisy:0.5")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise BasinInputError(f"{where(field='seed')}: expected a whole number >= 0, got {seed!r}; "
                                  "use e.g. noisy:0.5:1")
        self.sigma: float = float(sigma)
        self.seed: int = int(seed)
        self.name = f"noisy:{self.sigma:g}:{self.seed}"

    def log_error(self, session_id: str) -> float:
        """The session's log error, ``sigma * z``."""
        digest = hashlib.sha256(session_id.encode("utf-8")).digest()
        rng = np.random.default_rng([self.seed, int.from_bytes(digest[:8], "little")])
        return self.sigma * float(rng.standard_normal())

    def predict_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None) -> float:
        _check_call(task_text, first_prompt_tokens, session_id)
        return _check_oracle(oracle_peak_tokens) * math.exp(self.log_error(session_id))

    def __repr__(self) -> str:
        return f"NoisyOraclePredictor(sigma={self.sigma:g}, seed={self.seed})"


# ---------------------------------------------------------------------------
# Training data


def group_key(task_text: str | None, session_id: str) -> str:
    """The task a session belongs to: its task text, or its own id when it has none.

    Sessions with one key are reruns of one task; folds never split them.
    """
    if task_text:
        return "text:" + hashlib.sha256(task_text.encode("utf-8")).hexdigest()
    return "id:" + session_id


@dataclass(frozen=True)
class TrainingData:
    """A workload as the regression sees it."""

    session_ids: tuple[str, ...]
    rows: tuple[tuple[str | None, int], ...]  # (task text, first-prompt tokens)
    peaks: np.ndarray  # true peak context, tokens
    groups: tuple[str, ...]

    @classmethod
    def from_sessions(cls, sessions: Sequence[Session]) -> TrainingData:
        return cls(
            session_ids=tuple(s.session_id for s in sessions),
            rows=tuple((s.task_text, s.first_prompt_tokens) for s in sessions),
            # A session of empty calls has peak 0; count it as 1 token so its log exists.
            peaks=np.array([max(s.peak_context_tokens, 1) for s in sessions], dtype=float),
            groups=tuple(group_key(s.task_text, s.session_id) for s in sessions),
        )

    @property
    def log_peaks(self) -> np.ndarray:
        return np.log(self.peaks)

    def fingerprint(self, **settings: object) -> str:
        h = hashlib.sha256(f"format={MODEL_FORMAT};{sorted(settings.items())!r}".encode())
        for sid, (text, prompt), peak in zip(self.session_ids, self.rows, self.peaks):
            h.update(f"\x00{sid}\x01{prompt}\x01{int(peak)}\x01".encode())
            h.update((text or "\x02none").encode("utf-8"))
        return h.hexdigest()


def _one_blas_thread() -> Any:
    """Run BLAS single-threaded: the matrices are a few hundred rows, and extra
    BLAS threads only spin (on a busy machine they slowed a fit tenfold)."""
    # Lazy: threadpoolctl (about 3 ms to import) is needed only when fitting.
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def _floored(log_pred: np.ndarray, rows: Sequence[tuple[str | None, int]]) -> np.ndarray:
    prompts = np.array([max(p, 1) for _, p in rows], dtype=float)
    return np.maximum(np.exp(log_pred), prompts)


@dataclass
class CrossFit:
    """Out-of-fold predictions of a workload and the fold models that made them."""

    predictions: np.ndarray  # floored peak predictions, tokens, in session order
    fold_of_session: np.ndarray
    models: list[Any]  # fitted pipelines, one per fold
    fold_of_group: dict[str, int]
    seconds: float


def cross_fit(data: TrainingData, folds: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED,
              use_text: bool = True, groups: Sequence[str] | None = None, kind: str = "ridge") -> CrossFit:
    """Predict every session with a model fitted without its fold.

    Folds hold whole groups (``groups``, default the task keys), so every
    rerun of a task is held out with it. Each fold fits its own vocabulary,
    IDF, centring and alpha (and, for ``kind="auto"``, its choice of model)
    from its training part only.
    """
    # Lazy: this import loads scikit-learn (1001 modules); only this path uses it.
    from basin.predict.ridge import fit_model as fit_ridge
    from basin.predict.ridge import group_splits

    def fit_model(rows: Any, y: Any, groups: Any, *, seed: int, use_text: bool) -> Any:
        if kind == "ridge":
            return fit_ridge(rows, y, groups, seed=seed, use_text=use_text)
        # Lazy: this import loads scikit-learn (1154 modules); only this path uses it.
        from basin.predict.models import fit_kind

        return fit_kind(kind, rows, y, groups, seed=seed, use_text=use_text)

    groups = tuple(data.groups if groups is None else groups)
    n_groups = len(set(groups))
    if n_groups < 2:
        raise BasinInputError(f"{where(field='sessions')}: cross-fitting needs at least two distinct tasks, "
                              f"the workload has {n_groups}; use a larger workload")
    t0 = time.perf_counter()
    y = data.log_peaks
    log_pred = np.empty(len(y))
    fold_of_session = np.empty(len(y), dtype=int)
    models = []
    splits = group_splits(groups, folds, seed)
    with _one_blas_thread():
        for f, (train, test) in enumerate(splits):
            model = fit_model([data.rows[i] for i in train], y[train], [groups[i] for i in train],
                              seed=seed, use_text=use_text)
            log_pred[test] = model.predict([data.rows[i] for i in test])
            fold_of_session[test] = f
            models.append(model)
    fold_of_group = {g: int(f) for g, f in zip(groups, fold_of_session)}
    return CrossFit(_floored(log_pred, data.rows), fold_of_session, models, fold_of_group,
                    time.perf_counter() - t0)


# ---------------------------------------------------------------------------
# Evaluation


@dataclass(frozen=True)
class PeakEvaluation:
    """Cross-fitted accuracy of the ridge predictor on one workload."""

    workload: str
    sessions: int
    groups: int
    folds: int
    fold_seed: int
    group_by: str
    use_text: bool
    spearman: float
    log_error_sd: float
    log_error_mean: float
    #: Spearman of each raw length alone against peak (no model), for reference.
    spearman_first_prompt: float
    spearman_task_chars: float | None
    #: Median over folds of the chosen ridge penalty (None: no text features).
    alpha_median: float | None
    text_terms_median: float
    seconds: float
    predictions: np.ndarray = field(repr=False, compare=False)
    peaks: np.ndarray = field(repr=False, compare=False)
    #: The model (one of :data:`CALIBRATED_KINDS`) and the kinds the folds chose.
    model: str = "ridge"
    fold_models: tuple[str, ...] = ()
    #: The point prediction's and (with a level) the conformal reservation's
    #: coverage and over/under-shoot (:func:`basin.predict.calibrated.reservation_figures`).
    point: dict[str, float] = field(default_factory=dict, compare=False)
    level: float | None = None
    reservation: dict[str, float] | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: getattr(self, k) for k in (
            "workload", "sessions", "groups", "folds", "fold_seed", "group_by", "use_text", "spearman",
            "log_error_sd", "log_error_mean", "spearman_first_prompt", "spearman_task_chars",
            "alpha_median", "text_terms_median", "seconds", "model", "level")}
        out["protocol"] = _PROTOCOLS.get(self.group_by, self.group_by)
        out["fold_models"] = sorted(set(self.fold_models))
        out["point"] = {k: round(v, 4) for k, v in self.point.items()}
        out["reservation"] = None if self.reservation is None else {
            k: round(v, 4) for k, v in self.reservation.items()}
        for k, v in out.items():
            if isinstance(v, float):
                out[k] = round(v, 4)
        return out


#: What each fold protocol is, in words (reports name the protocol).
_PROTOCOLS = {"task": "task-grouped k-fold (every rerun of a task held out with it; honest)",
              "session": "plain k-fold over sessions (reruns split across folds; leaks a task's peak)"}


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    # Lazy: scipy takes about 0.27 s to import; only this path uses it.
    from scipy.stats import spearmanr

    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b)[0])


def evaluate(workload: Workload, folds: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED,
             use_text: bool = True, group_by: str = "task", model: str = "ridge",
             level: float | None = None) -> PeakEvaluation:
    """Cross-fitted rank correlation and log-error spread of the ridge predictor.

    ``group_by="task"`` (the honest default) keeps reruns of a task in one
    fold; ``"session"`` holds out single sessions, which lets a rerun's
    identical text carry its task's peak into the prediction (leaky; only for
    comparison with a plain leave-one-trajectory-out protocol).

    ``model`` picks the regression (:mod:`basin.predict.models`); with
    ``level`` the split-conformal reservation of each session is formed from
    the residuals of the *other* folds (cross-conformal), and its coverage and
    over/under-shoot are reported.
    """
    # Lazy: basin.predict.calibrated imports this module (an import circle).
    from basin.predict.calibrated import KINDS, check_level, conformal_offsets, reservation_figures

    # Lazy: this import loads scikit-learn (1154 modules); only this path uses it.
    from basin.predict.models import model_kind

    _check_folds(folds, seed)
    if model not in KINDS:
        raise BasinInputError(f"{where(field='model')}: unknown model {model!r}; use one of {', '.join(KINDS)}")
    level = check_level(level)
    data = TrainingData.from_sessions(workload.sessions)
    if group_by == "task":
        groups = data.groups
    elif group_by == "session":
        groups = data.session_ids
    else:
        raise BasinInputError(f"{where(field='group_by')}: expected 'task' or 'session', got {group_by!r}")
    cf = cross_fit(data, folds=folds, seed=seed, use_text=use_text, groups=groups, kind=model)
    err = np.log(cf.predictions) - data.log_peaks
    reservation = None
    if level is not None:
        raw = np.array([float(cf.models[f].predict([row])[0]) for f, row in zip(cf.fold_of_session, data.rows)])
        offsets = conformal_offsets(data.log_peaks - raw, cf.fold_of_session, level)
        reserve = _floored(raw + np.array([offsets[int(f)] for f in cf.fold_of_session]), data.rows)
        reservation = reservation_figures(reserve, data.peaks)
    chars = np.array([len(t) if t else 0 for t, _ in data.rows], dtype=float)
    prompts = np.array([p for _, p in data.rows], dtype=float)
    steps = [m.named_steps for m in cf.models if model_kind(m) in ("ridge", "ridge-text")]
    return PeakEvaluation(
        workload=workload.name, sessions=len(data.rows), groups=len(set(groups)), folds=len(cf.models),
        fold_seed=seed, group_by=group_by, use_text=use_text,
        spearman=_spearman(cf.predictions, data.peaks),
        log_error_sd=float(np.std(err, ddof=1)) if len(err) > 1 else float("nan"),
        log_error_mean=float(err.mean()),
        spearman_first_prompt=_spearman(prompts, data.peaks),
        spearman_task_chars=_spearman(chars, data.peaks) if chars.any() else None,
        alpha_median=_alpha_median(steps),
        text_terms_median=float(np.median([s["features"].n_terms_ for s in steps])) if steps else 0.0,
        seconds=cf.seconds, predictions=cf.predictions, peaks=data.peaks,
        model=model, fold_models=tuple(model_kind(m) for m in cf.models),
        point=reservation_figures(cf.predictions, data.peaks), level=level, reservation=reservation,
    )


def _alpha_median(steps: list[Any]) -> float | None:
    alphas = [s["ridge"].alpha for s in steps if s["features"].n_terms_]
    return float(np.median(alphas)) if alphas else None


def _check_folds(folds: object, seed: object = 0) -> None:
    if isinstance(folds, bool) or not isinstance(folds, numbers.Integral) or folds < 2:
        raise BasinInputError(f"{where(field='folds')}: expected a whole number >= 2, got {folds!r}; "
                              "use e.g. --folds 10 (more than the tasks means leave-one-task-out)")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise BasinInputError(f"{where(field='fold_seed')}: expected a whole number >= 0, got {seed!r}; "
                              "use e.g. --fold-seed 0")


# ---------------------------------------------------------------------------
# The ridge predictor


class RidgePeakPredictor:
    """The fitted ridge predictor of one workload (see the module docstring).

    Build with :meth:`fit` or :meth:`load`. ``meta`` records the workload, its
    fingerprint, the folds and the cross-fitted accuracy.
    """

    name = "ridge"

    def __init__(self, full_model: Pipeline, fold_models: list[Pipeline], fold_of_group: dict[str, int],
                 meta: dict[str, Any]):
        self.full_model = full_model
        self.fold_models = fold_models
        self.fold_of_group = fold_of_group
        self.meta = meta
        #: (fold or -1, task text) -> log prediction at a zero-token first prompt (see predict_peak_tokens).
        self._text_part: dict[tuple[int, str | None], float] = {}

    @classmethod
    def fit(cls, workload: Workload, folds: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED) -> RidgePeakPredictor:
        """Fit the cross-fitted fold models and the all-data model of ``workload``."""
        # Lazy: this import loads scikit-learn (1001 modules); only this path uses it.
        from basin.predict.ridge import fit_model

        _check_folds(folds, seed)
        data = TrainingData.from_sessions(workload.sessions)
        t0 = time.perf_counter()
        cf = cross_fit(data, folds=folds, seed=seed)
        with _one_blas_thread():
            full = fit_model(list(data.rows), data.log_peaks, list(data.groups), seed=seed)
        err = np.log(cf.predictions) - data.log_peaks
        meta = {
            "format": MODEL_FORMAT,
            "workload": workload.name,
            "origin": workload.origin,
            "fingerprint": data.fingerprint(folds=folds, seed=seed),
            "sessions": len(data.rows),
            "groups": len(set(data.groups)),
            "folds": len(cf.models),
            "fold_seed": seed,
            "alpha": _alpha_median([full.named_steps]),
            "text_terms": int(full.named_steps["features"].n_terms_),
            "spearman": _spearman(cf.predictions, data.peaks),
            "log_error_sd": float(np.std(err, ddof=1)) if len(err) > 1 else float("nan"),
            "fit_seconds": time.perf_counter() - t0,
        }
        return cls(full, cf.models, cf.fold_of_group, meta)

    # -- prediction

    def fold_for(self, task_text: str | None, session_id: str) -> int | None:
        """The fold that held this task out in fitting, or None for a task not seen then."""
        return self.fold_of_group.get(group_key(task_text, session_id))

    def model_for(self, task_text: str | None, session_id: str) -> Pipeline:
        """The fold model that held this task out, or the all-data model for an unseen task."""
        fold = self.fold_for(task_text, session_id)
        return self.full_model if fold is None else self.fold_models[fold]

    def predict_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None = None) -> float:
        _check_call(task_text, first_prompt_tokens, session_id)
        fold = self.fold_for(task_text, session_id)
        model = self.full_model if fold is None else self.fold_models[fold]
        # The model is linear and log(1 + 0) = 0, so the prediction at a zero-token
        # prompt is everything but the prompt term; it depends on the text only and
        # is memoised (a replay meets each task text many times).
        key = (-1 if fold is None else fold, task_text)
        part = self._text_part.get(key)
        if part is None:
            if len(self._text_part) >= 100_000:
                self._text_part.clear()
            part = self._text_part[key] = float(model.predict([(task_text, 0)])[0])
        # Lazy: this import loads scikit-learn (1001 modules); only this path uses it.
        from basin.predict.ridge import PROMPT_COLUMN

        slope = float(model.named_steps["ridge"].coef_free_[PROMPT_COLUMN])
        log_pred = part + slope * math.log1p(first_prompt_tokens)
        return max(math.exp(log_pred), float(max(first_prompt_tokens, 1)))

    # -- persistence

    def save(self, path: str | Path) -> Path:
        """Write the predictor with joblib (atomically: a temporary file, then a rename)."""
        # Lazy: joblib takes about 70 ms to import; only this path uses it.
        import joblib

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        joblib.dump({"format": MODEL_FORMAT, "meta": self.meta, "full": self.full_model,
                     "folds": self.fold_models, "fold_of_group": self.fold_of_group}, tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> RidgePeakPredictor:
        """Read a predictor written by :meth:`save` (``basin predict fit``)."""
        # Lazy: joblib takes about 70 ms to import; only this path uses it.
        import joblib

        path = Path(path)
        if not path.is_file():
            raise BasinInputError(f"{where(path, field='model')}: no such file; write one with "
                                  "`basin predict fit WORKLOAD --out FILE`")
        try:
            blob = joblib.load(path)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
            raise BasinInputError(f"{where(path, field='model')}: not a saved peak predictor ({exc}); "
                                  "refit with `basin predict fit WORKLOAD --out FILE`") from exc
        if not isinstance(blob, dict) or blob.get("format") != MODEL_FORMAT:
            found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
            raise BasinInputError(f"{where(path, field='format')}: expected a peak predictor of format "
                                  f"{MODEL_FORMAT}, found {found!r}; refit with `basin predict fit WORKLOAD`")
        return cls(blob["full"], blob["folds"], blob["fold_of_group"], blob["meta"])

    def __repr__(self) -> str:
        m = self.meta
        return (f"RidgePeakPredictor(workload={m.get('workload')!r}, sessions={m.get('sessions')}, "
                f"folds={m.get('folds')})")


# ---------------------------------------------------------------------------
# Model cache and the spec registry


def cache_dir() -> Path:
    """Where fitted predictors are kept: ``$BASIN_CACHE_DIR/predict`` (see the module docstring)."""
    root = os.environ.get("BASIN_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "basin-serve")
    return Path(root) / "predict"


def default_model_path(workload: Workload, folds: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED) -> Path:
    """The cache file a ridge predictor of ``workload`` is saved to and loaded from."""
    data = TrainingData.from_sessions(workload.sessions)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(workload.name).name)[:60] or "workload"
    return cache_dir() / f"{safe}-{data.fingerprint(folds=folds, seed=seed)[:16]}.joblib"


class TabulatedRidge:
    """The ridge predictor's answers for the task texts of its own workload,
    tabulated: the text part of each (fold, text) and each model's prompt
    slope, exactly as :meth:`RidgePeakPredictor.predict_peak_tokens` computes
    them. The fitted models (and scikit-learn, whose import and unpickling
    are most of a short run's start) are loaded only for a text outside the
    table."""

    name = "ridge"

    def __init__(self, parts: dict[tuple[int, str | None], float], slopes: dict[int, float],
                 fold_of_group: dict[str, int], meta: dict[str, Any], model_path: Path):
        self.parts = parts
        self.slopes = slopes
        self.fold_of_group = fold_of_group
        self.meta = meta
        self.model_path = model_path
        self._full: RidgePeakPredictor | None = None

    @classmethod
    def of(cls, predictor: RidgePeakPredictor, sessions: Sequence[Session], model_path: Path) -> TabulatedRidge:
        # Lazy: this import loads scikit-learn (1001 modules); only this path uses it.
        from basin.predict.ridge import PROMPT_COLUMN

        parts: dict[tuple[int, str | None], float] = {}
        for s in sessions:
            fold = predictor.fold_for(s.task_text, s.session_id)
            key = (-1 if fold is None else fold, s.task_text)
            if key not in parts:
                model = predictor.full_model if fold is None else predictor.fold_models[fold]
                parts[key] = float(model.predict([(s.task_text, 0)])[0])
        models = {-1: predictor.full_model} | dict(enumerate(predictor.fold_models))
        slopes = {f: float(m.named_steps["ridge"].coef_free_[PROMPT_COLUMN]) for f, m in models.items()}
        table = cls(parts, slopes, predictor.fold_of_group, predictor.meta, model_path)
        table._full = predictor
        return table

    def predict_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None = None) -> float:
        _check_call(task_text, first_prompt_tokens, session_id)
        fold = self.fold_of_group.get(group_key(task_text, session_id))
        f = -1 if fold is None else fold
        part = self.parts.get((f, task_text))
        if part is None:
            if self._full is None:
                self._full = RidgePeakPredictor.load(self.model_path)
            return self._full.predict_peak_tokens(task_text, first_prompt_tokens, session_id, oracle_peak_tokens)
        log_pred = part + self.slopes[f] * math.log1p(first_prompt_tokens)
        return max(math.exp(log_pred), float(max(first_prompt_tokens, 1)))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_full"] = None  # the table alone goes to the disk cache
        return state

    def __repr__(self) -> str:
        m = self.meta
        return f"TabulatedRidge(workload={m.get('workload')!r}, texts={len(self.parts)}, folds={m.get('folds')})"


_RIDGE_MEMO: dict[tuple[str, int | None], TabulatedRidge] = {}


def ridge_for_workload(workload_name: str) -> TabulatedRidge:
    """The ridge predictor of a workload spec, tabulated for its texts: from
    this process, else the disk caches, else fitted.

    The workload is resolved as ``resolve_workload(workload_name)`` (a
    synthetic preset's default draw, seed 0). A fitted model is saved to
    :func:`default_model_path`; an unwritable cache only costs a warning.
    """
    p = Path(workload_name)
    key = (workload_name, p.stat().st_mtime_ns if p.is_file() else None)
    if key in _RIDGE_MEMO:
        return _RIDGE_MEMO[key]
    workload = resolve_workload(workload_name)
    path = default_model_path(workload)
    # The table depends on the model (its file is named by the training
    # data's fingerprint) and on the code that fits and applies it.
    code = diskcache.source_digest(Path(__file__).parent.glob("*.py"))
    table_key = diskcache.make_key("ridge-table", path.name, MODEL_FORMAT, code, _sklearn_version())

    def tabulate() -> TabulatedRidge:
        return TabulatedRidge.of(_ridge_model(workload, path), workload.sessions, path)

    table = diskcache.cached("predict-tables", table_key, tabulate)
    _RIDGE_MEMO[key] = table
    return table


def _sklearn_version() -> str:
    # Lazy: importlib.metadata takes about 25 ms to import; only this path uses it.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scikit-learn")
    except PackageNotFoundError:
        return "none"


def _ridge_model(workload: Workload, path: Path) -> RidgePeakPredictor:
    """The fitted model of ``workload``: from ``path`` when it matches, else fitted and saved there."""
    predictor = None
    if path.is_file():
        try:
            predictor = RidgePeakPredictor.load(path)
        except BasinInputError:
            predictor = None
        if predictor is not None and predictor.meta.get("fingerprint") != TrainingData.from_sessions(
                workload.sessions).fingerprint(folds=DEFAULT_FOLDS, seed=DEFAULT_SEED):
            predictor = None
    if predictor is None:
        predictor = RidgePeakPredictor.fit(workload)
        try:
            predictor.save(path)
        except OSError as exc:
            warnings.warn(f"could not cache the peak predictor at {path}: {exc}", stacklevel=2)
    return predictor


def make_predictor(spec: str, workload_name: str | None = None) -> PeakPredictor:
    """A predictor from its spec.

    * ``ridge``: the ridge predictor of ``workload_name`` (fitted on first
      use, then cached in this process and on disk);
    * ``ridge:FILE``: a predictor saved by ``basin predict fit --out FILE``;
    * ``ridge-text``, ``knn``, ``gbt``, ``quantile``, ``auto``, and any of them or ``ridge`` with
      ``:q=LEVEL``: a calibrated predictor (:mod:`basin.predict.calibrated`)
      of that model, reserving the split-conformal ``LEVEL`` quantile of the
      peak (without ``q``: the point prediction); it also carries the fit of
      BASIN's online correction;
    * ``growth:FACTOR``: the first prompt times FACTOR (no trained model);
    * ``oracle``: the true peak;
    * ``noisy:SIGMA`` / ``noisy:SIGMA:SEED``: the true peak with lognormal
      error of log-sd SIGMA (seed 0 by default).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise BasinInputError(f"{where(field='predictor')}: expected a predictor spec, got {spec!r}; "
                              f"use {SPEC_HELP}")
    kind, _, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "oracle" and not arg:
        return OraclePredictor()
    if kind == "noisy":
        parts = arg.split(":")
        try:
            if not 1 <= len(parts) <= 2 or not parts[0]:
                raise ValueError
            sigma = float(parts[0])
            seed = int(parts[1]) if len(parts) == 2 else 0
        except ValueError:
            raise BasinInputError(f"{where(field='predictor')}: cannot read '{spec}'; write noisy:SIGMA or "
                                  "noisy:SIGMA:SEED, e.g. noisy:0.5 or noisy:1.0:3") from None
        return NoisyOraclePredictor(sigma, seed)
    if kind == "growth":
        try:
            factor = float(arg)
        except ValueError:
            raise BasinInputError(f"{where(field='predictor')}: cannot read '{spec}'; write growth:FACTOR, "
                                  "e.g. growth:1.5") from None
        return GrowthPredictor(factor)
    if kind in CALIBRATED_KINDS and (kind != "ridge" or "=" in arg):
        level = _spec_level(spec, arg)
        if not workload_name:
            raise BasinInputError(f"{where(field='workload')}: the '{kind}' predictor is fitted per workload "
                                  "and none was named; pass the workload (preset name or file)")
        # Lazy: basin.predict.calibrated imports this module (an import circle).
        from basin.predict.calibrated import calibrated_for_workload

        return calibrated_for_workload(workload_name, kind, level)
    if kind == "ridge":
        if arg:
            return RidgePeakPredictor.load(arg)
        if not workload_name:
            raise BasinInputError(f"{where(field='workload')}: the 'ridge' predictor is fitted per workload "
                                  "and none was named; pass the workload (preset name or file), or use "
                                  "ridge:FILE with a model from `basin predict fit`")
        return ridge_for_workload(workload_name)
    raise BasinInputError(f"{where(field='predictor')}: unknown predictor '{spec}'; use {SPEC_HELP}")


def _spec_level(spec: str, arg: str) -> float | None:
    """The ``q=LEVEL`` option of a calibrated spec (None when absent)."""
    level: float | None = None
    for item in filter(None, (a.strip() for a in arg.split(","))):
        key, eq, value = item.partition("=")
        if key.strip().lower() != "q" or not eq:
            raise BasinInputError(f"{where(field='predictor')}: unknown option '{item}' in '{spec}'; the one "
                                  "option is q=LEVEL, e.g. ridge:q=0.9")
        try:
            level = float(value)
        except ValueError:
            raise BasinInputError(f"{where(field='q')}: cannot read '{value}' in '{spec}'; write a level in "
                                  "(0, 1), e.g. ridge:q=0.9") from None
        if not 0 < level < 1:
            raise BasinInputError(f"{where(field='q')}: expected a reservation level in (0, 1), got {value} "
                                  f"in '{spec}'; e.g. ridge:q=0.9")
    return level
