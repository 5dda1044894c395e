"""First-call structure features and the model family the calibrated predictors choose from.

Imports scikit-learn (about a second), so :mod:`basin.predict.peak` loads it
only when a model is fitted or evaluated.

**Features** (:func:`structure_features`): what the first call shows besides
the words of the task text. A session record carries its task text and its
first prompt's size, nothing of the prompt's parts, so the parts are read off
those two: the task text's size in characters and lines, the prompt tokens
the text does not account for (system prompt, tool definitions and template:
``prompt - chars / 4``, four characters a token), and what the text points
at (file names, paths, code blocks, tracebacks, links, dotted module names,
numbered steps). Every count enters as ``log(1 + count)``; a session without
text has zeros and a ``has_text`` flag of 0.

**Models** (:data:`KINDS`), each predicting log peak:

* ``ridge``: the paper's TF-IDF ridge with free length terms
  (:mod:`basin.predict.ridge`), unchanged;
* ``ridge-text``: the same ridge with the task length as its only free
  length (the first prompt, nearly collinear with it, left out);
* ``knn``: a free fit on the task length plus the mean residual of the most
  similar *training tasks* (cosine over TF-IDF, reruns averaged into one
  point per task), the number of neighbours, their weighting and whether the
  length term is kept chosen by grouped inner cross-validation: a local
  alternative to the ridge's global text coefficients;
* ``gbt``: gradient-boosted trees (``HistGradientBoostingRegressor``) on the
  structure features, shallow and strongly regularised because a workload
  has a few hundred sessions;
* ``quantile``: linear median regression (``QuantileRegressor``, quantile
  0.5) on the standardised structure features, robust to the heavy tail of
  peaks;
* ``auto``: the one of the others with the best task-grouped inner
  cross-validation, chosen inside each training set (so the choice never sees
  a held-out task).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import QuantileRegressor
from sklearn.neighbors import NearestNeighbors
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from basin.predict.ridge import PeakFeatures, Row, fit_model, group_splits, length_features

#: The candidates ``auto`` chooses among, in tie-breaking order, then ``auto``.
CANDIDATES = ("ridge", "ridge-text", "knn", "gbt", "quantile")
KINDS = (*CANDIDATES, "auto")

#: The neighbour counts and weightings the ``knn`` inner cross-validation tries.
NEIGHBOUR_COUNTS = (5, 10, 20, 40)
NEIGHBOUR_WEIGHTS = ("uniform", "distance")

#: Characters per token assumed when the text's share of the first prompt is estimated.
CHARS_PER_TOKEN = 4.0

_FILE = re.compile(r"[\w./-]*\w\.(?:py|pyx|pyi|js|ts|tsx|c|cc|cpp|h|hpp|rs|go|java|rb|php|json|ya?ml|toml|"
                   r"cfg|ini|txt|md|rst|html|css|sh|sql|csv|ipynb)\b")
_PATH = re.compile(r"\b\w[\w.-]*(?:/[\w.-]+)+")
_FENCE = re.compile(r"```")
_URL = re.compile(r"https?://")
_DOTTED = re.compile(r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*){2,}")
_STEP = re.compile(r"(?m)^\s*(?:\d+[.)]|[-*])\s+")

FEATURE_NAMES = ("has_text", "log_chars", "log_lines", "log_prompt", "log_prompt_beyond_text", "log_files",
                 "log_distinct_files", "log_paths", "log_code_blocks", "traceback", "log_urls", "log_dotted",
                 "log_steps")


def structure_features(rows: Sequence[Row]) -> np.ndarray:
    """One row of :data:`FEATURE_NAMES` per (task text, first-prompt tokens)."""
    out = np.zeros((len(rows), len(FEATURE_NAMES)))
    for i, (text, prompt) in enumerate(rows):
        t = text or ""
        files = _FILE.findall(t)
        out[i] = (
            1.0 if t else 0.0,
            np.log1p(len(t)),
            np.log1p(t.count("\n")),
            np.log1p(prompt),
            np.log1p(max(prompt - len(t) / CHARS_PER_TOKEN, 0.0)),
            np.log1p(len(files)),
            np.log1p(len(set(files))),
            np.log1p(len(_PATH.findall(t))),
            np.log1p(len(_FENCE.findall(t)) // 2),
            1.0 if "Traceback" in t else 0.0,
            np.log1p(len(_URL.findall(t))),
            np.log1p(len(_DOTTED.findall(t))),
            np.log1p(len(_STEP.findall(t))),
        )
    return out


class StructureFeatures(BaseEstimator, TransformerMixin):
    """Rows -> :func:`structure_features` (nothing learnt)."""

    def fit(self, rows: Sequence[Row], y: object = None) -> StructureFeatures:
        return self

    def transform(self, rows: Sequence[Row]) -> np.ndarray:
        return structure_features(rows)


class TaskNeighbours(BaseEstimator, RegressorMixin):
    """log peak = a + b log(1 + task chars) + the mean residual of the ``n_neighbors``
    training tasks whose texts are nearest (cosine distance of TF-IDF rows).

    Each distinct training text is one point carrying its reruns' mean
    residual, so a task rerun five times does not fill the neighbourhood.
    Vocabulary and IDF come from the training texts (:class:`PeakFeatures`),
    so a term of a held-out task alone has no column. A session without text,
    or whose text has no known term, gets the length fit alone.
    ``weights="distance"`` weighs neighbours by ``1 / distance``;
    ``task_length=False`` replaces the length fit by the mean; ``use_text=False``
    keeps the length fit alone (the lengths-only ablation). Without any
    training text the length fitted is the first prompt's, the one signal left.
    """

    def __init__(self, n_neighbors: int = 10, weights: str = "uniform", task_length: bool = True,
                 use_text: bool = True):
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.task_length = task_length
        self.use_text = use_text

    def fit(self, rows: Sequence[Row], y: Sequence[float] | np.ndarray) -> TaskNeighbours:
        rows = list(rows)
        yv = np.asarray(y, dtype=float)
        self.prompt_length_ = not any(t for t, _ in rows)
        lengths = self._lengths(rows)
        self.coef_ = np.linalg.lstsq(lengths, yv, rcond=None)[0]
        resid = yv - lengths @ self.coef_
        self.features_ = PeakFeatures(prompt_length=False, use_text=self.use_text).fit(rows)
        self.index_: NearestNeighbors | None = None
        self.task_residuals_ = np.zeros(0)
        vec = self.features_.vectorizer_
        if vec is None:
            return self
        by_text: dict[str, list[float]] = {}
        for (text, _), r in zip(rows, resid):
            if text:
                by_text.setdefault(text, []).append(float(r))
        texts = sorted(by_text)
        matrix = vec.transform(texts)
        known = np.asarray(matrix.getnnz(axis=1)) > 0
        if known.sum() < 2:
            return self
        self.task_residuals_ = np.array([np.mean(by_text[t]) for t, k in zip(texts, known) if k])
        self.index_ = NearestNeighbors(metric="cosine", algorithm="brute").fit(matrix[known])
        return self

    def predict(self, rows: Sequence[Row]) -> np.ndarray:
        base, dist, resid = self.neighbourhoods(rows, self.n_neighbors)
        return base + neighbour_mean(dist, resid, self.n_neighbors, self.weights)

    def neighbourhoods(self, rows: Sequence[Row], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(length fit, distances, residuals) of each row's ``k`` nearest training tasks,
        nearest first; rows without known terms get infinite distances (no neighbours)."""
        rows = list(rows)
        base = self._lengths(rows) @ self.coef_
        k = min(k, len(self.task_residuals_))
        dist = np.full((len(rows), k), np.inf)
        resid = np.zeros((len(rows), k))
        vec = self.features_.vectorizer_
        if self.index_ is None or vec is None or not k:
            return base, dist, resid
        matrix = vec.transform([t or "" for t, _ in rows])
        known = np.flatnonzero(np.asarray(matrix.getnnz(axis=1)) > 0)
        if len(known):
            d, idx = self.index_.kneighbors(matrix[known], n_neighbors=k)
            dist[known], resid[known] = np.maximum(d, 0.0), self.task_residuals_[idx]
        return base, dist, resid

    def _lengths(self, rows: Sequence[Row]) -> np.ndarray:
        ones = np.ones((len(rows), 1))
        if not self.task_length:
            return ones
        lengths = length_features(rows, prompt_length=self.prompt_length_)
        return np.hstack([ones, lengths[:, -1:] if self.prompt_length_ else lengths])


def neighbour_mean(dist: np.ndarray, resid: np.ndarray, k: int, weights: str) -> np.ndarray:
    """The (weighted) mean residual of each row's first ``k`` neighbours; 0 without any.

    ``distance`` weights are ``1 / distance``; a row with neighbours at
    distance 0 (the same terms) averages those alone.
    """
    d, r = dist[:, :k], resid[:, :k]
    if weights == "uniform":
        w = np.isfinite(d).astype(float)
    elif weights == "distance":
        with np.errstate(divide="ignore"):
            w = np.where(np.isfinite(d), 1.0 / d, 0.0)
        exact = (d == 0).any(axis=1)
        w[exact] = (d[exact] == 0).astype(float)
    else:
        raise ValueError(f"unknown neighbour weighting {weights!r}")
    total = w.sum(axis=1)
    return np.divide((w * r).sum(axis=1), total, out=np.zeros(len(d)), where=total > 0)


def fit_neighbours(rows: Sequence[Row], y: Sequence[float] | np.ndarray, groups: Sequence[str], *,
                   seed: int = 0, inner_folds: int = 5) -> TaskNeighbours:
    """A :class:`TaskNeighbours` with its settings chosen by grouped inner cross-validation.

    Every inner fold refits vocabulary, length fit and task residuals on its
    training part; the least mean squared log error wins, ties going to the
    length term, then to more neighbours (smoother) and uniform weights.
    """
    rows = list(rows)
    yv = np.asarray(y, dtype=float)
    grid = [(tl, k, w) for tl in (True, False) for k in sorted(NEIGHBOUR_COUNTS, reverse=True)
            for w in NEIGHBOUR_WEIGHTS]
    best = grid[0]
    if len(set(groups)) >= 2:
        sse = dict.fromkeys(grid, 0.0)
        for train, test in group_splits(groups, inner_folds, seed + 3):
            held_out = [rows[i] for i in test]
            for tl in (True, False):
                m = TaskNeighbours(task_length=tl).fit([rows[i] for i in train], yv[train])
                base, dist, resid = m.neighbourhoods(held_out, max(NEIGHBOUR_COUNTS))
                for k in NEIGHBOUR_COUNTS:
                    for w in NEIGHBOUR_WEIGHTS:
                        pred = base + neighbour_mean(dist, resid, k, w)
                        sse[(tl, k, w)] += float(((pred - yv[test]) ** 2).sum())
        least = min(sse.values())
        best = next(c for c in grid if sse[c] <= least * (1 + 1e-12))
    task_length, k, weights = best
    return TaskNeighbours(n_neighbors=k, weights=weights, task_length=task_length).fit(rows, yv)


def make_model(kind: str, seed: int = 0) -> Pipeline:
    """An unfitted pipeline of ``kind`` (``gbt`` or ``quantile``)."""
    if kind == "gbt":
        return Pipeline([("features", StructureFeatures()),
                         ("model", HistGradientBoostingRegressor(
                             max_iter=60, learning_rate=0.1, max_leaf_nodes=6, min_samples_leaf=12,
                             l2_regularization=1.0, early_stopping=False, random_state=seed))])
    if kind == "quantile":
        return Pipeline([("features", StructureFeatures()), ("scale", StandardScaler()),
                         ("model", QuantileRegressor(quantile=0.5, alpha=0.01, solver="highs"))])
    raise ValueError(f"unknown model kind {kind!r}")


def _fit_one(kind: str, rows: list[Row], y: np.ndarray, groups: Sequence[str], seed: int,
             use_text: bool) -> Any:
    if kind in ("ridge", "ridge-text"):
        return fit_model(rows, y, groups, seed=seed, use_text=use_text, prompt_length=kind == "ridge")
    if kind == "knn":
        if not use_text:
            return TaskNeighbours(use_text=False).fit(rows, y)
        return fit_neighbours(rows, y, groups, seed=seed)
    model = make_model(kind, seed)
    model.fit(rows, y)
    return model


def fit_kind(kind: str, rows: Sequence[Row], y: Sequence[float] | np.ndarray, groups: Sequence[str], *,
             seed: int = 0, use_text: bool = True, inner_folds: int = 5) -> Any:
    """A fitted model of ``kind``; ``auto`` chooses by grouped inner cross-validation.

    ``auto`` scores each candidate by the Spearman correlation of its pooled
    inner out-of-fold predictions with the peaks (ranking is what BASIN's
    priority uses), ties broken by the smaller squared log error, then by the
    order of :data:`CANDIDATES`. The chosen kind is kept as ``model.peak_kind_``.
    """
    rows = list(rows)
    yv = np.asarray(y, dtype=float)
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}")
    chosen = kind
    if kind == "auto":
        chosen = choose_kind(rows, yv, groups, seed=seed, use_text=use_text, inner_folds=inner_folds)
    model = _fit_one(chosen, rows, yv, groups, seed, use_text)
    model.peak_kind_ = chosen
    return model


def choose_kind(rows: list[Row], y: np.ndarray, groups: Sequence[str], *, seed: int = 0, use_text: bool = True,
                inner_folds: int = 5) -> str:
    """The candidate with the best grouped inner cross-validation (see :func:`fit_kind`)."""
    candidates = CANDIDATES
    if len(set(groups)) < 2:
        return "ridge"
    scores = []
    splits = group_splits(groups, inner_folds, seed + 7)
    for kind in candidates:
        pred = np.empty(len(y))
        for train, test in splits:
            m = _fit_one(kind, [rows[i] for i in train], y[train], [groups[i] for i in train], seed, use_text)
            pred[test] = m.predict([rows[i] for i in test])
        rho = float(spearmanr(pred, y)[0]) if np.ptp(pred) > 0 else -1.0
        scores.append((-(rho if np.isfinite(rho) else -1.0), float(np.mean((pred - y) ** 2))))
    return candidates[min(range(len(candidates)), key=lambda k: scores[k])]


def model_kind(model: Any) -> str:
    """The kind of a fitted model (``ridge`` for the plain ridge pipeline)."""
    return str(getattr(model, "peak_kind_", "ridge"))
