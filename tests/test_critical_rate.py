"""The one critical rate of a deployment as run (basin.catalog.critical_rate:
its cliff profile's lambda_c, by cache tier and router, read by scenarios,
sweeps and BASIN alike), and the steady-load check beside it
(basin.experiments.critical_rate, ``basin critical-rate``): the rate grid,
the rule, input errors, the one pool, and a tiny real grid."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from basin.catalog import critical_rate, load_deployment, require_critical_rate, with_host_ratio
from basin.catalog.cliff_profiles import BASIN_PROFILE_DIR, load_profile
from basin.errors import BasinInputError
from basin.experiments import critical_rate as cr
from basin.experiments.critical_rate import (
    SteadyRun,
    critical_from_runs,
    find_critical_rate,
    rate_grid,
    steady_scenario,
)
from cli_helpers import run_basin as _run


def test_the_critical_rate_is_the_profile_of_the_deployment_as_run() -> None:
    own = load_deployment("1p3d-h200")
    rate = critical_rate(own)
    assert rate is not None and rate.per_min == load_profile(BASIN_PROFILE_DIR / "1p3d-h200.yaml").lambda_c_per_min
    assert rate.origin == "lambda_c_per_min of profiles/basin/1p3d-h200.yaml"
    gpu_only = critical_rate(with_host_ratio(own, 0.0))
    assert gpu_only is not None and "1p3d-h200-gpu-only.yaml" in gpu_only.origin and gpu_only.per_min < rate.per_min
    two = load_deployment("2p6d-h200")
    by_router = {r: critical_rate(two.model_copy(update={"router": r})) for r in ("cache-aware", "least-loaded")}
    assert "2p6d-h200-least-loaded.yaml" in by_router["least-loaded"].origin  # type: ignore[union-attr]
    assert by_router["least-loaded"].per_min < by_router["cache-aware"].per_min  # type: ignore[union-attr]
    # No profile, no critical rate: the message gives the command that makes one.
    assert critical_rate(with_host_ratio(own, 3.0)) is None
    assert critical_rate(own, "swe-pro") is None
    with pytest.raises(BasinInputError, match=r"needs the critical rate of deployment '1p3d-h200' \(host tier "
                                              r"3x.*create it with `basin profile 1p3d-h200 --host-ratio 3`"):
        require_critical_rate(with_host_ratio(own, 3.0), "terminal-bench", "the test")


def test_a_scenario_and_basin_read_the_same_rate() -> None:
    from basin.experiments.plan import base_rate_per_min, deployment_for
    from basin.experiments.scenario import load_scenario
    from basin.systems import RunContext, cliff_summary

    for name, router in (("surge-1p3d", None), ("surge-1p3d", "least-loaded")):
        overrides = [] if router is None else ["deployment=2p6d-h200", f"router={router}"]
        sc = load_scenario(name, overrides)
        dep = deployment_for(sc)
        cliff = cliff_summary(RunContext(deployment=dep, workload=sc.workload.name, host_ratio=sc.host_ratio))
        assert base_rate_per_min(sc, dep) == pytest.approx(0.5 * cliff.lambda_c_per_min)
        if router is not None:
            assert cliff.origin.endswith("2p6d-h200-least-loaded.yaml")  # the router's own profile


def test_rate_grid_and_its_errors() -> None:
    assert rate_grid(4, 6, 0.5) == (4.0, 4.5, 5.0, 5.5, 6.0)
    assert rate_grid(3, 3) == (3.0,)
    assert rate_grid(0.1, 0.3, 0.1) == (0.1, 0.2, 0.3)  # no float drift
    with pytest.raises(BasinInputError, match="--low 8 is above --high 4"):
        rate_grid(8, 4)
    with pytest.raises(BasinInputError, match="--step 0"):
        rate_grid(1, 4, 0)
    with pytest.raises(BasinInputError, match="--low -1"):
        rate_grid(-1, 4)


def _runs(states: dict[float, list[str]]) -> list[SteadyRun]:
    return [SteadyRun(r, s, st, 0.9, 1.0) for r, sts in states.items() for s, st in enumerate(sts)]


def test_the_rule_stops_at_the_first_failing_rate() -> None:
    rates = (4.0, 5.0, 6.0, 7.0)
    runs = _runs({4.0: ["healthy", "healthy"], 5.0: ["healthy", "healthy"], 6.0: ["healthy", "overloaded"],
                  7.0: ["healthy", "healthy"]})  # a lucky healthy rate above a failing one does not count
    assert critical_from_runs(rates, runs) == 5.0
    assert critical_from_runs(rates, _runs({r: ["trapped"] for r in rates})) is None
    assert critical_from_runs(rates, _runs({r: ["healthy"] for r in rates})) == 7.0


def test_a_steady_run_is_the_scripts_scenario() -> None:
    sc = steady_scenario("1p1d-h200", 9.0, 2)
    assert (sc.arrivals.base_per_min, sc.arrivals.warm_sessions, sc.surge.factor) == (9.0, 0, 1.0)
    assert (sc.duration_min, sc.measure_end_min, sc.policy, sc.seed) == (120.0, 90.0, "hicache", 2)
    assert sc.workload.name == "terminal-bench" and sc.workload.sessions == 4000
    assert sc.arrivals.rate_changes == () and sc.host_ratio is None
    short = steady_scenario("1p1d-h200", 9.0, 0, host_ratio=0.0, duration_min=40)
    assert (short.duration_min, short.measure_end_min, short.host_ratio) == (40, 30.0, 0.0)


def _result(state: str, hit_rate: float, ttft_s: float) -> SimpleNamespace:
    """What the executor hands back for a run, as far as a steady run reads it."""
    summary = SimpleNamespace(state=SimpleNamespace(value=state), hit_rate_final=hit_rate, ttft_p50_final_s=ttft_s)
    return SimpleNamespace(summary=summary)


def test_bad_input_fails_before_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cr, "run_plans", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(BasinInputError, match="above --high"):
        find_critical_rate("1p1d-h200", 10, 4)
    with pytest.raises(BasinInputError, match="at least one seed"):
        find_critical_rate("1p1d-h200", 4, 10, seeds=())
    with pytest.raises(BasinInputError, match="--duration 10: .*at least 40 minutes"):
        find_critical_rate("1p1d-h200", 4, 10, duration_min=10)
    with pytest.raises(BasinInputError, match="--jobs 0"):
        find_critical_rate("1p1d-h200", 4, 10, workers=0)
    with pytest.raises(BasinInputError, match="unknown deployment"):
        find_critical_rate("no-such-deployment", 4, 10)


def test_critical_rate_runs_on_the_one_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int | None]] = []

    def fake_pool(plans, on_result=None, *, workers=None, progress=None, **_):  # type: ignore[no-untyped-def]
        seen.append((len(plans), workers))
        return [_result("healthy" if p.scenario.arrivals.base_per_min < 6 else "overloaded", 0.9, 1.0)
                for p in plans]

    monkeypatch.setattr(cr, "run_plans", fake_pool)
    res = find_critical_rate("1p1d-h200", 4, 7, 1, seeds=(0, 1, 2), workers=3)
    assert seen == [(12, 3)]
    assert res.steady_limit_per_min == 5.0 and not res.capped
    assert [r.seed for r in res.runs_at(4.0)] == [0, 1, 2]
    assert res.profiled is not None and res.profiled.per_min == 12.2  # profiles/basin/1p1d-h200.yaml
    d = res.to_dict()
    assert d["steady_limit_per_min"] == 5.0 and [p["healthy"] for p in d["per_rate"]] == [True, True, False, False]
    # Another host tier than the deployment's: that tier's own profile gives the critical rate.
    gpu_only = find_critical_rate("1p1d-h200", 4, 7, 1, host_ratio=0.0).profiled
    assert gpu_only is not None and gpu_only.per_min == 9.3  # profiles/basin/1p1d-h200-gpu-only.yaml
    assert find_critical_rate("1p1d-h200", 4, 7, 1, host_ratio=3.0).profiled is None  # no profile of that tier


def test_a_tiny_real_grid_through_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    # Two rates, one seed, 40 simulated minutes (the shortest run with a state label).
    code, out, err = _run(capsys, "critical-rate", "1p1d-h100", "--low", "2", "--high", "30", "--step", "28",
                          "--seeds", "0", "--duration", "40", "--jobs", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["rates"] == [2.0, 30.0] and data["seeds"] == [0]
    states = [p["runs"][0]["state"] for p in data["per_rate"]]
    assert states[0] == "healthy" and states[1] != "healthy"
    assert data["steady_limit_per_min"] == 2.0 and data["capped_by_high"] is False
    assert data["critical_rate_per_min"] == 4.6  # profiles/basin/1p1d-h100.yaml


def test_the_command_prints_a_table_and_refuses_bad_options(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cr, "run_plans", lambda plans, on_result=None, **_: [
        _result("healthy", 0.95, 0.5) for _ in plans])
    code, out, err = _run(capsys, "critical-rate", "1p1d-h200", "--low", "8", "--high", "9", "--seeds", "0,1")
    assert code == 0, err
    assert "steady-load limit of 1p1d-h200: 9 sessions/min (every rate was healthy; raise --high" in out
    assert "critical rate: 12.2 sessions/min (lambda_c_per_min of profiles/basin/1p1d-h200.yaml)" in out
    code, _, err = _run(capsys, "critical-rate", "1p1d-h200", "--low", "9", "--high", "8")
    assert code == 2 and "--low 9 is above --high 8" in err
    code, _, err = _run(capsys, "critical-rate", "1p1d-h200", "--low", "4", "--high", "8", "--seeds", "a")
    assert code == 2 and "--seeds 'a'" in err
