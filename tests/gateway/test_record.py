"""``basin gateway --record``: the gateway's own traffic as a workload file
that the simulator replays with the same calls and sessions."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tests.emulate.harness import emulator

from basin.catalog import load_deployment, load_hardware
from basin.errors import BasinInputError
from basin.gateway.config import GatewayConfig
from basin.gateway.record import (
    RecordFile,
    TrafficRecorder,
    check_record_path,
    observed_cached_tokens,
    recorded_arrivals,
    task_hash,
)
from basin.gateway.replay import ReplaySettings, replay
from basin.gateway.server import GatewayServer
from basin.gateway.usage import CallUsage
from basin.sim.engine import SimConfig, Simulator
from basin.systems import RunContext, build_policy
from basin.workload.arrivals import SessionArrival
from basin.workload.io import SESSION_START_KEY, read_workload
from basin.workload.records import Call, Session

TASK = "Fix the failing parser test in src/parse.py"


def test_the_recorder_turns_calls_into_workload_records_without_content():
    rec = TrafficRecorder(origin_s=100.0)
    rec.call_arrived("s", 105.0, TASK)
    rec.call_done("s", CallUsage(1000, 50, 0), 107.0)
    rec.call_arrived("s", 110.0, TASK)
    rec.call_done("s", CallUsage(1300, 40, 990), 112.0)
    rec.call_arrived("s", 113.0, TASK)
    rec.call_done("s", None, 114.0)  # not sized: left out
    session, start = rec.session_ended("s")
    assert start == 5.0 and [c.prompt_tokens for c in session.calls] == [1000, 1300]
    assert [c.new_tokens for c in session.calls] == [1000, 250] and [c.tool_gap_s for c in session.calls] == [3.0, 0]
    assert session.task_text == task_hash(TASK) and TASK not in repr(session)
    assert observed_cached_tokens(session) == (0, 990)
    assert rec.session_ended("s") is None and rec.session_ended("never") is None


def test_the_file_rotates_whole_sessions_and_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "traffic.jsonl"
    out = RecordFile(path, max_bytes=600, keep=2)
    session = Session("a", (Call(100, 100, 5, 1.0), Call(150, 45, 5)), task_text=task_hash("t"),
                      source="basin-gateway; cached_tokens=0,100")
    for i in range(12):
        out.write(Session(f"s{i}", session.calls, session.task_text, source=session.source), float(i))
    out.close()
    files = [path, out.rotated(1), out.rotated(2)]
    assert out.rotated(1).name == "traffic.1.jsonl"
    assert all(f.is_file() for f in files) and not out.rotated(3).exists()
    ids = [s.session_id for f in files[::-1] if f.stat().st_size > 200 for s in read_workload(f).sessions]
    assert ids == sorted(ids, key=lambda x: int(x[1:])) and ids[-1] == "s11"  # newest last, none cut
    foreign = tmp_path / "notes.jsonl"
    foreign.write_text("hello\n")
    with pytest.raises(BasinInputError, match="not a workload file"):
        RecordFile(foreign)
    with pytest.raises(BasinInputError, match=r"\.jsonl"):
        check_record_path(tmp_path / "x.parquet")
    with pytest.raises(BasinInputError, match="does not exist"):
        check_record_path(tmp_path / "missing" / "x.jsonl")


def _sessions() -> list[SessionArrival]:
    out = []
    for i in range(4):
        calls = tuple(Call(prompt_tokens=3000 + 600 * k, new_tokens=3000 if k == 0 else 500, output_tokens=100,
                           tool_gap_s=2.0 if k < 2 else 0.0) for k in range(3))
        out.append(SessionArrival(5.0 * i, Session(f"agent-{i}", calls, task_text=f"{TASK} #{i}"), "base"))
    return out


def test_recorded_traffic_replays_in_the_simulator_with_the_same_calls_and_sessions(tmp_path):
    path = tmp_path / "traffic.jsonl"

    async def go():
        async with emulator(speed=50.0) as (emu, _):
            gateway = GatewayServer(GatewayConfig(upstream=emu.url, engine="sglang", listen_port=0, policy="hicache",
                                                  scrape_interval_s=60.0, record=str(path)))
            await gateway.start()
            try:
                log = await replay(_sessions(), ReplaySettings(target=gateway.url, speed=50.0))
            finally:
                await gateway.stop()
            return log
    calls, _ = asyncio.run(go())
    assert all(c.outcome == "ok" for c in calls) and len(calls) == 12
    text = path.read_text()
    assert TASK not in text and "sha256:" in text
    workload = read_workload(path)
    assert sorted(s.session_id for s in workload.sessions) == [f"agent-{i}" for i in range(4)]
    sent = {(c.session_id, c.call_index): (c.prompt_tokens, c.completion_tokens) for c in calls}
    for s in workload.sessions:
        assert [(c.prompt_tokens, c.output_tokens) for c in s.calls] == [sent[(s.session_id, k)] for k in range(3)]
        assert s.calls[1].tool_gap_s == pytest.approx(2.0 / 50, abs=0.03)  # the gateway's (wall) seconds
    starts = workload.extra[SESSION_START_KEY]
    first = min(starts.values())
    assert sorted(v - first for v in starts.values()) == pytest.approx([0.0, 0.1, 0.2, 0.3], abs=0.08)

    arrivals = recorded_arrivals(workload)
    dep = load_deployment("1p3d-h200")
    hw = load_hardware(dep.hardware)
    policy = build_policy("hicache", {}, RunContext(deployment=dep, workload="terminal-bench", hardware=hw))
    result = Simulator(SimConfig(hardware=hw, deployment=dep, arrivals=arrivals, duration_s=600.0), policy).run()
    sim_sessions, sim_calls = result.sessions, result.calls
    assert list(sim_sessions["session_id"]) == [a.session.session_id for a in arrivals]
    np.testing.assert_allclose(sim_sessions["arrival_s"], [starts[a.session.session_id] for a in arrivals])
    assert list(sim_sessions["n_calls"]) == [3] * 4 and np.isfinite(sim_sessions["finished_s"]).all()
    ids = dict(zip(sim_sessions["session_uid"].tolist(), sim_sessions["session_id"].tolist()))
    got = {(ids[u], int(k)): (int(p), int(o)) for u, k, p, o in zip(
        sim_calls["session_uid"], sim_calls["call_index"], sim_calls["prompt_tokens"], sim_calls["output_tokens"])}
    assert got == sent


def test_a_workload_without_start_times_is_refused():
    from basin.workload.presets import resolve_workload

    with pytest.raises(BasinInputError, match="start_s"):
        recorded_arrivals(resolve_workload("terminal-bench", seed=0, n_sessions=3))


def test_the_gateway_command_refuses_a_bad_record_path(capsys, tmp_path):
    from cli_helpers import run_basin

    code, _, err = run_basin(capsys, "gateway", "--upstream", "http://127.0.0.1:9", "--policy", "hicache",
                             "--record", str(tmp_path / "nowhere" / "t.jsonl"))
    assert code == 2 and "--record" in err and "does not exist" in err
