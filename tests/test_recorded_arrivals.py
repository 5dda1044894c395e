"""Recorded traffic as a what-if: ``arrivals.from_workload`` runs each session
of a workload at its own start time, with a surge as extra Poisson arrivals on
top, and a file written by the gateway's recorder comes back from ``basin
run`` with the same sessions, calls and arrival times."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from basin.errors import BasinInputError
from basin.experiments.plan import deployment_for
from basin.experiments.runner import check_runnable, scenario_arrivals
from basin.experiments.scenario import load_scenario
from basin.gateway.record import RecordFile, TrafficRecorder
from basin.gateway.record import recorded_arrivals as gateway_recorded_arrivals
from basin.gateway.usage import CallUsage
from basin.workload.arrivals import BASE, BURST, recorded_arrivals
from basin.workload.io import SESSION_START_KEY, read_workload, write_workload
from basin.workload.presets import resolve_workload
from cli_helpers import run_basin

ORIGIN_S = 1000.0
#: (session id, first arrival after the gateway started, per call (prompt, output, tool gap)).
TRAFFIC = [
    (f"agent-{i}", 60.0 + 30.0 * i + 7.5 * (i % 3),
     [(4000 + 900 * k + 50 * i, 120 + 10 * k, 3.0 + k) for k in range(2 + i % 4)])
    for i in range(12)
]


def _record(path) -> None:
    """The gateway's own recorder and writer, fed the calls as the gate would."""
    rec = TrafficRecorder(origin_s=ORIGIN_S)
    out = RecordFile(path)
    for sid, start, calls in TRAFFIC:
        t = ORIGIN_S + start
        for k, (prompt, output, gap) in enumerate(calls):
            rec.call_arrived(sid, t, "a task")
            t += 2.0
            rec.call_done(sid, CallUsage(prompt, output, prompt // 2 if k else 0), t)
            t += gap
        ended = rec.session_ended(sid)
        assert ended is not None
        out.write(*ended)
    out.close()


@pytest.fixture
def recorded(tmp_path):
    path = tmp_path / "traffic.jsonl"
    _record(path)
    return path


def _overrides(path, *more: str) -> list[str]:
    return [f"workload.name={path}", "arrivals.from_workload=true", "duration_min=20", "measure_end_min=15",
            "surge.factor=1", *more]


def test_the_gateway_keeps_importing_recorded_arrivals_from_the_workload_package():
    assert gateway_recorded_arrivals is recorded_arrivals


def test_a_recorded_file_run_in_the_simulator_gives_the_same_sessions_and_arrival_times_back(capsys, recorded,
                                                                                               tmp_path):
    out = tmp_path / "out"
    code, _, err = run_basin(capsys, "run", "trap-1p1d", "--system", "hicache", "--out", str(out), "--no-plots",
                             *(a for o in _overrides(recorded) for a in ("--set", o)))
    assert code == 0, err
    sessions = pq.read_table(out / "hicache" / "sessions.parquet").to_pydict()
    calls = pq.read_table(out / "hicache" / "calls.parquet").to_pydict()
    expected = sorted(TRAFFIC, key=lambda t: t[1])
    assert sessions["session_id"] == [sid for sid, _, _ in expected]
    np.testing.assert_allclose(sessions["arrival_s"], [start for _, start, _ in expected])
    assert sessions["n_calls"] == [len(c) for _, _, c in expected]
    ids = dict(zip(sessions["session_uid"], sessions["session_id"]))
    got = {(ids[u], k): (p, o) for u, k, p, o in zip(calls["session_uid"], calls["call_index"],
                                                     calls["prompt_tokens"], calls["output_tokens"])}
    assert got == {(sid, k): (p, o) for sid, _, cs in TRAFFIC for k, (p, o, _) in enumerate(cs)}
    # The tool gaps the recorder measured are the ones the file holds.
    w = read_workload(recorded)
    assert [c.tool_gap_s for c in w.sessions[0].calls] == [3.0, 0.0]


def test_a_surge_adds_poisson_arrivals_on_top_of_the_recorded_ones(recorded):
    sc = load_scenario("trap-1p1d", _overrides(recorded, "surge.factor=3", "surge.start_min=1",
                                               "surge.end_min=5"))
    arrivals = scenario_arrivals(sc, deployment_for(sc))
    base = [a for a in arrivals if a.tag == BASE]
    extra = [a for a in arrivals if a.tag == BURST]
    assert [(a.session.session_id, a.arrival_s) for a in base] == \
        [(sid, start) for sid, start, _ in sorted(TRAFFIC, key=lambda t: t[1])]
    assert extra and all(60.0 <= a.arrival_s < 300.0 for a in extra)
    # (factor - 1) x the recorded rate in the window (8 sessions in 4 minutes) x 4 minutes: 32 expected.
    assert 15 <= len(extra) <= 50
    ids = [a.session.session_id for a in arrivals]
    assert len(set(ids)) == len(ids)
    assert [a.arrival_s for a in arrivals] == sorted(a.arrival_s for a in arrivals)
    again = scenario_arrivals(sc, deployment_for(sc))
    assert [(a.session.session_id, a.arrival_s) for a in again] == [(a.session.session_id, a.arrival_s)
                                                                    for a in arrivals]


def test_set_from_workload_clears_the_poisson_base_it_replaces(recorded):
    sc = load_scenario("trap-1p1d", _overrides(recorded))
    assert sc.arrivals.base_per_min is None and sc.arrivals.warm_sessions == 0 and not sc.arrivals.rate_changes
    check_runnable(sc, ["hicache"])


def test_a_workload_without_start_times_is_refused_naming_start_s(capsys, tmp_path):
    plain = tmp_path / "plain.jsonl"
    write_workload(resolve_workload("terminal-bench", seed=0, n_sessions=3), plain)
    code, _, err = run_basin(capsys, "run", "trap-1p1d", "--no-plots", "--out", str(tmp_path / "o"),
                             *(a for o in _overrides(plain) for a in ("--set", o)))
    assert code == 2 and "start_s" in err and "basin gateway --record" in err


def test_a_session_missing_its_start_time_is_refused(tmp_path):
    w = resolve_workload("terminal-bench", seed=0, n_sessions=3)
    first = w.sessions[0].session_id
    from dataclasses import replace

    partial = replace(w, extra={**w.extra, SESSION_START_KEY: {first: 0.0}})
    with pytest.raises(BasinInputError, match="sessions without start_s"):
        recorded_arrivals(partial)


@pytest.mark.parametrize(("extra", "words"), [
    (["surge.factor=0.5", "surge.start_min=1", "surge.end_min=5"], ["surge.factor", "below 1"]),
    (["surge.factor=2", "surge.start_min=15", "surge.end_min=18"], ["holds no recorded arrival"]),
    (["duration_min=0.5", "measure_end_min=0.5"], ["starts before the run's end", "duration_min"]),
])
def test_surges_and_windows_that_cannot_apply_to_recorded_traffic_are_refused(recorded, extra, words):
    sc = load_scenario("trap-1p1d", _overrides(recorded, *extra))
    with pytest.raises(BasinInputError) as err:
        check_runnable(sc, ["hicache"])
    for word in words:
        assert word in str(err.value)


def test_a_file_that_gives_both_a_base_rate_and_from_workload_is_refused(recorded, tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"name: s\ndeployment: 1p1d-h100\nworkload: {{name: {recorded}}}\n"
                        "arrivals: {base_per_min: 3.3, from_workload: true}\n")
    with pytest.raises(BasinInputError, match=r"arrivals.*base_per_min would be ignored"):
        load_scenario(str(scenario))
    with pytest.raises(BasinInputError, match="set_rate_per_min"):
        load_scenario(str(scenario), ["arrivals.base_per_min=null", "interventions=[{at_min: 5, set_rate_per_min: 2}]"])


def test_commands_that_need_a_base_rate_say_from_workload_has_none(capsys, recorded):
    code, _, err = run_basin(capsys, "model", "analyze", "--scenario", "trap-1p1d",
                             *(a for o in _overrides(recorded) for a in ("--set", o)))
    assert code == 2 and "from_workload" in err and "base_per_min" in err


def test_drawing_a_small_trace_many_times_over_warns(recorded):
    """Poisson arrivals over a three-session file replay each session many
    times: the run says so instead of silently repeating them."""
    scenario = load_scenario("trap-1p1d", [f"workload.name={recorded}", "arrivals.base_per_min=5",
                                           "duration_min=30", "measure_end_min=30"])
    workload = read_workload(recorded)
    with pytest.warns(UserWarning, match="replay each about"):
        arrivals = scenario_arrivals(scenario, deployment_for(scenario), workload)
    assert len(arrivals) > 2 * len(workload.sessions)


def test_a_sweep_runs_recorded_arrivals(recorded, tmp_path):
    """A sweep's store key reads the base rate from the run plan, which has
    none with ``arrivals.from_workload`` (the sweep was refused for it before)."""
    import pyarrow.parquet as pq

    from basin.experiments.sweep import run_sweep
    from basin.experiments.sweep_grid import load_sweep

    path = tmp_path / "recorded.yaml"
    path.write_text("name: recorded\nscenario: trap-1p1d\nset:\n"
                    + "".join(f"  {o.split('=', 1)[0]}: {o.split('=', 1)[1]}\n" for o in _overrides(recorded))
                    + "axes:\n  seed: [0, 1]\nsystems: [hicache]\n", encoding="utf-8")
    sweep = load_sweep(path)
    assert [p.plan.config["base_rate_per_min"] for p in sweep.points] == [None, None]
    assert len({p.key for p in sweep.points}) == 2
    outcome = run_sweep(sweep, tmp_path / "out", workers=1, plots=False)
    rows = pq.read_table(outcome.table).to_pylist()
    assert outcome.runs_computed == 2 and [r["seed"] for r in rows] == [0, 1]
    assert all(r["n_measured"] > 0 for r in rows)
