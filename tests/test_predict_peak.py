"""The peak-context predictor: the free-length ridge, leakage, determinism, oracles, the spec registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.errors import BasinInputError
from basin.predict import peak
from basin.predict.peak import (
    NoisyOraclePredictor,
    OraclePredictor,
    PeakPredictor,
    RidgePeakPredictor,
    TrainingData,
    cross_fit,
    evaluate,
    group_key,
    make_predictor,
)
from basin.predict.ridge import FreeLengthRidge, PeakFeatures, group_splits, tokens
from basin.workload.io import write_workload
from basin.workload.records import Call, Session, Workload
from predict_helpers import toy_workload


def _workload(n_tasks: int = 24, reruns: int = 2, seed: int = 0, magic: bool = False,
              with_text: bool = True) -> Workload:
    """Single-call sessions of the toy workload (tests/predict_helpers.py)."""
    return toy_workload(n_tasks, reruns, seed, magic, with_text)


def _replace_text(w: Workload, old: str, new: str) -> Workload:
    from dataclasses import replace

    return replace(w, sessions=tuple(replace(s, task_text=s.task_text.replace(old, new)) for s in w.sessions))


# ---------------------------------------------------------------------------
# The ridge with free length coefficients


def _explicit_solution(z: np.ndarray, x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """Penalised normal equations with penalty diag(0 [intercept], 0 [lengths], alpha [text])."""
    a = np.column_stack([np.ones(len(y)), z, x])
    pen = np.diag([0.0] * (1 + z.shape[1]) + [alpha] * x.shape[1])
    return np.linalg.solve(a.T @ a + pen, a.T @ y)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(12, 40), st.integers(1, 60), st.floats(1e-3, 1e3))
def test_free_length_ridge_solves_the_partially_penalised_problem(seed: int, n: int, p: int, alpha: float) -> None:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 2)) * [1.0, 3.0] + [5.0, -2.0]
    x = rng.normal(size=(n, p))
    y = z @ [0.7, -1.3] + x @ rng.normal(size=p) + rng.normal(size=n) + 4.0
    ridge = FreeLengthRidge(alpha=alpha).fit(np.column_stack([z, x]), y)
    want = _explicit_solution(z, x, y, alpha)
    got = np.concatenate([[ridge.intercept_], ridge.coef_free_, ridge.coef_text_])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * (1 + np.abs(want).max()))


def test_length_coefficients_are_not_shrunk() -> None:
    # Huge alpha: text coefficients vanish, the lengths keep their least-squares fit on their own.
    rng = np.random.default_rng(1)
    z = rng.normal(size=(50, 2))
    x = rng.normal(size=(50, 30))
    y = 2.0 + z @ [3.0, -4.0] + 0.01 * rng.normal(size=50)
    ridge = FreeLengthRidge(alpha=1e12).fit(np.column_stack([z, x]), y)
    np.testing.assert_allclose(ridge.coef_free_, [3.0, -4.0], atol=0.01)
    assert np.abs(ridge.coef_text_).max() < 1e-6


def test_path_predictions_match_single_fits() -> None:
    rng = np.random.default_rng(2)
    m = rng.normal(size=(40, 12))
    y = rng.normal(size=40)
    held = rng.normal(size=(7, 12))
    alphas = (0.01, 1.0, 100.0)
    path = FreeLengthRidge().path_predict(m, y, held, alphas)
    for row, a in zip(path, alphas):
        np.testing.assert_allclose(row, FreeLengthRidge(alpha=a).fit(m, y).predict(held), rtol=1e-10, atol=1e-10)


def test_a_constant_length_column_gets_no_coefficient() -> None:
    # No task texts at all: log task length is 0 everywhere; the first prompt carries the fit.
    rng = np.random.default_rng(3)
    fp = rng.uniform(6, 9, size=30)
    m = np.column_stack([np.zeros(30), fp])
    ridge = FreeLengthRidge().fit(m, 1.0 + 2.0 * fp)
    np.testing.assert_allclose(ridge.coef_free_, [0.0, 2.0], atol=1e-9)
    np.testing.assert_allclose(ridge.intercept_, 1.0, atol=1e-9)


def test_features_put_log_lengths_first_and_zero_rows_for_missing_text() -> None:
    rows = [("alpha beta gamma", 100), ("alpha beta delta", 1000), (None, 50), ("", 10)]
    feats = PeakFeatures(min_df=1, max_df=1.0).fit(rows)
    m = feats.transform(rows).toarray()
    np.testing.assert_allclose(m[:, 0], [math.log1p(16), math.log1p(16), 0.0, 0.0])
    np.testing.assert_allclose(m[:, 1], np.log1p([100, 1000, 50, 10]))
    assert feats.n_terms_ == 4
    assert not m[2:, 2:].any()
    np.testing.assert_allclose(np.linalg.norm(m[:2, 2:], axis=1), 1.0)  # TF-IDF rows: unit norm
    np.testing.assert_array_equal(feats.fit_transform(rows).toarray(), m)


def test_vocabulary_counts_distinct_tasks_not_reruns() -> None:
    # 'rare' is in one task run five times: with min_df=2 it must not enter the vocabulary.
    rows = [("common rare", 10)] * 5 + [("common other", 10), ("other words", 10)]
    feats = PeakFeatures(min_df=2, max_df=1.0).fit(rows)
    assert set(feats.vectorizer_.vocabulary_) == {"common", "other"}


# ---------------------------------------------------------------------------
# Cross-fitting: no leakage


def test_folds_hold_whole_tasks_and_cover_every_session() -> None:
    w = _workload(n_tasks=30, reruns=3)
    data = TrainingData.from_sessions(w.sessions)
    splits = group_splits(data.groups, 7, seed=4)
    assert len(splits) == 7
    seen = np.concatenate([test for _, test in splits])
    assert sorted(seen) == list(range(len(w.sessions)))
    for train, test in splits:
        assert not {data.groups[i] for i in train} & {data.groups[i] for i in test}
    assert len(group_splits(data.groups, 1000, seed=0)) == 30  # leave-one-task-out


def test_each_fold_vocabulary_comes_from_its_training_texts_only() -> None:
    w = _workload(magic=True)
    data = TrainingData.from_sessions(w.sessions)
    cf = cross_fit(data, folds=5)
    for f, model in enumerate(cf.models):
        vocab = set(model.named_steps["features"].vectorizer_.vocabulary_)
        train_tokens = set().union(*(tokens(t) for (t, _), g in zip(data.rows, cf.fold_of_session) if g != f))
        assert vocab <= train_tokens
        assert not any(v.startswith("zq") for v in vocab)  # task-unique tokens never survive min_df


def test_a_token_unique_to_one_task_cannot_help_predict_it() -> None:
    # Every task carries its own identifying token. Renaming those tokens changes nothing,
    # so the cross-fitted predictions cannot have used them.
    w = _workload(magic=True)
    renamed = w
    for t in range(24):
        renamed = _replace_text(renamed, f"zq{t:04d}", f"zr{t:04d}")
    a = evaluate(w, folds=6)
    b = evaluate(renamed, folds=6)
    np.testing.assert_array_equal(a.predictions, b.predictions)


def test_a_sessions_own_peak_does_not_move_its_prediction() -> None:
    from dataclasses import replace

    w = _workload(n_tasks=20)
    base = evaluate(w, folds=5).predictions
    target = w.sessions[6].task_text
    bumped = replace(w, sessions=tuple(
        replace(s, calls=(replace(s.calls[0], output_tokens=s.calls[0].output_tokens * 50),))
        if s.task_text == target else s for s in w.sessions))
    again = evaluate(bumped, folds=5).predictions
    rerun_rows = [i for i, s in enumerate(w.sessions) if s.task_text == target]
    assert len(rerun_rows) == 2
    np.testing.assert_array_equal(again[rerun_rows], base[rerun_rows])


def test_holding_out_single_sessions_leaks_reruns() -> None:
    # The contrast that motivates grouping: with reruns split across folds,
    # a rerun's text memorised from training predicts its twin.
    w = _workload(n_tasks=40, reruns=2, magic=True)
    honest = evaluate(w, folds=5, group_by="task")
    leaky = evaluate(w, folds=5, group_by="session")
    assert honest.groups == 40 and leaky.groups == 80
    assert leaky.log_error_sd < honest.log_error_sd


def test_signal_in_words_is_learnt_out_of_sample() -> None:
    w = _workload(n_tasks=80, reruns=1, seed=5)
    ev = evaluate(w, folds=5)
    assert ev.spearman > 0.5
    assert evaluate(w, folds=5, use_text=False).spearman < ev.spearman


# ---------------------------------------------------------------------------
# Determinism, persistence, the run-time cross-fit


def test_evaluation_and_fitting_are_deterministic(tmp_path) -> None:
    w = _workload()
    np.testing.assert_array_equal(evaluate(w, folds=4, seed=3).predictions, evaluate(w, folds=4, seed=3).predictions)
    a, b = RidgePeakPredictor.fit(w, folds=4), RidgePeakPredictor.fit(w, folds=4)
    loaded = RidgePeakPredictor.load(a.save(tmp_path / "m.joblib"))
    for s in w.sessions:
        args = (s.task_text, s.first_prompt_tokens, s.session_id, None)
        assert a.predict_peak_tokens(*args) == b.predict_peak_tokens(*args) == loaded.predict_peak_tokens(*args)
    assert loaded.meta == a.meta


def test_ridge_predictor_answers_known_tasks_with_their_out_of_fold_model() -> None:
    w = _workload(n_tasks=30)
    pred = RidgePeakPredictor.fit(w, folds=5)
    ev = evaluate(w, folds=5)
    got = [pred.predict_peak_tokens(s.task_text, s.first_prompt_tokens, s.session_id, None) for s in w.sessions]
    np.testing.assert_allclose(got, ev.predictions, rtol=1e-12)
    assert pred.meta["spearman"] == pytest.approx(ev.spearman)
    # An unseen task gets the all-data model; a rerun under another id still gets its fold's model.
    assert pred.model_for("a brand new task", "new") is pred.full_model
    s = w.sessions[0]
    fold = pred.fold_of_group[group_key(s.task_text, s.session_id)]
    assert pred.model_for(s.task_text, "another-id") is pred.fold_models[fold]


def test_predictions_are_floored_at_the_first_prompt() -> None:
    pred = RidgePeakPredictor.fit(_workload(), folds=3)
    assert pred.predict_peak_tokens("django crash", 10_000_000, "x", None) == 10_000_000.0


def test_sessions_without_text_are_predicted_from_the_first_prompt() -> None:
    w = _workload(n_tasks=30, reruns=1, with_text=False)
    pred = RidgePeakPredictor.fit(w, folds=5)
    assert pred.full_model.named_steps["features"].n_terms_ == 0
    ys = [pred.predict_peak_tokens(None, fp, "unseen", None) for fp in (600, 800, 1200)]
    assert ys[0] != ys[1] != ys[2]
    assert pred.predict_peak_tokens("", 800, "unseen", None) == ys[1]
    assert evaluate(w, folds=5).text_terms_median == 0 and evaluate(w, folds=5).alpha_median is None


def test_terminal_bench_fits_quickly() -> None:
    import time

    from basin.workload.presets import resolve_workload

    w = resolve_workload("terminal-bench")
    t0 = time.perf_counter()
    pred = RidgePeakPredictor.fit(w)
    assert time.perf_counter() - t0 < 15.0  # about 1 s on one core; generous for a busy machine
    assert pred.meta["sessions"] == 216 and pred.meta["folds"] == 10


# ---------------------------------------------------------------------------
# Oracles


def test_oracle_is_exact_and_needs_the_truth() -> None:
    o = OraclePredictor()
    assert isinstance(o, PeakPredictor)
    assert o.predict_peak_tokens("t", 10, "a", 12345) == 12345.0
    with pytest.raises(BasinInputError, match="oracle_peak_tokens"):
        o.predict_peak_tokens("t", 10, "a", None)
    with pytest.raises(BasinInputError, match="oracle_peak_tokens"):
        o.predict_peak_tokens("t", 10, "a", 0)


def test_noisy_oracle_has_lognormal_error_of_its_sigma() -> None:
    sigma = 0.5
    o = NoisyOraclePredictor(sigma, seed=3)
    ids = [f"session-{i}" for i in range(4000)]
    err = np.log([o.predict_peak_tokens(None, 1, sid, 10_000) / 10_000 for sid in ids])
    assert np.std(err) == pytest.approx(sigma, rel=0.05)
    assert abs(np.mean(err)) < 4 * sigma / math.sqrt(len(ids))
    from scipy.stats import normaltest

    assert normaltest(err / sigma).pvalue > 1e-3


def test_noisy_oracle_is_deterministic_by_seed_and_session() -> None:
    a, b, c = NoisyOraclePredictor(1.0, seed=7), NoisyOraclePredictor(1.0, seed=7), NoisyOraclePredictor(1.0, seed=8)
    forward = [a.predict_peak_tokens(None, 1, f"s{i}", 5000) for i in range(50)]
    backward = [b.predict_peak_tokens(None, 1, f"s{i}", 5000) for i in reversed(range(50))][::-1]
    assert forward == backward
    assert forward != [c.predict_peak_tokens(None, 1, f"s{i}", 5000) for i in range(50)]
    # The error is per session, not per peak: the ratio is the same at any true peak.
    assert a.predict_peak_tokens(None, 1, "s3", 1000) / 1000 == pytest.approx(forward[3] / 5000)
    assert NoisyOraclePredictor(0.0).predict_peak_tokens(None, 1, "s", 4321) == 4321.0


# ---------------------------------------------------------------------------
# The spec registry and bad input


def test_make_predictor_specs() -> None:
    assert isinstance(make_predictor("oracle"), OraclePredictor)
    n = make_predictor("noisy:0.5")
    assert isinstance(n, NoisyOraclePredictor) and n.sigma == 0.5 and n.seed == 0
    assert make_predictor("noisy:1:4").seed == 4
    for spec in ("oracle", "noisy:0.5", "noisy:1:4"):
        assert isinstance(make_predictor(spec, "terminal-bench"), PeakPredictor)


@pytest.mark.parametrize("spec, field", [
    ("", "predictor"), ("magic", "predictor"), ("noisy", "predictor"), ("noisy:abc", "predictor"),
    ("noisy:0.5:1:2", "predictor"), ("noisy:-1", "sigma"), ("noisy:nan", "sigma"), ("noisy:1:-2", "seed"),
    ("oracle:x", "predictor"), ("ridge", "workload"),
])
def test_bad_specs_name_the_field_and_the_fix(spec: str, field: str) -> None:
    with pytest.raises(BasinInputError, match=f"field '{field}'") as info:
        make_predictor(spec, None)
    assert "use" in str(info.value) or "pass" in str(info.value) or "write" in str(info.value)


def test_bad_call_inputs() -> None:
    o = OraclePredictor()
    with pytest.raises(BasinInputError, match="first_prompt_tokens"):
        o.predict_peak_tokens("t", -1, "a", 10)
    with pytest.raises(BasinInputError, match="first_prompt_tokens"):
        o.predict_peak_tokens("t", True, "a", 10)
    with pytest.raises(BasinInputError, match="task_text"):
        o.predict_peak_tokens(3, 10, "a", 10)
    with pytest.raises(BasinInputError, match="session_id"):
        o.predict_peak_tokens("t", 10, "", 10)
    with pytest.raises(BasinInputError, match="folds"):
        evaluate(_workload(), folds=1)
    with pytest.raises(BasinInputError, match="fold_seed"):
        evaluate(_workload(), seed=-1)
    with pytest.raises(BasinInputError, match="group_by"):
        evaluate(_workload(), group_by="call")
    one_task = Workload("one", tuple(Session(f"s{i}", (Call(10, 10, 5),), task_text="same") for i in range(3)))
    with pytest.raises(BasinInputError, match="two distinct tasks"):
        evaluate(one_task)


def test_loading_a_bad_model_file(tmp_path) -> None:
    with pytest.raises(BasinInputError, match="no such file"):
        RidgePeakPredictor.load(tmp_path / "missing.joblib")
    junk = tmp_path / "junk.joblib"
    junk.write_bytes(b"not a model")
    with pytest.raises(BasinInputError, match="not a saved peak predictor"):
        make_predictor(f"ridge:{junk}")
    import joblib

    joblib.dump({"format": -1}, tmp_path / "old.joblib")
    with pytest.raises(BasinInputError, match="field 'format'"):
        RidgePeakPredictor.load(tmp_path / "old.joblib")


def test_ridge_spec_fits_once_then_reads_the_disk_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(peak, "_RIDGE_MEMO", {})
    wfile = tmp_path / "toy.jsonl"
    write_workload(_workload(n_tasks=30), wfile)
    first = make_predictor("ridge", str(wfile))
    saved = list((tmp_path / "cache" / "predict").glob("toy-*.joblib"))
    assert len(saved) == 1
    assert make_predictor("ridge", str(wfile)) is first  # in-process memo

    monkeypatch.setattr(peak, "_RIDGE_MEMO", {})

    def no_fit(*args: object, **kwargs: object) -> None:
        raise AssertionError("should have loaded the cached model")

    monkeypatch.setattr(RidgePeakPredictor, "fit", no_fit)
    again = make_predictor("ridge", str(wfile))
    s = _workload(n_tasks=30).sessions[4]
    args = (s.task_text, s.first_prompt_tokens, s.session_id, None)
    assert again.predict_peak_tokens(*args) == first.predict_peak_tokens(*args)
    assert make_predictor(f"ridge:{saved[0]}").predict_peak_tokens(*args) == first.predict_peak_tokens(*args)


def test_a_changed_workload_gets_its_own_cache_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path / "cache"))
    a = peak.default_model_path(_workload(n_tasks=20, seed=1))
    b = peak.default_model_path(_workload(n_tasks=20, seed=2))
    assert a != b and a.parent == b.parent == tmp_path / "cache" / "predict"
    assert a.name.startswith("toy-") and a == peak.default_model_path(_workload(n_tasks=20, seed=1))
    assert peak.default_model_path(_workload(n_tasks=20, seed=1), folds=5) != a


def test_growth_predictor_scales_the_first_prompt_and_rejects_bad_factors():
    from basin.predict.peak import GrowthPredictor

    growth = make_predictor("growth:1.5")
    assert isinstance(growth, GrowthPredictor)
    assert growth.predict_peak_tokens("fix the bug", 1_000, "s1", None) == 1_500.0
    assert growth.predict_peak_tokens(None, 0, "s2", None) == 1.0
    for spec in ("growth:x", "growth:0.5", "growth:nan", "growth:"):
        with pytest.raises(BasinInputError, match="growth"):
            make_predictor(spec)
