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
* ``gbt``: gradient-boosted trees (``HistGradientBoostingRegressor``) on the
  structure features, shallow and strongly regularised because a workload
  has a few hundred sessions;
* ``quantile``: linear median regression (``QuantileRegressor``, quantile
  0.5) on the standardised structure features, robust to the heavy tail of
  peaks;
* ``auto``: the one of the three with the best task-grouped inner
  cross-validation, chosen inside each training set (so the choice never sees
  a held-out task).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import QuantileRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from basin.predict.ridge import Row, fit_model, group_splits

KINDS = ("ridge", "gbt", "quantile", "auto")

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
    if kind == "ridge":
        return fit_model(rows, y, groups, seed=seed, use_text=use_text)
    model = make_model(kind, seed)
    model.fit(rows, y)
    return model


def fit_kind(kind: str, rows: Sequence[Row], y: Sequence[float] | np.ndarray, groups: Sequence[str], *,
             seed: int = 0, use_text: bool = True, inner_folds: int = 5) -> Any:
    """A fitted model of ``kind``; ``auto`` chooses by grouped inner cross-validation.

    ``auto`` scores each candidate by the Spearman correlation of its pooled
    inner out-of-fold predictions with the peaks (ranking is what BASIN's
    priority uses), ties broken by the smaller squared log error, then by the
    order of :data:`KINDS`. The chosen kind is kept as ``model.peak_kind_``.
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
    candidates = ("ridge", "gbt", "quantile")
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
