"""Admission that sees the engine as it is (issue 14, items 8-10): an upstream
URL given with /v1, a llama.cpp server started after the gateway and its slot
limit, and first calls decided against a budget as fresh as the working set."""

from __future__ import annotations

import asyncio
import socket

import pytest
from tests.gateway.test_gate import CONFIG
from tests.gateway.test_proxy import _config, chat, run
from tests.support.fake_upstream import FakeUpstream, FakeUpstreamConfig

from basin.gateway.config import GatewayConfig
from basin.gateway.gate import Gate, slot_capacity_tokens
from basin.gateway.server import GatewayServer
from basin.gateway.sessions import SessionState
from basin.gateway.usage import CallUsage
from basin.policy.basin import BasinParams, BasinPolicy
from basin.predict.peak import GrowthPredictor


# --------------------------------------------------------------------------- the upstream URL
@pytest.mark.parametrize("given, kept", [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
    ("https://router.example/api/v1", "https://router.example/api"),
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
])
def test_an_upstream_given_with_v1_is_normalised(given, kept) -> None:
    assert GatewayConfig(upstream=given).upstream == kept


def test_calls_reach_the_engine_when_the_upstream_was_given_with_v1() -> None:
    async def go():
        fake = FakeUpstream()
        upstream = await fake.start()
        server = GatewayServer(_config(upstream + "/v1"))
        await server.start()
        try:
            import aiohttp

            async with aiohttp.ClientSession() as client:
                async with client.post(server.url + "/v1/chat/completions", json=chat("v1")) as r:
                    assert r.status == 200
            assert fake.requests[-1]["path"] == "/v1/chat/completions"
        finally:
            await server.stop()
            await fake.stop()
    run(go())


# --------------------------------------------------------------------------- llama.cpp's capacity
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_gateway_started_before_its_engine_learns_the_capacity_later() -> None:
    async def go():
        port = _free_port()
        server = GatewayServer(_config(f"http://127.0.0.1:{port}", scrape_interval_s=0.05))
        await server.start()
        fake = FakeUpstream(FakeUpstreamConfig(cache_slots=2, loaded=False))
        try:
            assert server.gate.known_capacity_tokens() is None
            await fake.start(port=port)  # up, but still loading its model: /props answers 503
            await asyncio.sleep(0.3)
            assert server.gate.known_capacity_tokens() is None
            fake.set_config(FakeUpstreamConfig(cache_slots=2))
            for _ in range(100):
                await asyncio.sleep(0.05)
                if server.gate.slots is not None:
                    break
            assert server.gate.slots == (2, 8192) and server.gate.known_capacity_tokens() == 2 * 8192
        finally:
            await server.stop()
            await fake.stop()
    run(go())


def test_the_slot_limit_as_tokens() -> None:
    assert slot_capacity_tokens(2, 8192, 0, 0) == 16_384  # nothing admitted: the slots' full size
    assert slot_capacity_tokens(2, 8192, 3, 3_000) == 2_000  # two slots hold two sessions of 1,000
    assert slot_capacity_tokens(2, 8192, 1, 50_000) == 16_384  # no session holds more than a slot


def _basin_gate(**kw) -> Gate:
    policy = BasinPolicy(BasinParams(lending=False), predictor=GrowthPredictor(1.5))
    return Gate(policy, CONFIG, **kw)


def _session(gate: Gate, sid: str, now: float, prompt: int = 1_000, answer: int = 200) -> SessionState:
    sess = gate.open_call(sid, now, prompt, None, end=False)
    if gate.session_state(sess) is SessionState.ADMITTED:
        gate.forwarded(sess, prompt, now)
        gate.done(sess, CallUsage(prompt, answer, 0), now + 0.5)
    return gate.session_state(sess)


def test_six_sessions_on_two_llamacpp_slots_engage_basins_admission() -> None:
    slots = _basin_gate()
    slots.slots = (2, 8192)
    states = [_session(slots, f"s{i}", float(i)) for i in range(6)]
    assert states[:2] == [SessionState.ADMITTED] * 2 and SessionState.PARKED in states[2:]
    assert slots.policy.state.admit
    # Read as slots x n_ctx tokens, the same six sessions never come near the capacity.
    tokens = _basin_gate(capacity_tokens=2 * 8192)
    assert [_session(tokens, f"s{i}", float(i)) for i in range(6)] == [SessionState.ADMITTED] * 6


# --------------------------------------------------------------------------- arrivals between ticks
def test_a_burst_of_first_calls_is_decided_against_the_current_budget() -> None:
    gate = _basin_gate(capacity_tokens=10_000)
    gate.control_step(0.0)  # the timed step at start; BASIN's next one would be 30 s later
    states = [_session(gate, f"b{i}", 1.0 + i * 0.2) for i in range(50)]
    admitted = states.count(SessionState.ADMITTED)
    assert 1 <= admitted <= 10 and states.count(SessionState.PARKED) == 50 - admitted
    assert gate.policy.state.admit
