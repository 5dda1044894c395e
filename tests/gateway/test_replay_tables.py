"""``basin replay --scenario``: the scenario's own arrivals, sent for real and
recorded in the simulator's tables, so a real run is summarised like a
simulated one; errors and interruptions keep what was measured."""

from __future__ import annotations

import asyncio
import json
import math
import socket

import numpy as np
import pytest
from tests.emulate.harness import emulator

from basin.catalog import load_hardware
from basin.cli.replay import _write_scenario_run, scenario_plan
from basin.errors import BasinInputError
from basin.experiments.plan import deployment_for
from basin.experiments.runner import run_scenario
from basin.experiments.scenario import load_scenario
from basin.gateway.replay import (
    ReplayCall,
    ReplayLog,
    ReplaySettings,
    SessionRecord,
    Termination,
    check_target,
    replay,
    run_tables,
)
from basin.metrics import CALLS_COLUMNS, SESSIONS_COLUMNS, TIMESERIES_COLUMNS, read_summary, summarize_run
from basin.workload.arrivals import SessionArrival
from basin.workload.records import Call, Session
from basin.workload.reference import unloaded_reference_s

SHORT = ["duration_min=4", "measure_end_min=4", "workload.sessions=200", "workload.max_calls=3",
         "arrivals.base_fraction_of_critical=0.3"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_plan_is_the_simulated_runs_arrivals_and_the_reference_is_the_simulators():
    sc = load_scenario("surge-1p3d", SHORT)
    arrivals, stops = scenario_plan(sc)
    run = run_scenario(sc, "hicache")
    sim = run.result.sessions
    assert [a.session.session_id for a in arrivals] == list(sim["session_id"])
    np.testing.assert_allclose([a.arrival_s for a in arrivals], sim["arrival_s"])
    hw = load_hardware(deployment_for(sc).hardware)
    mine = [unloaded_reference_s(a.session.calls[a.start_call:], hw) for a in arrivals]
    np.testing.assert_allclose(mine, sim["reference_s"], rtol=1e-12)
    assert stops == ()


def test_a_policy_switch_is_refused_and_a_termination_is_kept():
    with pytest.raises(BasinInputError, match=r"interventions\[0\]\.switch_policy.*admin API"):
        scenario_plan(load_scenario("surge-1p3d", [*SHORT, "interventions=[{at_min: 1, switch_policy: basin}]"]))
    _, stops = scenario_plan(load_scenario("surge-1p3d", [*SHORT, "interventions=[{at_min: 2, terminate_tag: burst}]"]))
    assert stops == (Termination(120.0, "burst"),)


def _log() -> ReplayLog:
    """Two sessions: one completed in two calls, one still waiting at the end."""
    log = ReplayLog(elapsed_s=180.0)
    a = SessionRecord(0, "a", "base", False, 10.0, 2, 20.0, first_admitted_s=12.0, finished_s=70.0,
                      ended_s=70.0, calls_done=2, decode_steps=18, outcome="completed")
    b = SessionRecord(1, "b", "burst", False, 100.0, 3, 30.0)
    log.sessions += [a, b]
    log.calls += [ReplayCall("a", 0, 10.0, 13.0, 15.0, 200, 1000, 0, 10, "ok", "base", 12.0, 9, 0),
                  ReplayCall("a", 1, 45.0, 65.0, 70.0, 200, 1200, 1000, 10, "ok", "base", 64.0, 9, 1),
                  ReplayCall("b", 0, 100.0, 101.0, 101.0, 0, 0, 0, 0, "error", "burst", 101.0,
                             error="connection refused")]
    return log


def test_tables_from_a_log_have_the_simulators_columns_and_say_what_happened():
    calls, sessions, ts = run_tables(_log(), 180.0, capacity_tokens=5000.0)
    assert set(CALLS_COLUMNS) <= set(calls) and set(SESSIONS_COLUMNS) <= set(sessions)
    assert set(TIMESERIES_COLUMNS) <= set(ts) and list(ts["minute"]) == [0, 1, 2]
    assert math.isnan(calls["first_token_s"][2]) and calls["error"][2] == "connection refused"
    assert list(calls["uncached_tokens"]) == [1000, 200, 0]
    assert list(ts["prompt_tokens"]) == [1000, 1200, 0] and list(ts["cached_tokens"]) == [0, 1000, 0]
    assert list(ts["active_sessions"]) == [1, 0, 0] and list(ts["parked_sessions"]) == [0, 1, 1]
    assert ts["working_set_tokens"][0] == 1010
    assert list(ts["arrivals"]) == [1, 1, 0] and list(ts["sessions_completed"]) == [0, 1, 0]
    assert ts["first_call_wait_p50_s"][0] == 2.0 and ts["ttft_p50_s"][1] == 1.0
    assert np.isnan(ts["prefill_queue_len"]).all() and list(ts["cache_capacity_tokens"]) == [5000.0] * 3
    summary = summarize_run(calls, sessions, ts, system="replay", trigger_s=None, duration_s=180.0,
                            measure_end_s=180.0)
    assert summary.n_measured == 2 and summary.n_completed == 1 and summary.slowdown_p50 == 3.0


def _emulated_scenario(tmp_path, log: ReplayLog, speed: float, interrupt_after_s: float | None = None,
                       extra: list[str] | None = None):
    sc = load_scenario("surge-1p3d", [*SHORT, *(extra or [])])
    arrivals, stops = scenario_plan(sc)
    hw = load_hardware(deployment_for(sc).hardware)

    async def go():
        async with emulator(speed=speed, host_ratio=2.0) as (emu, _):
            cfg = ReplaySettings(target=emu.url, speed=speed, seed=sc.seed, stop_after_s=sc.duration_min * 60,
                                 itl_slo_s=hw.itl_slo_s)
            job = asyncio.create_task(replay(arrivals, cfg, log=log, terminations=stops,
                                             reference=lambda calls: unloaded_reference_s(calls, hw)))
            if interrupt_after_s is None:
                await job
            else:
                await asyncio.sleep(interrupt_after_s)
                job.cancel()  # what Ctrl-C does to asyncio.run's task
                with pytest.raises(asyncio.CancelledError):
                    await job
    asyncio.run(go())
    summary = _write_scenario_run(tmp_path, log, sc, "hicache", "http://emulator", speed, 1.0, hw.itl_slo_s)
    return sc, arrivals, summary


def test_a_scenario_replayed_against_the_emulator_is_summarised_like_a_simulated_run(tmp_path):
    log = ReplayLog()
    sc, arrivals, summary = _emulated_scenario(tmp_path, log, speed=60.0)
    assert not log.errors and len(log.sessions) == len(arrivals)
    assert log.elapsed_s == 4 * 60  # every session ended: the run lasted its window
    ok = [c for c in log.calls if c.outcome == "ok"]
    assert ok and all(c.sent_s <= c.admitted_s <= c.first_byte_s <= c.done_s for c in ok)
    assert sum(c.cached_tokens for c in ok) > 0  # later calls reuse the conversation
    stored = read_summary(tmp_path)
    assert stored.n_measured == summary.n_measured == len(arrivals) and stored.n_completed > 0
    assert 0.9 < stored.slowdown_p50 < 2.0  # an unloaded deployment: about its reference
    meta = json.loads((tmp_path / "replay.json").read_text())
    assert meta["complete"] and not meta["interrupted"] and meta["errors"] == {}


def test_an_interrupted_replay_keeps_what_it_measured(tmp_path):
    log = ReplayLog()
    _emulated_scenario(tmp_path, log, speed=60.0, interrupt_after_s=1.5)
    log.interrupted = True
    assert 60 <= log.elapsed_s < 4 * 60 and log.calls
    summary = _write_scenario_run(tmp_path, log, load_scenario("surge-1p3d", SHORT), "hicache", "x", 60.0,
                                  1.0, 0.05)
    assert summary is not None and summary.duration_s == log.elapsed_s
    meta = json.loads((tmp_path / "replay.json").read_text())
    assert meta["interrupted"] and not meta["complete"] and meta["calls"] == len(log.calls)
    assert (tmp_path / "calls.parquet").is_file() and (tmp_path / "timeseries.parquet").is_file()


def test_a_termination_ends_the_tags_sessions(tmp_path):
    log = ReplayLog()
    _emulated_scenario(tmp_path, log, speed=60.0, extra=["workload.max_calls=12",
                                                               "interventions=[{at_min: 1, terminate_tag: base}]"])
    before = [s for s in log.sessions if s.arrival_s < 60.0]
    assert before and all(s.outcome in ("terminated", "completed") for s in before)
    assert any(s.outcome == "terminated" for s in before)
    assert not any(c.sent_s > 61.0 for c in log.calls if c.session_id in {s.session_id for s in before})


def test_a_dead_target_says_connection_refused():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(BasinInputError, match="connection refused"):
        asyncio.run(check_target(url))
    session = Session("s", (Call(100, 100, 5, 1.0), Call(150, 45, 5)))
    log = ReplayLog()
    asyncio.run(replay([SessionArrival(0.0, session, "base")], ReplaySettings(target=url), log=log))
    assert log.errors == {"connection refused": 1} and log.sessions[0].outcome == "failed"
    calls, sessions, _ = run_tables(log, 60.0)
    assert list(calls["error"]) == ["connection refused"] and not np.isfinite(sessions["finished_s"]).any()


def test_the_command_refuses_bad_combinations_and_a_dead_target(capsys):
    from cli_helpers import run_basin

    url = f"http://127.0.0.1:{_free_port()}"
    code, _, err = run_basin(capsys, "replay", "terminal-bench", "--scenario", "surge-1p3d", "--target", url)
    assert code == 2 and "not both" in err
    code, _, err = run_basin(capsys, "replay", "--scenario", "surge-1p3d", "--rate", "3", "--target", url)
    assert code == 2 and "--rate" in err and "--set" in err
    code, _, err = run_basin(capsys, "replay", "--scenario", "surge-1p3d", "--speed", "0", "--target", url)
    assert code == 2 and "--speed" in err
    code, _, err = run_basin(capsys, "replay", "--scenario", "surge-1p3d", "--target", url, *sum(
        (["--set", s] for s in SHORT), []))
    assert code == 2 and "connection refused" in err
