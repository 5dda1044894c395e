"""The replay client: closed-loop sessions against a real endpoint, here the
gateway in front of the fake upstream."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from tests.support.fake_upstream import FakeUpstream, FakeUpstreamConfig

from basin.emulate.calls import parse_chat
from basin.errors import BasinInputError
from basin.gateway.config import GatewayConfig
from basin.gateway.replay import ReplaySettings, SessionConversation, replay, schedule_sessions, stream_error_kind
from basin.gateway.server import GatewayServer
from basin.policy.base import Admission, ControlDecision
from basin.workload.records import Call, Session

from .test_proxy import QueuePolicy


def _session(sid: str, calls: int = 4, text: str | None = "fix the parser") -> Session:
    return Session(sid, tuple(Call(prompt_tokens=400 + 100 * k, new_tokens=100 if k else 400, output_tokens=20,
                                   tool_gap_s=0.5) for k in range(calls)), task_text=text)


def test_conversation_grows_by_whole_messages_and_is_deterministic():
    a, b = SessionConversation(_session("s1"), 0, 4.0), SessionConversation(_session("s1"), 0, 4.0)
    first = a.next_prompt(100, 0)
    assert len(first) == 1 and first[0]["content"].startswith("fix the parser")
    assert len(first[0]["content"]) == 400
    second = a.next_prompt(300, 20)
    assert second[:1] == first and [m["role"] for m in second] == ["user", "assistant", "user"]
    assert len(second[1]["content"]) == 80 and len(second[2]["content"]) == 4 * (300 - 100 - 20)
    assert b.next_prompt(100, 0) == first and b.next_prompt(300, 20) == second
    assert SessionConversation(_session("s2"), 0, 4.0).next_prompt(100, 0) != first


def test_settings_and_schedule_refuse_bad_input():
    with pytest.raises(BasinInputError, match="target"):
        ReplaySettings(target="127.0.0.1:8400")
    with pytest.raises(BasinInputError, match="token_scale"):
        ReplaySettings(target="http://h:1", token_scale=0)
    cfg = ReplaySettings(target="http://h:1", rate_per_min=30, duration_s=60, seed=3)
    first = schedule_sessions("terminal-bench", cfg, max_sessions=5)
    assert len(first) == 5 and first == schedule_sessions("terminal-bench", cfg, max_sessions=5)
    assert [a.arrival_s for a in first] == sorted(a.arrival_s for a in first)


def _run(policy, sessions, keepalive_s: float = 10.0, **settings):
    async def go():
        fake = FakeUpstream(FakeUpstreamConfig(completion_tokens=8, engine="vllm"))
        upstream = await fake.start()
        server = GatewayServer(GatewayConfig(upstream=upstream, engine="vllm", listen_port=0, policy="hicache",
                                             scrape_interval_s=60.0, keepalive_s=keepalive_s), policy=policy)
        await server.start()
        try:
            cfg = ReplaySettings(target=server.url, time_scale=0.0, **settings)
            records, summary = await replay(sessions, cfg)
            return records, summary, server.gate, fake
        finally:
            await server.stop()
            await fake.stop()
    return asyncio.run(go())


def _arrivals(n: int, calls: int = 4):
    from basin.workload.arrivals import SessionArrival

    return [SessionArrival(0.05 * i, _session(f"r{i}", calls), "base") for i in range(n)]


def test_replay_through_the_gateway_completes_sessions_and_sees_reuse():
    records, summary, gate, fake = _run(None, _arrivals(6))
    assert summary.sessions == 6 and summary.completed == 6 and summary.calls == 24
    assert all(r.outcome == "ok" and r.status == 200 for r in records)
    assert summary.hit_rate > 0.5  # each prompt extends the previous one
    assert not gate.table.sessions and gate.counts["finished"] == 6  # the end marker closed every session
    assert {r.call_index for r in records if r.session_id == "r0"} == {0, 1, 2, 3}
    sent = [req["body"]["max_tokens"] for req in fake.requests if req["path"].endswith("completions")]
    assert set(sent) == {20}


def test_a_shed_session_stops_and_is_counted():
    policy = QueuePolicy(admit_first=10, shed=("r1",))
    records, summary, gate, fake = _run(policy, _arrivals(3))
    assert summary.shed == 1 and summary.completed == 2
    shed = [r for r in records if r.session_id == "r1"]
    assert len(shed) == 1 and shed[0].outcome == "shed" and shed[0].status == 503


class _ShedWhileParked(QueuePolicy):
    """Parks the named sessions and sheds them at the next control step: the
    gateway has already answered their streamed first call with 200."""

    def on_session_arrival(self, info, signals):
        super().on_session_arrival(info, signals)
        return Admission.PARK if info.session_id in self.shed else Admission.ADMIT

    def control(self, signals, parked):
        return ControlDecision(shed=tuple(parked), next_tick_s=0.05)


def test_a_session_shed_while_parked_is_counted_as_shed_not_as_an_error():
    records, summary, gate, fake = _run(_ShedWhileParked(shed=("r1",)), _arrivals(3))
    assert summary.shed == 1 and summary.completed == 2 and summary.failed == 0
    shed = [r for r in records if r.session_id == "r1"]
    assert len(shed) == 1 and shed[0].outcome == "shed" and shed[0].status == 200 and shed[0].error == ""


class _HoldThenRelease(QueuePolicy):
    """Parks every session after the first and releases the parked ones at the second control step."""

    def __init__(self) -> None:
        super().__init__(admit_first=1)
        self.ticks = 0

    def control(self, signals, parked):
        self.ticks += 1
        return ControlDecision(release=tuple(parked) if self.ticks >= 2 else (), next_tick_s=0.4)


def test_the_first_token_of_a_held_call_is_its_answer_not_the_keepalive():
    # Keep-alive comments every 50 ms while the call is held for about 0.4 s: none is a token.
    records, summary, gate, fake = _run(_HoldThenRelease(), _arrivals(2, calls=1), keepalive_s=0.05)
    assert summary.completed == 2
    held = next(r for r in records if r.session_id == "r1")
    assert held.first_byte_s - held.sent_s >= 0.2


def test_the_error_event_of_a_stream_is_read_by_its_type():
    event = b"event: error\ndata: " + json.dumps({"error": {"type": "upstream_failed", "code": 502}}).encode()
    assert stream_error_kind(b"data: {}\n\n" + event + b"\n\n") == "upstream_failed"
    assert stream_error_kind(b"data: {}\n\n") is None
    assert stream_error_kind(b"event: error\ndata: not json\n\n") == ""


def test_replay_command_writes_calls_and_summary(tmp_path, capsys):
    import json
    import threading

    import pyarrow.parquet as pq

    from cli_helpers import run_basin

    loop = asyncio.new_event_loop()
    fake = FakeUpstream(FakeUpstreamConfig(completion_tokens=4))
    url = loop.run_until_complete(fake.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        code, out, err = run_basin(capsys, "replay", "terminal-bench", "--target", url, "--rate", "600",
                                   "--sessions", "3", "--token-scale", "0.01", "--time-scale", "0",
                                   "--out", str(tmp_path), "--json")
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["sessions"] == 3 and summary["completed"] == 3
    calls = pq.read_table(tmp_path / "calls.parquet").to_pylist()
    assert len(calls) == summary["calls"] and {c["outcome"] for c in calls} == {"ok"}
    assert json.loads((tmp_path / "summary.json").read_text())["workload"] == "terminal-bench"
    code, out, err = run_basin(capsys, "replay", "terminal-bench", "--target", "http://127.0.0.1:9",
                               "--sessions", "0")
    assert code == 2 and "--sessions" in err


def test_a_call_body_is_what_json_dumps_of_the_whole_request_writes() -> None:
    """Bodies are spliced from messages encoded once; the bytes are those of encoding it all each call."""
    import json

    from basin.gateway.replay import call_body

    conv = SessionConversation(_session("s1"), 0, 4.0)
    for prompt, previous in ((100, 0), (300, 20), (520, 7)):
        messages = conv.next_prompt(prompt, previous)
        whole = {"model": "m \\u0000 \"x\"", "messages": messages, "max_tokens": 9, "stream": True,
                 "stream_options": {"include_usage": True}, "temperature": 0}
        assert call_body("m \\u0000 \"x\"", conv.messages_json(), 9) == json.dumps(whole).encode()


def test_a_groups_shared_prefix_is_one_system_message_every_session_of_the_group_sends():
    # The simulator caches a prefix group's shared tokens once for all its sessions;
    # the replay sends them as the same leading system message, so an engine can too.
    def grouped(sid: str, group: str) -> Session:
        return replace(_session(sid), shared_prefix_tokens=120, prefix_group=group)

    a = SessionConversation(grouped("s1", "g"), 0, 4.0).next_prompt(400, 0)
    b = SessionConversation(grouped("s2", "g"), 0, 4.0).next_prompt(400, 0)
    c = SessionConversation(grouped("s3", "other"), 0, 4.0).next_prompt(400, 0)
    assert [m["role"] for m in a] == ["system", "user"] and a[0] == b[0] != c[0]
    assert len(a[0]["content"]) == 4 * 120 and len(a[1]["content"]) == 4 * (400 - 120)
    assert a[1]["content"].startswith("fix the parser") and a[1] != b[1]
    ka, kb = parse_chat({"messages": a}).key, parse_chat({"messages": b}).key
    assert ka[0] == kb[0] and ka[0][1] == 120 and sum(n for _, n in ka) == 400


@pytest.mark.parametrize("chars_per_token", [4, 6])
def test_the_replay_measures_the_text_density_the_target_counts(monkeypatch, chars_per_token):
    """Prompts are sized as tokens x characters a token; the density is the
    target's own (a BPE here counted 26% fewer tokens than 4.0 gives)."""
    import tests.support.fake_upstream as fake_module

    from basin.gateway.replay import measure_chars_per_token

    monkeypatch.setattr(fake_module, "count_tokens", lambda text: max(1, len(text) // chars_per_token))

    async def go() -> float:
        fake = FakeUpstream(FakeUpstreamConfig(completion_tokens=1))
        url = await fake.start()
        try:
            return await measure_chars_per_token(ReplaySettings(target=url))
        finally:
            await fake.stop()

    assert asyncio.run(go()) == pytest.approx(chars_per_token, rel=0.01)


def test_a_target_without_usage_or_a_bad_density_is_refused_by_name(capsys, tmp_path):
    from aiohttp import web

    from basin.gateway.replay import measure_chars_per_token
    from cli_helpers import run_basin

    async def no_usage() -> None:
        app = web.Application()
        async def answer(request: web.Request) -> web.Response:
            return web.Response(text="data: {}\n\ndata: [DONE]\n\n")
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            await measure_chars_per_token(ReplaySettings(target=f"http://127.0.0.1:{port}"))
        finally:
            await runner.cleanup()

    with pytest.raises(BasinInputError, match="usage.prompt_tokens; give --chars-per-token"):
        asyncio.run(no_usage())
    code, _, err = run_basin(capsys, "replay", "terminal-bench", "--target", "http://127.0.0.1:9",
                             "--chars-per-token", "0", "--out", str(tmp_path))
    assert code == 2 and "--chars-per-token: expected a number > 0" in err
