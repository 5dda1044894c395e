"""The classification checked against the simulator (basin.experiments.classify),
on fabricated ramps and one tiny real run: the first-limit detection, the
grid's scores, the run cache, the one pool; and the model's own side
(basin.model.classify)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import basin.experiments.classify as classify
from basin.experiments.classify import (
    GridResult,
    GridSummary,
    RunCache,
    SimVerdict,
    detect_first_limit,
    ensure_runs,
    ramp_plan,
    ramp_scenario,
    run_grid,
    run_key,
)
from basin.model.classify import GridPoint, default_grid, grid_model, model_limits
from basin.model.resources import classify_limit
from test_model_support import make_model, ramp_timeseries

MIN = 200


def _step(at: int, before: float, after: float, minutes: int = MIN) -> np.ndarray:
    x = np.full(minutes, before)
    x[at:] = after
    return x


def test_cache_first_when_reuse_falls_with_decode_memory_free() -> None:
    ts = ramp_timeseries(MIN, hit=_step(100, 0.95, 0.5), decoding=_step(140, 0.4, 0.95))
    v = detect_first_limit(ts, 33.0)
    assert v.limit == "cache"
    assert v.cache_onset_min == pytest.approx(100, abs=4)
    assert v.decode_onset_min == pytest.approx(140, abs=4)
    assert v.plateau_hit_rate == pytest.approx(0.95)


def test_decode_first_when_memory_fills_with_reuse_intact() -> None:
    ts = ramp_timeseries(MIN, hit=_step(150, 0.95, 0.3), decoding=_step(90, 0.5, 0.97))
    v = detect_first_limit(ts, 33.0)
    assert v.limit == "decode" and v.decode_onset_min == pytest.approx(90, abs=4)


def test_a_prefill_backlog_counts_as_the_cache_side() -> None:
    # Reuse only sags (0.95 -> 0.85) but prefill saturates: the cache-dependent prefill bound limits.
    ts = ramp_timeseries(MIN, hit=_step(100, 0.95, 0.85), decoding=_step(150, 0.5, 0.95),
                         queue=_step(104, 0.0, 30.0))
    assert detect_first_limit(ts, 33.0).limit == "cache"


def test_a_single_dip_is_not_a_limit() -> None:
    hit = np.full(MIN, 0.95)
    hit[60:62] = 0.2  # one bad window, then back
    ts = ramp_timeseries(MIN, hit=hit, decoding=np.full(MIN, 0.4))
    assert detect_first_limit(ts, 33.0).limit == "none"


def test_warm_up_is_ignored() -> None:
    ts = ramp_timeseries(MIN, hit=_step(10, 0.4, 0.95), decoding=np.full(MIN, 0.3))
    assert detect_first_limit(ts, 33.0).limit == "none"


def _result(point: GridPoint, sim: str, ratio_cache: bool) -> GridResult:
    m = make_model() if ratio_cache else make_model(cache_tokens=40 * 1.09e6)
    verdict = SimVerdict(sim, 10.0 if sim == "cache" else None, 10.0 if sim == "decode" else None,
                         0.95, 3.0, 5.0, 50.0)
    return GridResult(point, m, classify_limit(m), (verdict,), ("k",))


def test_scores_of_a_fabricated_grid() -> None:
    pts = default_grid()[:5]
    results = (
        _result(pts[0], "cache", True), _result(pts[1], "cache", True), _result(pts[2], "decode", True),
        _result(pts[3], "decode", False), _result(pts[4], "none", False),
    )
    s = GridSummary(results, 0.01, "test")
    assert s.confusion()["cache"] == {"cache": 2, "decode": 0}
    assert s.confusion()["decode"] == {"cache": 1, "decode": 1}
    assert s.accuracy == pytest.approx(3 / 4)          # "none" is left out
    assert s.cache_first_recall == 1.0
    d = s.to_dict()
    assert {"deployments", "accuracy", "cache_first_recall", "confusion"} <= set(d)
    row = d["deployments"][0]
    assert row["simulated"] == "cache" and row["model"] == "cache"
    assert {"deployment", "host_ratio", "tool_time", "parameters"} <= set(row)


def test_the_grid_has_the_issues_36_deployments() -> None:
    grid = default_grid()
    assert len(grid) == 36 and len(set(grid)) == 36
    assert {p.deployment for p in grid} == {"1p1d-h100", "1p2d-h100", "1p3d-h100"}
    assert {p.host_ratio for p in grid} == {0.0, 2.0, 10.0, 40.0}
    assert {p.tool_time for p in grid} == {1.0, 3.0, 10.0}


def test_ramp_rises_from_low_to_high_and_keys_are_stable() -> None:
    plan = ramp_plan(GridPoint("1p1d-h100", 0.0, 1.0))
    rates = [c["per_min"] for c in plan.rate_changes()]
    assert rates == sorted(rates) and rates[0] >= plan.low_per_min and rates[-1] == pytest.approx(plan.high_per_min)
    sc = ramp_scenario(GridPoint("1p1d-h100", 0.0, 1.0), plan)
    assert run_key(sc) == run_key(ramp_scenario(GridPoint("1p1d-h100", 0.0, 1.0), plan))
    assert run_key(sc) != run_key(ramp_scenario(GridPoint("1p1d-h100", 2.0, 1.0), plan))


def test_run_cache_round_trip(tmp_path) -> None:
    cache = RunCache(tmp_path)
    assert cache.get("abc") is None
    cache.put("abc", {"minute": np.arange(3), "x": np.ones(3)})
    np.testing.assert_array_equal(cache.get("abc")["x"], np.ones(3))
    cache.path("torn").write_bytes(b"not a zip")
    assert cache.get("torn") is None


def test_run_cache_lives_in_the_project_disk_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path))
    assert classify.default_cache_dir() == tmp_path / "classify"


def test_an_unwritable_run_cache_costs_a_warning_not_the_run(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(UserWarning, match="could not keep a classify run"):
        RunCache(blocker / "classify").put("abc", {"x": np.ones(3)})


def test_a_tiny_real_run_is_simulated_once_then_read_back(tmp_path) -> None:
    from basin.experiments.scenario import Scenario

    sc = Scenario.model_validate({
        "name": "tiny", "deployment": "1p1d-h100", "host_ratio": 0,
        "workload": {"name": "terminal-bench", "sessions": 60},
        "arrivals": {"base_per_min": 1.0}, "duration_min": 12, "measure_end_min": 12,
    })
    seen: list[bool] = []
    first = ensure_runs({"tiny": sc}, workers=1, cache_dir=tmp_path, on_done=lambda k, c: seen.append(c))
    again = ensure_runs({"tiny": sc}, workers=1, cache_dir=tmp_path, on_done=lambda k, c: seen.append(c))
    assert seen == [False, True]
    np.testing.assert_array_equal(first["tiny"]["calls_completed"], again["tiny"]["calls_completed"])
    assert set(classify._STORED_COLUMNS) <= set(first["tiny"])


def test_run_grid_on_fabricated_runs(tmp_path, monkeypatch) -> None:
    calls: list[str] = []

    def fake(scenario):
        calls.append(scenario.name)
        cache_first = scenario.host_ratio == 0
        n = int(scenario.duration_min)
        return ramp_timeseries(n, hit=_step(100, 0.95, 0.4, n) if cache_first else np.full(n, 0.95),
                               decoding=_step(150 if cache_first else 80, 0.5, 0.95, n))

    def fake_pool(plans, on_result=None, **_):
        # The simulator stood in for: each plan's measure, as the worker would hand it back.
        out = [SimpleNamespace(measured=fake(p.scenario)) for p in plans]
        for i, r in enumerate(out):
            on_result(i, r)
        return out

    monkeypatch.setattr(classify, "run_plans", fake_pool)
    pts = [GridPoint("1p1d-h100", 0.0, 1.0), GridPoint("1p1d-h100", 40.0, 1.0)]
    from basin.model.hitcurve import PaperHitCurve

    s = run_grid(pts, PaperHitCurve(), workers=1, cache_dir=tmp_path)
    assert [r.simulated for r in s.results] == ["cache", "decode"]
    assert [r.modelled for r in s.results] == ["cache", "decode"]
    assert s.accuracy == 1.0 and s.cache_first_recall == 1.0 and len(calls) == 2
    run_grid(pts, PaperHitCurve(), workers=1, cache_dir=tmp_path)
    assert len(calls) == 2  # the second pass is read from the cache


def test_a_classification_ramp_is_a_load_ramp_scenario() -> None:
    pt = GridPoint("1p2d-h100", 10.0, 3.0)
    plan = ramp_plan(pt)
    sc = ramp_scenario(pt, plan, seed=2)
    ramp = plan.load_ramp()
    assert ramp.step_min == classify.RAMP_STEP_MIN and ramp.duration_min == plan.duration_min == sc.duration_min
    assert sc.arrivals.base_per_min == plan.low_per_min == ramp.rates[0]
    assert [c.model_dump() for c in sc.arrivals.rate_changes] == plan.rate_changes()
    assert sc.arrivals.rate_changes[-1].per_min == pytest.approx(plan.high_per_min)
    assert (sc.host_ratio, sc.workload.tool_time, sc.workload.sessions, sc.seed) == (10.0, 3.0, 2000, 2)
    assert sc.policy == "hicache" and sc.router is None and sc.surge.factor == 1.0


def test_the_models_own_classification_needs_no_simulator() -> None:
    from basin.model.hitcurve import PaperHitCurve

    pts = [GridPoint("1p1d-h100", 0.0, 1.0), GridPoint("1p1d-h100", 40.0, 1.0)]
    limits = model_limits(pts, PaperHitCurve())
    assert [c.first_limit for _, c in limits.values()] == ["cache", "decode"]
    assert limits[pts[0]][0].params == grid_model(pts[0], PaperHitCurve()).params


def test_classify_runs_on_the_one_pool(tmp_path, monkeypatch) -> None:
    seen: list[int] = []

    def fake_pool(plans, on_result=None, *, workers=None, progress=None, **_):
        seen.append(len(plans))
        assert workers == 2 and all(p.measure is classify.stored_columns for p in plans)
        out = []
        for i, p in enumerate(plans):
            n = int(p.scenario.duration_min)
            ts = ramp_timeseries(n, hit=np.full(n, 0.95), decoding=_step(80, 0.5, 0.95, n))
            out.append(SimpleNamespace(measured=ts))
            on_result(i, out[-1])
        return out

    monkeypatch.setattr(classify, "run_plans", fake_pool)
    from basin.model.hitcurve import PaperHitCurve

    pts = [GridPoint("1p1d-h100", 40.0, 1.0)]
    s = run_grid(pts, PaperHitCurve(), seeds=(0, 1), workers=2, cache_dir=tmp_path)
    assert seen == [2] and [r.simulated for r in s.results] == ["decode"]
    assert len(list(tmp_path.glob("*.npz"))) == 2  # each run kept as it ended
