"""The critical-rate experiment (basin.experiments.critical_rate) and the
``basin critical-rate`` command: the rate grid, the rule, input errors, the
one pool, and a tiny real grid."""

from __future__ import annotations

import json

import pytest

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


def test_bad_input_fails_before_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cr, "run_jobs", lambda *a, **k: pytest.fail("ran"))
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
    seen: list[tuple[object, int, int | None]] = []

    def fake_pool(fn, jobs, workers=None, progress=None, on_result=None):  # type: ignore[no-untyped-def]
        seen.append((fn, len(jobs), workers))
        return [SteadyRun(sc.arrivals.base_per_min, sc.seed, "healthy" if sc.arrivals.base_per_min < 6 else
                          "overloaded", 0.9, 1.0) for sc in reversed(jobs)]

    monkeypatch.setattr(cr, "run_jobs", fake_pool)
    res = find_critical_rate("1p1d-h200", 4, 7, 1, seeds=(0, 1, 2), workers=3)
    assert seen == [(cr._steady_job, 12, 3)]
    assert res.critical_rate_per_min == 5.0 and not res.capped
    assert [r.seed for r in res.runs_at(4.0)] == [0, 1, 2]
    assert res.catalog is not None and res.catalog.per_min == 12.0  # profiles/critical-rates.yaml
    d = res.to_dict()
    assert d["critical_rate_per_min"] == 5.0 and [p["healthy"] for p in d["per_rate"]] == [True, True, False, False]
    # Another host tier than the deployment's: the catalogue's rate does not apply.
    assert find_critical_rate("1p1d-h200", 4, 7, 1, host_ratio=0.0).catalog is None


def test_a_tiny_real_grid_through_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    # Two rates, one seed, 40 simulated minutes (the shortest run with a state label).
    code, out, err = _run(capsys, "critical-rate", "1p1d-h100", "--low", "2", "--high", "30", "--step", "28",
                          "--seeds", "0", "--duration", "40", "--jobs", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["rates"] == [2.0, 30.0] and data["seeds"] == [0]
    states = [p["runs"][0]["state"] for p in data["per_rate"]]
    assert states[0] == "healthy" and states[1] != "healthy"
    assert data["critical_rate_per_min"] == 2.0 and data["capped_by_high"] is False
    assert data["catalog_critical_rate_per_min"] is None  # the catalogue has no 1p1d-h100 rate


def test_the_command_prints_a_table_and_refuses_bad_options(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cr, "run_jobs", lambda fn, jobs, workers=None, progress=None, on_result=None: [
        SteadyRun(sc.arrivals.base_per_min, sc.seed, "healthy", 0.95, 0.5) for sc in jobs])
    code, out, err = _run(capsys, "critical-rate", "1p1d-h200", "--low", "8", "--high", "9", "--seeds", "0,1")
    assert code == 0, err
    assert "critical rate of 1p1d-h200: 9 sessions/min (every rate was healthy; raise --high" in out
    assert "catalogue (profiles/critical-rates.yaml): 12 sessions/min" in out
    code, _, err = _run(capsys, "critical-rate", "1p1d-h200", "--low", "9", "--high", "8")
    assert code == 2 and "--low 9 is above --high 8" in err
    code, _, err = _run(capsys, "critical-rate", "1p1d-h200", "--low", "4", "--high", "8", "--seeds", "a")
    assert code == 2 and "--seeds 'a'" in err
