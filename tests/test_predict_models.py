"""The candidate kinds of the model family: ``ridge-text`` and ``knn``, their leakage, ``auto``'s choice, names."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.predict import calibrated, peak
from basin.predict.calibrated import CalibratedPredictor
from basin.predict.models import CANDIDATES, KINDS, TaskNeighbours, fit_kind, neighbour_mean
from basin.predict.peak import evaluate, make_predictor
from basin.predict.ridge import fit_model
from basin.workload.records import Workload
from predict_helpers import toy_workload

NEW_KINDS = ("ridge-text", "knn")


def _workload(n_tasks: int = 30, reruns: int = 2, seed: int = 0, magic: bool = False,
              with_text: bool = True, calls: int = 1) -> Workload:
    """The toy workload (tests/predict_helpers.py), first prompts jittered."""
    return toy_workload(n_tasks, reruns, seed, magic, with_text, prompt_jitter=50, calls=calls)


def _arrays(w: Workload) -> tuple[list[tuple[str | None, int]], np.ndarray, list[str]]:
    rows = [(s.task_text, s.first_prompt_tokens) for s in w.sessions]
    y = np.log([s.peak_context_tokens for s in w.sessions])
    return rows, y, [s.task_text or s.session_id for s in w.sessions]


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_a_new_kind_fits_and_predicts_finite_log_peaks(kind: str) -> None:
    rows, y, groups = _arrays(_workload())
    model = fit_kind(kind, rows, y, groups, seed=0)
    pred = model.predict(rows + [("an unseen task", 900), (None, 900)])
    assert np.isfinite(pred).all() and model.peak_kind_ == kind


def test_ridge_text_frees_the_task_length_alone() -> None:
    rows, y, groups = _arrays(_workload())
    model = fit_kind("ridge-text", rows, y, groups)
    assert model.named_steps["ridge"].n_free == 1 and len(model.named_steps["ridge"].coef_free_) == 1
    assert not model.named_steps["features"].prompt_length
    prompt_moved = [(t, p * 3) for t, p in rows]
    np.testing.assert_allclose(model.predict(prompt_moved), model.predict(rows))


def test_ridge_text_without_texts_is_the_ridge() -> None:
    rows, y, groups = _arrays(_workload(with_text=False))
    a = fit_kind("ridge-text", rows, y, groups).predict(rows)
    np.testing.assert_allclose(a, fit_model(rows, y, groups).predict(rows))


def test_neighbour_mean_weights() -> None:
    dist = np.array([[0.2, 0.4, np.inf], [0.0, 0.5, 0.9], [np.inf, np.inf, np.inf]])
    resid = np.array([[1.0, 4.0, 100.0], [2.0, 8.0, 8.0], [5.0, 5.0, 5.0]])
    np.testing.assert_allclose(neighbour_mean(dist, resid, 3, "uniform"), [2.5, 6.0, 0.0])
    np.testing.assert_allclose(neighbour_mean(dist, resid, 3, "distance"), [(5 + 10) / 7.5, 2.0, 0.0])
    np.testing.assert_allclose(neighbour_mean(dist, resid, 1, "uniform"), [1.0, 2.0, 0.0])
    with pytest.raises(ValueError, match="weighting"):
        neighbour_mean(dist, resid, 3, "inverse")


def test_neighbours_are_tasks_and_unknown_texts_get_the_length_fit() -> None:
    rows, y, _ = _arrays(_workload(n_tasks=20, reruns=3))
    model = TaskNeighbours(n_neighbors=5).fit(rows, y)
    assert len(model.task_residuals_) == 20  # reruns averaged into one point per task
    base = model._lengths([("qqq zzz", 900)]) @ model.coef_
    np.testing.assert_allclose(model.predict([("qqq zzz", 900)]), base)  # no known term: no neighbours
    np.testing.assert_allclose(model.predict([(None, 900)]), model.coef_[0])


def test_knn_learns_the_words_out_of_sample() -> None:
    ev = evaluate(_workload(n_tasks=80, reruns=1, seed=5), folds=5, model="knn")
    assert ev.spearman > 0.3


@pytest.mark.parametrize("kind", [*NEW_KINDS, "auto"])
def test_a_token_unique_to_one_task_cannot_help_predict_it(kind: str) -> None:
    w = _workload(n_tasks=24, magic=True)
    renamed = replace(w, sessions=tuple(
        replace(s, task_text=(s.task_text or "").replace(" zq", " zr")) for s in w.sessions))
    a = evaluate(w, folds=6, model=kind)
    b = evaluate(renamed, folds=6, model=kind)
    np.testing.assert_array_equal(a.predictions, b.predictions)


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_a_tasks_own_peaks_do_not_move_its_prediction(kind: str) -> None:
    w = _workload(n_tasks=20)
    target = w.sessions[6].task_text
    bumped = replace(w, sessions=tuple(
        replace(s, calls=(replace(s.calls[0], output_tokens=s.calls[0].output_tokens * 50),))
        if s.task_text == target else s for s in w.sessions))
    reruns = [i for i, s in enumerate(w.sessions) if s.task_text == target]
    assert len(reruns) == 2
    np.testing.assert_array_equal(evaluate(bumped, folds=5, model=kind).predictions[reruns],
                                  evaluate(w, folds=5, model=kind).predictions[reruns])


def test_auto_chooses_among_every_candidate() -> None:
    rows, y, groups = _arrays(_workload())
    assert fit_kind("auto", rows, y, groups).peak_kind_ in CANDIDATES
    assert set(CANDIDATES) >= {"ridge", "ridge-text", "knn", "gbt", "quantile"}


def test_the_kind_lists_agree() -> None:
    from basin.cli.predict import Model

    assert calibrated.KINDS == KINDS == peak.CALIBRATED_KINDS
    assert tuple(m.value for m in Model) == KINDS


def test_bad_kind_names_raise_basin_input_errors() -> None:
    w = _workload(n_tasks=6)
    with pytest.raises(BasinInputError, match="model"):
        evaluate(w, folds=3, model="knn-text")
    with pytest.raises(BasinInputError, match="model"):
        CalibratedPredictor.fit(w, kind="Ridge-Text", folds=3)
    with pytest.raises(BasinInputError, match="predictor"):
        make_predictor("knn:k=5", "toy")
    with pytest.raises(BasinInputError, match="predictor"):
        make_predictor("ridgetext", "toy")


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_calibrated_new_kinds_reserve_above_their_points(kind: str) -> None:
    w = _workload(calls=3)
    cal = CalibratedPredictor.fit(w, kind=kind, level=0.8, folds=5)
    assert cal.meta["chosen"] == kind
    for s in w.sessions[:10]:
        args = (s.task_text, s.first_prompt_tokens, s.session_id)
        assert cal.reserve_peak_tokens(*args) >= cal.predict_peak_tokens(*args) * 0.999 > 0
