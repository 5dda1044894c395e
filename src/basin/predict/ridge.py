"""The peak-context regression: first-call features and a ridge with free length terms.

This module holds the scikit-learn parts of the predictor (it imports
scikit-learn, which takes about a second, so :mod:`basin.predict.peak` loads it
only when a model is fitted or evaluated).

Model (paper section 6.5), for a session with task text ``t`` and first prompt
``p`` tokens::

    log peak = b0 + b1 * log(1 + chars(t)) + b2 * log(1 + p) + x(t) . g

``x(t)`` is the TF-IDF vector of the task text. The text coefficients ``g``
carry a ridge penalty ``alpha * |g|^2``; the intercept ``b0`` and the two
length coefficients ``b1``, ``b2`` carry none.

How the free terms are fitted (exactly, not by scaling). Write the free
columns (intercept and the two log lengths) as ``Z`` and the text columns as
``X``. For any fixed ``g`` the best free coefficients are the least-squares fit
of ``y - X g`` on ``Z``, leaving the residual ``M (y - X g)`` with ``M`` the
projection off the column space of ``Z``. So the penalised problem reduces to
the ridge regression of ``M y`` on ``M X``::

    g = argmin |M y - M X g|^2 + alpha |g|^2
    (b1, b2) = least squares of (y - X g) on the centred lengths
    b0 = mean(y) - mean(Z) (b1, b2) - mean(X) g

(the Frisch-Waugh-Lovell theorem applied to the penalised objective). The
ridge step is solved in its dual form (``n`` sessions are far fewer than
vocabulary terms) through one eigendecomposition of ``(M X)(M X)'``, which
gives the solution for every ``alpha`` of a grid at once. Centring (the
intercept) uses the training sessions' means only. A length column that does
not vary in training (every task text missing) is dropped from ``Z`` by a rank
cut, so its coefficient is zero.

Vocabulary and IDF are fitted on the *distinct* task texts of the training
sessions (reruns of one task do not count twice toward document frequency);
a term must occur in at least ``min_df`` distinct tasks. A session without task
text has an all-zero TF-IDF row and a log task length of 0.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from scipy import sparse
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin, clone
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import Pipeline

#: A first-call observation: (task text or None, first-prompt tokens).
Row = tuple[str | None, int]

#: Number of free (unpenalised) length columns the features put first:
#: column 0 is log(1 + task characters), column PROMPT_COLUMN log(1 + first-prompt tokens).
N_LENGTHS = 2
PROMPT_COLUMN = 1

#: Ridge penalties tried by the inner cross-validation (TF-IDF rows have unit
#: norm, so these span "text dominates" to "lengths alone").
DEFAULT_ALPHAS = tuple(float(a) for a in np.logspace(-2, 3, 11))


#: scikit-learn's default token pattern (words of two or more characters).
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


@functools.lru_cache(maxsize=8192)
def tokens(text: str) -> tuple[str, ...]:
    """Lower-cased word tokens of a text, as TfidfVectorizer's default analyzer makes them.

    Memoised: cross-fitting tokenises the same few hundred texts dozens of
    times, and tokenising dominated the fitting time. A module-level function,
    so fitted vectorizers pickle by reference without the memo.
    """
    return tuple(_TOKEN.findall(text.lower()))


def length_features(rows: Sequence[Row], prompt_length: bool = True) -> np.ndarray:
    """The free columns: log(1 + task characters), then log(1 + first-prompt tokens).

    ``prompt_length=False`` leaves out the second: in the shipped workloads the
    first prompt is nearly a copy of the text length (docs/predictor.md), and
    two free collinear lengths fit curvature rather than signal.
    """
    out = np.empty((len(rows), n_lengths(prompt_length)), dtype=float)
    for i, (text, prompt) in enumerate(rows):
        out[i, 0] = np.log1p(len(text)) if text else 0.0
        if prompt_length:
            out[i, PROMPT_COLUMN] = np.log1p(prompt)
    return out


def n_lengths(prompt_length: bool = True) -> int:
    """How many free length columns the features put first."""
    return N_LENGTHS if prompt_length else 1


class PeakFeatures(BaseEstimator, TransformerMixin):
    """Rows -> sparse ``[log task chars, log first prompt, TF-IDF terms...]``.

    The TF-IDF vocabulary and IDF weights are learnt in :meth:`fit` from the
    distinct non-empty texts it is given; with fewer than ``min_df`` distinct
    texts (or none) the text block is empty and only the lengths remain.
    ``use_text=False`` drops the text block (the lengths-only ablation);
    ``prompt_length=False`` drops the first-prompt column (:func:`length_features`).
    """

    def __init__(self, min_df: int = 2, max_df: float = 0.9, sublinear_tf: bool = True,
                 use_text: bool = True, prompt_length: bool = True):
        self.min_df = min_df
        self.max_df = max_df
        self.sublinear_tf = sublinear_tf
        self.use_text = use_text
        self.prompt_length = prompt_length

    def fit(self, rows: Sequence[Row], y: object = None) -> PeakFeatures:
        self._fit(rows)
        return self

    def fit_transform(self, rows: Sequence[Row], y: object = None) -> sparse.csr_matrix:
        # One counting pass over the training texts instead of two (fit, then transform).
        return self._stack(rows, self._fit(rows))

    def transform(self, rows: Sequence[Row]) -> sparse.csr_matrix:
        if self.vectorizer_ is None:
            return self._stack(rows, None)
        distinct = list(dict.fromkeys(t or "" for t, _ in rows))
        return self._stack(rows, (distinct, self.vectorizer_.transform(distinct)))

    def _fit(self, rows: Sequence[Row]) -> tuple[list[str], sparse.csr_matrix] | None:
        """Fit vocabulary and IDF; returns (distinct texts, their TF-IDF rows) or None."""
        distinct = sorted({t for t, _ in rows if t})
        self.vectorizer_: TfidfVectorizer | None = None
        self.n_terms_ = 0
        if not self.use_text or len(distinct) < max(self.min_df, 2):
            return None
        vec = TfidfVectorizer(analyzer=tokens, min_df=self.min_df, max_df=self.max_df,
                              sublinear_tf=self.sublinear_tf, dtype=np.float64)
        try:
            matrix = vec.fit_transform(distinct)
        except ValueError:  # no term survives min_df/max_df
            return None
        self.vectorizer_ = vec
        self.n_terms_ = len(vec.vocabulary_)
        # A session without text is an all-zero row.
        return distinct + [""], sparse.vstack([matrix, sparse.csr_matrix((1, matrix.shape[1]))], format="csr")

    def _stack(self, rows: Sequence[Row], text_block: tuple[list[str], sparse.csr_matrix] | None) -> sparse.csr_matrix:
        """Lengths, then each row's TF-IDF row (reruns share a text: vectorised once, indexed)."""
        lengths = sparse.csr_matrix(length_features(rows, self.prompt_length))
        if text_block is None:
            return lengths
        distinct, matrix = text_block
        position = {t: i for i, t in enumerate(distinct)}
        return sparse.hstack([lengths, matrix[[position[t or ""] for t, _ in rows]]], format="csr")


class FreeLengthRidge(BaseEstimator, RegressorMixin):
    """Ridge on all but the first ``n_free`` columns; those and the intercept are unpenalised.

    Fitted exactly by partialling the free columns out (module docstring).
    """

    def __init__(self, alpha: float = 1.0, n_free: int = N_LENGTHS):
        self.alpha = alpha
        self.n_free = n_free

    def fit(self, features: object, y: Sequence[float]) -> FreeLengthRidge:
        self._solve(features, y, (float(self.alpha),))
        self.intercept_, self.coef_free_, self.coef_text_ = self._path[0]
        del self._path
        return self

    def predict(self, features: object) -> np.ndarray:
        return _linear(features, self.n_free, self.intercept_, self.coef_free_, self.coef_text_)

    def path_predict(self, features: object, y: Sequence[float], held_out: object,
                     alphas: Sequence[float]) -> np.ndarray:
        """Predictions for ``held_out`` of a fit on (features, y) at every alpha: (alphas, rows)."""
        self._solve(features, y, tuple(float(a) for a in alphas))
        out = np.array([_linear(held_out, self.n_free, b0, bf, bt) for b0, bf, bt in self._path])
        del self._path
        return out

    def _solve(self, features: object, y: Sequence[float], alphas: tuple[float, ...]) -> None:
        # Works on the n x n kernel of the text block (n sessions << terms), built
        # from the sparse product X X', so no dense n x terms matrix is formed.
        m = cast(Any, features).tocsr() if sparse.issparse(features) else np.asarray(features, dtype=float)
        yv = np.asarray(y, dtype=float)
        n = len(yv)
        z, x = _dense(m[:, :self.n_free]), m[:, self.n_free:]
        z_mean, y_mean = z.mean(axis=0), yv.mean()
        zc, yc = z - z_mean, yv - y_mean
        # Orthonormal basis U of the centred free columns (a rank cut drops constant ones).
        u, s, _ = np.linalg.svd(zc, full_matrices=False)
        tol = s.max(initial=0.0) * max(zc.shape) * np.finfo(float).eps
        u = u[:, s > max(tol, 1e-12)]
        yr = yc - u @ (u.T @ yc)  # M y
        n_text = x.shape[1]
        if n_text:
            k0 = _dense(x @ x.T)  # X X'
            k0_mean_rows = k0.mean(axis=0)
            kc = k0 - k0_mean_rows[None, :] - k0.mean(axis=1)[:, None] + k0.mean()  # Xc Xc' (centred)
            ku = kc @ u
            kr = kc - u @ ku.T - ku @ u.T + u @ (u.T @ ku) @ u.T  # (M Xc)(M Xc)'
            evals, evecs = np.linalg.eigh((kr + kr.T) / 2)
            evals = np.clip(evals, 0.0, None)
            proj = evecs.T @ yr
        path = []
        for alpha in alphas:
            if alpha < 0:
                raise ValueError(f"alpha must be >= 0, got {alpha}")
            if n_text:
                with np.errstate(divide="ignore", invalid="ignore"):
                    scale = np.where(evals + alpha > 1e-12, 1.0 / (evals + alpha), 0.0)
                v = evecs @ (scale * proj)  # dual coefficients: g = (M Xc)' v = Xc' M v
                w = v - u @ (u.T @ v)
                cw = w - w.mean()  # g = X' C M v
                g = np.asarray(x.T @ cw).ravel()
                xc_g = kc @ w  # Xc g
                xmean_g = k0_mean_rows @ cw  # mean(X) g
            else:
                g, xc_g, xmean_g = np.zeros(0), np.zeros(n), 0.0
            b, *_ = np.linalg.lstsq(zc, yc - xc_g, rcond=None) if self.n_free else (np.zeros(0),)
            b0 = y_mean - z_mean @ b - xmean_g
            path.append((float(b0), b, g))
        self._path = path


def _linear(features: object, n_free: int, b0: float, coef_free: np.ndarray, coef_text: np.ndarray) -> np.ndarray:
    m = cast(Any, features).tocsr() if sparse.issparse(features) else np.asarray(features, dtype=float)
    free = _dense(m[:, :n_free]) @ coef_free
    text = np.asarray(m[:, n_free:] @ coef_text).ravel() if len(coef_text) else 0.0
    return b0 + free + text


def _dense(features: object) -> np.ndarray:
    if sparse.issparse(features):
        return cast(Any, features).toarray()
    return np.asarray(features, dtype=float)


def make_pipeline(alpha: float = 1.0, use_text: bool = True, prompt_length: bool = True) -> Pipeline:
    """The unfitted model: features then the free-length ridge (as many free columns as lengths)."""
    return Pipeline([("features", PeakFeatures(use_text=use_text, prompt_length=prompt_length)),
                     ("ridge", FreeLengthRidge(alpha=alpha, n_free=n_lengths(prompt_length)))])


def group_splits(groups: Sequence[str], n_folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index pairs with whole groups per fold, ``min(n_folds, groups)`` of them.

    Groups are shuffled with ``seed`` and dealt round-robin (first-appearance
    order before shuffling), so the split is a pure function of the group
    labels, the fold count and the seed.
    """
    labels = list(dict.fromkeys(groups))
    k = min(n_folds, len(labels))
    order = np.random.default_rng(seed).permutation(len(labels))
    fold_of = {labels[j]: pos % k for pos, j in enumerate(order)}
    assign = np.array([fold_of[g] for g in groups])
    idx = np.arange(len(groups))
    return [(idx[assign != f], idx[assign == f]) for f in range(k)]


def fit_model(rows: Sequence[Row], y: Sequence[float] | np.ndarray, groups: Sequence[str], *,
              alphas: Sequence[float] = DEFAULT_ALPHAS, inner_folds: int = 5, seed: int = 0,
              use_text: bool = True, prompt_length: bool = True) -> Pipeline:
    """Fit the pipeline, choosing alpha by grouped inner cross-validation.

    Every inner fold refits the features (vocabulary, IDF) on its own training
    part, so the choice of alpha sees no held-out text either. The alpha with
    the least mean squared log error wins (ties: the larger alpha). With fewer
    than two groups, a single alpha, or no text block, the grid's median alpha
    is used without search (it does not matter without text columns).
    ``prompt_length=False`` fits the one-length variant (``ridge-text``); it
    keeps the first prompt when no training session has a text, since the
    prompt is then the only signal and collinear with nothing.
    """
    rows = list(rows)
    yv = np.asarray(y, dtype=float)
    has_text = len({t for t, _ in rows if t}) >= 2
    base = make_pipeline(use_text=use_text, prompt_length=prompt_length or not any(t for t, _ in rows))
    alphas = tuple(float(a) for a in alphas)
    alpha = float(np.median(alphas))
    if len(set(groups)) >= 2 and len(alphas) > 1 and use_text and has_text:
        sse = np.zeros(len(alphas))
        for train, test in group_splits(groups, inner_folds, seed + 1):
            feats = clone(base.named_steps["features"])
            train_x = feats.fit_transform([rows[i] for i in train])
            pred = clone(base.named_steps["ridge"]).path_predict(
                train_x, yv[train], feats.transform([rows[i] for i in test]), alphas)
            sse += ((pred - yv[test]) ** 2).sum(axis=1)
        best = sse.min()
        alpha = max(a for a, e in zip(alphas, sse) if e <= best * (1 + 1e-12))
    model = base.set_params(ridge__alpha=alpha)
    model.fit(rows, yv)
    return model
