"""Calibrated predictors: a chosen model, a conformal reservation quantile, a growth fit.

A :class:`CalibratedPredictor` answers two questions at a session's first
call: the point prediction of its peak (what BASIN's priority uses) and what
to reserve, an upper quantile of the peak at a stated ``level``. It also
carries the fit of BASIN's online correction (:mod:`basin.predict.growth`).

**Split conformal, on held-out tasks.** The log residuals ``log peak - log
prediction`` of the cross-fitted predictions are out-of-sample for their own
task (folds hold whole tasks). The reservation of a session answered by fold
``f``'s model adds the ``ceil((n + 1) level)``-th smallest residual of the
``n`` sessions *outside* fold ``f`` (cross-conformal), so the session's own
residual never sets its own offset; an unseen task gets the offset of all
residuals. Under exchangeability of tasks this covers the peak with
probability about ``level``; ``basin predict eval`` measures it.

Like the ridge predictor, a session whose task was in the fitting data is
answered by the fold model that held it out (docs/predictor.md).
"""

from __future__ import annotations

import math
import os
import re
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from basin import diskcache
from basin.errors import BasinInputError, where
from basin.predict.growth import GrowthFit, fit_growth
from basin.predict.peak import (
    CALIBRATED_KINDS,
    DEFAULT_FOLDS,
    DEFAULT_SEED,
    TrainingData,
    _check_call,
    _check_folds,
    _one_blas_thread,
    _spearman,
    cache_dir,
    cross_fit,
    group_key,
)
from basin.workload.presets import resolve_workload
from basin.workload.records import Session, Workload

#: Bump when the saved layout or the calibration changes.
CALIBRATED_FORMAT = 1

#: The model kinds (one list, kept by :mod:`basin.predict.peak`, which must not import scikit-learn).
KINDS = CALIBRATED_KINDS


def check_level(level: object) -> float | None:
    """A reservation level in (0, 1), or None (reserve the point prediction)."""
    if level is None:
        return None
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < float(level) < 1:
        raise BasinInputError(f"{where(field='q')}: expected a reservation level in (0, 1), got {level!r}; "
                              "e.g. ridge:q=0.9")
    return float(level)


def conformal_quantile(residuals: np.ndarray, level: float) -> float:
    """The split-conformal upper quantile: the ``ceil((n + 1) level)``-th smallest residual
    (the largest when that rank passes ``n``)."""
    r = np.sort(np.asarray(residuals, dtype=float))
    if not len(r):
        return 0.0
    k = min(math.ceil((len(r) + 1) * level), len(r))
    return float(r[k - 1])


def conformal_offsets(residuals: np.ndarray, fold_of_session: np.ndarray, level: float) -> dict[int, float]:
    """Fold -> offset from the residuals outside the fold; -1 -> offset from all of them."""
    out = {-1: conformal_quantile(residuals, level)}
    for f in np.unique(fold_of_session):
        out[int(f)] = conformal_quantile(residuals[fold_of_session != f], level)
    return out


def reservation_figures(reserve: np.ndarray, peaks: np.ndarray) -> dict[str, float]:
    """Coverage and the reservation's over- and under-shoot against true peaks.

    ``over_reservation_mean``: mean of ``max(reserve / peak - 1, 0)``;
    ``under_reservation_mean``: mean of ``max(1 - reserve / peak, 0)`` (the
    share of the peak left unreserved); ``reserved_over_peak``: total
    reserved over total peak.
    """
    ratio = reserve / peaks
    return {
        "coverage": float(np.mean(reserve >= peaks)),
        "over_reservation_mean": float(np.mean(np.maximum(ratio - 1.0, 0.0))),
        "under_reservation_mean": float(np.mean(np.maximum(1.0 - ratio, 0.0))),
        "reserved_over_peak": float(reserve.sum() / peaks.sum()),
    }


class _PointAndReservation:
    """The two answers of a calibrated predictor from one log point: the point
    prediction, and the point raised by its fold's conformal offset (both
    floored at the first prompt). Subclasses say where the log point comes
    from."""

    offsets: dict[int, float]

    def log_point(self, task_text: str | None, first_prompt_tokens: int, session_id: str) -> tuple[int, float]:
        raise NotImplementedError

    def predict_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None = None) -> float:
        _check_call(task_text, first_prompt_tokens, session_id)
        _, lp = self.log_point(task_text, first_prompt_tokens, session_id)
        return _floor(lp, first_prompt_tokens)

    def reserve_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None = None) -> float:
        _check_call(task_text, first_prompt_tokens, session_id)
        f, lp = self.log_point(task_text, first_prompt_tokens, session_id)
        return _floor(lp + self.offsets.get(f, self.offsets.get(-1, 0.0)), first_prompt_tokens)


class CalibratedPredictor(_PointAndReservation):
    """Point and reservation predictions of one workload (see the module docstring)."""

    name = "calibrated"

    def __init__(self, kind: str, level: float | None, full_model: Any, fold_models: list[Any],
                 fold_of_group: dict[str, int], offsets: dict[int, float], growth: GrowthFit,
                 meta: dict[str, Any]):
        self.kind = kind
        self.level = level
        self.full_model = full_model
        self.fold_models = fold_models
        self.fold_of_group = fold_of_group
        self.offsets = offsets
        self.growth = growth
        self.meta = meta
        self._memo: dict[tuple[int, str | None, int], float] = {}

    @classmethod
    def fit(cls, workload: Workload, kind: str = "ridge", level: float | None = None,
            folds: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED) -> CalibratedPredictor:
        # Lazy: this import loads scikit-learn (1154 modules); only this path uses it.
        from basin.predict.models import fit_kind, model_kind

        if kind not in KINDS:
            raise BasinInputError(f"{where(field='model')}: unknown model {kind!r}; use one of {', '.join(KINDS)}")
        level = check_level(level)
        _check_folds(folds, seed)
        data = TrainingData.from_sessions(workload.sessions)
        t0 = time.perf_counter()
        cf = cross_fit(data, folds=folds, seed=seed, kind=kind)
        with _one_blas_thread():
            full = fit_kind(kind, list(data.rows), data.log_peaks, list(data.groups), seed=seed)
        raw = np.array([float(m.predict([row])[0]) for m, row in
                        zip((cf.models[f] for f in cf.fold_of_session), data.rows)])
        resid = data.log_peaks - raw
        offsets = conformal_offsets(resid, cf.fold_of_session, level) if level is not None else {}
        growth = fit_growth(workload.sessions, cf.predictions, level)
        meta = {
            "format": CALIBRATED_FORMAT, "workload": workload.name, "kind": kind, "level": level,
            "chosen": model_kind(full), "fold_kinds": [model_kind(m) for m in cf.models],
            "fingerprint": data.fingerprint(folds=folds, seed=seed, kind=kind, level=level),
            "sessions": len(data.rows), "groups": len(set(data.groups)), "folds": len(cf.models),
            "fold_seed": seed, "spearman": _spearman(cf.predictions, data.peaks),
            "fit_seconds": time.perf_counter() - t0,
        }
        return cls(kind, level, full, cf.models, cf.fold_of_group, offsets, growth, meta)

    def _fold(self, task_text: str | None, session_id: str) -> int:
        fold = self.fold_of_group.get(group_key(task_text, session_id))
        return -1 if fold is None else fold

    def log_point(self, task_text: str | None, first_prompt_tokens: int, session_id: str) -> tuple[int, float]:
        """(fold or -1, unfloored log point prediction); memoised per (fold, text, prompt)."""
        f = self._fold(task_text, session_id)
        key = (f, task_text, first_prompt_tokens)
        lp = self._memo.get(key)
        if lp is None:
            model = self.full_model if f == -1 else self.fold_models[f]
            if len(self._memo) >= 100_000:
                self._memo.clear()
            lp = self._memo[key] = float(model.predict([(task_text, first_prompt_tokens)])[0])
        return f, lp

    def growth_coefficients(self) -> dict[str, float]:
        return self.growth.coefficients()

    def save(self, path: str | Path) -> Path:
        # Lazy: joblib takes about 70 ms to import; only this path uses it.
        import joblib

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._memo.clear()
        joblib.dump({"format": CALIBRATED_FORMAT, "predictor": self}, tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> CalibratedPredictor:
        # Lazy: joblib takes about 70 ms to import; only this path uses it.
        import joblib

        path = Path(path)
        try:
            blob = joblib.load(path)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
            raise BasinInputError(f"{where(path, field='model')}: not a saved calibrated predictor ({exc}); "
                                  "delete it to refit") from exc
        if not isinstance(blob, dict) or blob.get("format") != CALIBRATED_FORMAT:
            raise BasinInputError(f"{where(path, field='format')}: expected a calibrated predictor of format "
                                  f"{CALIBRATED_FORMAT}; delete the file to refit")
        return blob["predictor"]

    def __repr__(self) -> str:
        return (f"CalibratedPredictor(workload={self.meta.get('workload')!r}, kind={self.kind!r}, "
                f"level={self.level}, chosen={self.meta.get('chosen')!r})")


def _floor(log_pred: float, first_prompt_tokens: int) -> float:
    return max(math.exp(min(log_pred, 700.0)), float(max(first_prompt_tokens, 1)))


class TabulatedCalibrated(_PointAndReservation):
    """A :class:`CalibratedPredictor`'s answers for its own workload's first
    calls, tabulated: runs then start without scikit-learn, which is loaded
    (with the model file) only for a first call outside the table."""

    name = "calibrated"

    def __init__(self, parts: dict[tuple[int, str | None, int], float], offsets: dict[int, float],
                 fold_of_group: dict[str, int], growth: dict[str, float], meta: dict[str, Any],
                 model_path: Path):
        self.parts = parts
        self.offsets = offsets
        self.fold_of_group = fold_of_group
        self.growth = growth
        self.meta = meta
        self.model_path = model_path
        self._full: CalibratedPredictor | None = None

    @classmethod
    def of(cls, predictor: CalibratedPredictor, sessions: Sequence[Session], model_path: Path) -> TabulatedCalibrated:
        parts: dict[tuple[int, str | None, int], float] = {}
        for s in sessions:
            f, lp = predictor.log_point(s.task_text, s.first_prompt_tokens, s.session_id)
            parts[(f, s.task_text, s.first_prompt_tokens)] = lp
        table = cls(parts, dict(predictor.offsets), predictor.fold_of_group, predictor.growth_coefficients(),
                    predictor.meta, model_path)
        table._full = predictor
        return table

    def _model(self) -> CalibratedPredictor:
        if self._full is None:
            self._full = CalibratedPredictor.load(self.model_path)
        return self._full

    def log_point(self, task_text: str | None, first_prompt_tokens: int, session_id: str) -> tuple[int, float]:
        """From the table; a first call outside it loads the model."""
        fold = self.fold_of_group.get(group_key(task_text, session_id))
        f = -1 if fold is None else fold
        lp = self.parts.get((f, task_text, first_prompt_tokens))
        if lp is None:
            return self._model().log_point(task_text, first_prompt_tokens, session_id)
        return f, lp

    def growth_coefficients(self) -> dict[str, float]:
        return dict(self.growth)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_full"] = None
        return state

    def __repr__(self) -> str:
        m = self.meta
        return (f"TabulatedCalibrated(workload={m.get('workload')!r}, kind={m.get('kind')!r}, "
                f"level={m.get('level')}, entries={len(self.parts)})")


_MEMO: dict[tuple[str, int | None, str, float | None], TabulatedCalibrated] = {}


def calibrated_for_workload(workload_name: str, kind: str = "ridge", level: float | None = None) -> TabulatedCalibrated:
    """The calibrated predictor of a workload spec, tabulated: from this
    process, else the disk caches, else fitted (and saved under the model
    cache, :func:`basin.predict.peak.cache_dir`)."""
    level = check_level(level)
    p = Path(workload_name)
    key = (workload_name, p.stat().st_mtime_ns if p.is_file() else None, kind, level)
    if key in _MEMO:
        return _MEMO[key]
    workload = resolve_workload(workload_name)
    data = TrainingData.from_sessions(workload.sessions)
    fp = data.fingerprint(folds=DEFAULT_FOLDS, seed=DEFAULT_SEED, kind=kind, level=level)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(workload.name).name)[:60] or "workload"
    path = cache_dir() / f"{safe}-{kind}-q{level if level is not None else 'none'}-{fp[:16]}.cal.joblib"
    code = diskcache.source_digest(Path(__file__).parent.glob("*.py"))
    table_key = diskcache.make_key("calibrated-table", path.name, CALIBRATED_FORMAT, code)

    def tabulate() -> TabulatedCalibrated:
        predictor = None
        if path.is_file():
            try:
                predictor = CalibratedPredictor.load(path)
            except BasinInputError:
                predictor = None
            if predictor is not None and predictor.meta.get("fingerprint") != fp:
                predictor = None
        if predictor is None:
            predictor = CalibratedPredictor.fit(workload, kind=kind, level=level)
            try:
                predictor.save(path)
            except OSError as exc:
                warnings.warn(f"could not cache the peak predictor at {path}: {exc}", stacklevel=2)
        return TabulatedCalibrated.of(predictor, workload.sessions, path)

    table = diskcache.cached("predict-tables", table_key, tabulate)
    _MEMO[key] = table
    return table
