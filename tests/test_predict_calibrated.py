"""Calibrated predictors: the model family, split-conformal reservations, the growth fit, specs, tables."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.predict.calibrated import (
    CalibratedPredictor,
    TabulatedCalibrated,
    conformal_offsets,
    conformal_quantile,
    reservation_figures,
)
from basin.predict.growth import fit_growth
from basin.predict.models import CANDIDATES, FEATURE_NAMES, fit_kind, structure_features
from basin.predict.peak import RidgePeakPredictor, evaluate, make_predictor
from basin.workload.records import Call, Session, Workload

WORDS = "alpha beta gamma delta parser django numpy server cache index query build crash docs".split()


def _workload(n_tasks: int = 30, reruns: int = 2, seed: int = 0) -> Workload:
    """Three-call sessions whose log peak depends on a word, the text length and noise."""
    rng = np.random.default_rng(seed)
    sessions = []
    for t in range(n_tasks):
        words = list(rng.choice(WORDS, size=int(rng.integers(6, 30))))
        text = " ".join(words) + f"\nsee src/mod{t % 4}.py"
        for r in range(reruns):
            first = 400 + 3 * len(text)
            peak = int(first + 3000 * math.exp(0.8 * ("django" in words) + 0.03 * len(words)
                                               + 0.3 * rng.standard_normal()))
            mid = first + (peak - first) // 2
            calls = (Call(first, first, 10), Call(mid, mid - first - 10, 10), Call(peak - 10, peak - mid - 20, 10))
            sessions.append(Session(f"s{t:02d}-{r}", calls, task_text=text))
    return Workload("toy", tuple(sessions))


def test_conformal_quantile_takes_the_n_plus_one_rank():
    values = np.arange(1.0, 10.0)  # 9 residuals
    assert conformal_quantile(values, 0.9) == 9.0  # ceil(10 * 0.9) = 9
    assert conformal_quantile(values, 0.5) == 5.0
    assert conformal_quantile(values, 0.99) == 9.0  # past n: the largest


def test_a_folds_offset_ignores_its_own_residuals():
    resid = np.arange(20.0)
    folds = np.repeat([0, 1], 10)
    before = conformal_offsets(resid, folds, 0.8)
    changed = resid.copy()
    changed[:10] += 100.0  # fold 0's own residuals
    after = conformal_offsets(changed, folds, 0.8)
    assert after[0] == before[0] and after[1] != before[1]


def test_reservation_figures():
    fig = reservation_figures(np.array([2.0, 1.0]), np.array([1.0, 2.0]))
    assert fig == {"coverage": 0.5, "over_reservation_mean": 0.5, "under_reservation_mean": 0.25,
                   "reserved_over_peak": 1.0}


def test_structure_features_read_the_first_call():
    x = structure_features([("Traceback\n see a/b.py and a/b.py ```x```", 1000), (None, 50)])
    names = dict(zip(FEATURE_NAMES, x[0]))
    assert names["has_text"] == 1 and names["traceback"] == 1
    assert names["log_files"] == pytest.approx(math.log(3))
    assert names["log_distinct_files"] == pytest.approx(math.log(2))
    assert names["log_code_blocks"] == pytest.approx(math.log(2))
    assert x[1][0] == 0 and x[1][FEATURE_NAMES.index("log_prompt")] == pytest.approx(math.log(51))


@pytest.mark.parametrize("kind", ["gbt", "quantile", "auto"])
def test_every_model_kind_fits_and_predicts(kind: str):
    w = _workload()
    rows = [(s.task_text, s.first_prompt_tokens) for s in w.sessions]
    y = np.log([s.peak_context_tokens for s in w.sessions])
    groups = [s.task_text or "" for s in w.sessions]
    model = fit_kind(kind, rows, y, groups, seed=0)
    assert np.isfinite(model.predict(rows)).all()
    assert model.peak_kind_ in CANDIDATES


def test_calibrated_ridge_points_equal_the_ridge_predictor():
    w = _workload()
    cal = CalibratedPredictor.fit(w, kind="ridge", level=0.8, folds=5)
    ridge = RidgePeakPredictor.fit(w, folds=5)
    for s in w.sessions:
        a = cal.predict_peak_tokens(s.task_text, s.first_prompt_tokens, s.session_id)
        b = ridge.predict_peak_tokens(s.task_text, s.first_prompt_tokens, s.session_id)
        assert a == pytest.approx(b, rel=1e-9)
        assert cal.reserve_peak_tokens(s.task_text, s.first_prompt_tokens, s.session_id) >= a * 0.999


def test_conformal_reservation_covers_about_its_level():
    ev = evaluate(_workload(n_tasks=60), folds=10, level=0.8)
    assert ev.reservation is not None and 0.7 <= ev.reservation["coverage"] <= 0.95
    assert ev.point["coverage"] < ev.reservation["coverage"]
    assert str(ev.to_dict()["protocol"]).startswith("task-grouped")


def test_the_table_answers_as_the_model_and_pickles_without_it(tmp_path):
    w = _workload()
    cal = CalibratedPredictor.fit(w, kind="ridge", level=0.9, folds=5)
    path = cal.save(tmp_path / "m.cal.joblib")
    table = TabulatedCalibrated.of(cal, w.sessions, path)
    restored = pickle.loads(pickle.dumps(table))
    assert restored._full is None
    for s in w.sessions[:10]:
        args = (s.task_text, s.first_prompt_tokens, s.session_id)
        assert restored.predict_peak_tokens(*args) == cal.predict_peak_tokens(*args)
        assert restored.reserve_peak_tokens(*args) == cal.reserve_peak_tokens(*args)
    assert restored._full is None  # no model was loaded for known first calls
    assert restored.predict_peak_tokens("an unseen task", 900, "new") > 0
    assert restored._full is not None  # loaded from the file for an unseen one


def test_growth_fit_uses_the_context_so_far():
    w = _workload()
    initial = np.array([s.first_prompt_tokens * 2.0 for s in w.sessions])
    fit = fit_growth(w.sessions, initial, level=0.9)
    assert fit.coef_context > 0.3 and fit.offset > 0
    assert 0.8 <= fit.coverage <= 1.0
    assert set(fit.coefficients()) == {"intercept", "coef_context", "coef_calls", "coef_initial", "offset"}


@pytest.mark.parametrize("spec, field", [
    ("ridge:q=1.5", "q"), ("ridge:q=abc", "q"), ("gbt:level=0.9", "predictor"), ("auto:q", "predictor"),
])
def test_bad_calibrated_specs_name_the_field(spec: str, field: str):
    with pytest.raises(BasinInputError, match=f"field '{field}'|{field}"):
        make_predictor(spec, "toy")


def test_calibrated_specs_need_a_workload():
    with pytest.raises(BasinInputError, match="workload"):
        make_predictor("gbt")
