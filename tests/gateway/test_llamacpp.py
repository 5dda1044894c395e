"""The gateway in front of a real llama.cpp server.

With two slots and no host-RAM prompt cache the server's prefix cache holds
exactly two sessions: two interleaved sessions stay warm, a third makes every
call miss. That is a working-set cliff in seconds. These tests show the
gateway seeing the collapse (from the responses and from the engine's
/metrics) and BASIN's admission keeping the resident sessions within what the
cache holds.
"""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import pytest

from basin.gateway.config import GatewayConfig
from basin.gateway.server import GatewayServer
from basin.gateway.sessions import SessionState

from .llama_server import llama_server

pytestmark = pytest.mark.engine

_WORDS = ("river stone lantern copper meadow signal harbor violet engine garden window thunder "
          "pocket silver candle market ladder forest marble rocket pepper canyon velvet bridge "
          "puzzle orbit falcon pillow saddle timber").split()


def _prefix(name: str) -> str:
    """A long first message; every session has the same length and its own words."""
    rng = random.Random(name)
    words = list(_WORDS) * 10
    rng.shuffle(words)
    return f"Notes of {name}: " + " ".join(words)


def _body(name: str, turn: int) -> dict:
    messages = [{"role": "user", "content": _prefix(name)}]
    for k in range(turn):
        messages += [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": f"Step {k + 1}."}]
    return {"model": "gemma", "messages": messages, "max_tokens": 4, "temperature": 0}


async def _call(client: aiohttp.ClientSession, url: str, name: str, turn: int, end: bool = False) -> dict:
    headers = {"X-Session-Id": name, "X-Session-End": "true" if end else "false"}
    async with client.post(url + "/v1/chat/completions", json=_body(name, turn), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["usage"]


def _hit(usages: list[dict]) -> float:
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    return cached / sum(u["prompt_tokens"] for u in usages)


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    with llama_server(slots=2, context_tokens=4096,
                      log_path=tmp_path_factory.mktemp("llama") / "server.log") as url:
        yield url


def _gateway(url: str, **kw) -> GatewayServer:
    cfg = dict(upstream=url, engine="llamacpp", listen_port=0, scrape_interval_s=3600.0)
    cfg.update(kw)
    return GatewayServer(GatewayConfig(**cfg))


def test_gateway_sees_the_hit_rate_collapse_at_slots_plus_one_sessions(engine_url):
    async def go():
        server = _gateway(engine_url, policy="hicache")
        await server.start()
        try:
            assert any("priority" in w for w in server.warnings)  # llama.cpp orders nothing itself
            async with aiohttp.ClientSession() as client:
                warm: list[dict] = []
                for turn in range(4):
                    for name in ("A", "B"):
                        usage = await _call(client, server.url, name, turn, end=turn == 3)
                        if turn:
                            warm.append(usage)
                print(f"two sessions: hit {_hit(warm):.3f}")
                assert _hit(warm) > 0.8
                await server.poller.scrape_once()  # engine counters from here on cover the three sessions
                cold: list[dict] = []
                for turn in range(3):
                    for name in ("C", "D", "E"):
                        usage = await _call(client, server.url, name, turn)
                        if turn:
                            cold.append(usage)
                snapshot = await server.poller.scrape_once()
                print(f"three sessions: hit {_hit(cold):.3f}, engine metrics {snapshot.hit_rate:.3f}")
                assert _hit(cold) < 0.2
                assert snapshot is not None and snapshot.hit_rate < 0.2
                gate = server.gate
                signals = gate.signals(server.clock())
                assert signals.hit_rate < 0.5 and signals.active_sessions == 3
                assert signals.working_set_tokens == sum(s.context_tokens for s in gate.table.sessions.values()
                                                         if gate.session_state(s) is SessionState.ADMITTED)
        finally:
            await server.stop()
    asyncio.run(go())


def test_basin_admission_keeps_the_residents_within_what_the_cache_holds(engine_url):
    async def go():
        async with aiohttp.ClientSession() as client:
            # The footprint of two warm sessions, measured on the engine itself.
            contexts = {}
            for turn in range(3):
                for name in ("A", "B"):
                    usage = await _call(client, engine_url, name, turn)
                    contexts[name] = usage["prompt_tokens"] + usage["completion_tokens"]
            two_sessions = sum(contexts.values())
        # The cache holds two such sessions; each session's predicted peak is
        # 0.4 of that pair, so two fit the budget and three do not.
        first_call_bytes = len(json.dumps(_body("A", 0)).encode())
        server = _gateway(engine_url, policy="basin", predictor="growth:1", cache_tokens=int(0.95 * two_sessions),
                          chars_per_token=first_call_bytes / (0.4 * two_sessions),
                          policy_params={"budget_high": 1.0, "budget_past_cap_with_headroom": False,
                                         "context_smoothing_s": 1.0})
        await server.start()
        gate, policy = server.gate, server.policy
        try:
            async with aiohttp.ClientSession() as client:
                for turn in range(3):
                    for name in ("A", "B"):
                        await _call(client, server.url, name, turn)
                gate.tick(server.clock())
                assert policy.state.admit, "the working set reached the budget: admission engages"
                third = asyncio.create_task(_call(client, server.url, "C", 0))
                await asyncio.sleep(1.0)
                assert not third.done()
                assert gate.session_state(gate.table.get("C")) is SessionState.PARKED
                assert gate.driver.admitted_count == 2
                await _call(client, server.url, "A", 3, end=True)
                gate.tick(server.clock())
                await asyncio.wait_for(third, 60)
                assert gate.session_state(gate.table.get("C")) is SessionState.ADMITTED
                warm: list[dict] = []
                next_turn = {"B": 3, "C": 1}
                for _ in range(3):
                    for name in ("B", "C"):
                        warm.append(await _call(client, server.url, name, next_turn[name]))
                        next_turn[name] += 1
                        assert gate.driver.admitted_count <= 2
                print(f"BASIN: two residents of three sessions: hit {_hit(warm[2:]):.3f}; "
                      f"budget {policy.state.budget:.0f}, reserved {policy.state.reserved:.0f}")
                assert _hit(warm[2:]) > 0.8, "the two residents stay warm"
                assert gate.counts["parked"] == 1 and gate.counts["shed"] == 0
        finally:
            await server.stop()
    asyncio.run(go())


def test_replay_through_the_gateway_against_the_real_engine(engine_url):
    """`basin replay`'s client drives real sessions through the gateway; the
    engine reuses each session's prefix across its calls."""
    from basin.gateway.replay import ReplaySettings, replay
    from basin.workload.arrivals import SessionArrival
    from basin.workload.records import Call, Session

    sessions = [SessionArrival(0.0, Session(f"R{i}", tuple(
        Call(prompt_tokens=300 + 40 * k, new_tokens=40, output_tokens=4, tool_gap_s=0.1) for k in range(4)),
        task_text=f"Replay task {i}: tidy the notes."), "base") for i in range(2)]

    async def go():
        server = _gateway(engine_url, policy="basin", cache_tokens=4096)
        await server.start()
        try:
            return await replay(sessions, ReplaySettings(target=server.url, model="gemma")), server.gate
        finally:
            await server.stop()

    (records, summary), gate = asyncio.run(go())
    print(f"replay: {summary}")
    assert summary.completed == 2 and summary.calls == 8
    assert all(r.outcome == "ok" and r.prompt_tokens > 0 for r in records)
    assert summary.hit_rate > 0.5
    assert gate.counts["finished"] == 2 and not gate.table.sessions
