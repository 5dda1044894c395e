"""Decode-memory lending through a gateway (``lending_url``): the switch is
posted on a change and not on repeats, off the control step, survives a dead
URL and retries at the next tick; the lent memory an engine reports reaches
the policy's signals; without the setting a gateway still forces lending off."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from tests.emulate.harness import emulator
from tests.support.local_app import start_app

from basin.errors import BasinInputError
from basin.gateway.adapters.base import EMULATOR_DECODE_KV_TOKENS, EMULATOR_LENT_CACHE_TOKENS
from basin.gateway.adapters.sglang import SGLangAdapter
from basin.gateway.config import GatewayConfig, load_gateway_config
from basin.gateway.exposition import MetricsError
from basin.gateway.gate import Gate
from basin.gateway.lending import LendingSwitch
from basin.gateway.scrape import EngineMetrics
from basin.gateway.server import GatewayServer, build_policy
from basin.gateway.snapshot import EngineSnapshot
from basin.policy.base import ControlDecision, Policy

UPSTREAM = "http://127.0.0.1:9"
LENDING = "http://127.0.0.1:9/emulator/lending"


class Lender(Policy):
    """Lends when told to; ticks every second."""

    name = "lender"

    def __init__(self) -> None:
        super().__init__()
        self.lend = False

    def control(self, signals, parked):
        return ControlDecision(lend_decode_memory=self.lend, next_tick_s=1.0)


@asynccontextmanager
async def switch_server(statuses: list[int] | None = None,
                        delay_s: float = 0.0) -> AsyncIterator[tuple[str, list[dict]]]:
    """A lending endpoint recording each body; answers ``statuses`` in turn (then 200)."""
    seen: list[dict] = []
    queue = list(statuses or [])

    async def lending(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        await asyncio.sleep(delay_s)
        status = queue.pop(0) if queue else 200
        return web.json_response(body if status == 200 else {"error": "no"}, status=status)

    app = web.Application()
    app.router.add_post("/emulator/lending", lending)
    runner, base = await start_app(app)
    try:
        yield f"{base}/emulator/lending", seen
    finally:
        await runner.cleanup()


async def settle(switch: LendingSwitch) -> None:
    """Wait until no post is under way."""
    for _ in range(200):
        if switch._task is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the lending post never finished")


def test_the_switch_is_posted_on_a_change_and_not_on_repeats():
    async def go():
        async with switch_server() as (url, seen), aiohttp.ClientSession() as client:
            switch = LendingSwitch(url, client)
            for on in (False, False, True, True, True, False, False):
                switch.want(on, 0.5)
                await settle(switch)
            assert [b["on"] for b in seen] == [False, True, False]  # the first decision is always sent
            assert seen[0] == {"on": False, "cap_fraction": 0.5}
            assert switch.confirmed == (False, 0.5) and switch.posts == 3 and switch.failures == 0
            switch.want(False, 0.3)  # the cap is part of the switch
            await settle(switch)
            assert seen[-1] == {"on": False, "cap_fraction": 0.3}
    asyncio.run(go())


def test_a_change_made_while_a_post_is_under_way_follows_it():
    async def go():
        async with switch_server(delay_s=0.1) as (url, seen), aiohttp.ClientSession() as client:
            switch = LendingSwitch(url, client)
            switch.want(True, 0.5)
            switch.want(False, 0.5)  # returns at once; one post at a time
            switch.want(True, 0.5)
            switch.want(False, 0.5)
            assert switch.posts == 0  # nothing waited for the engine
            await asyncio.sleep(0.5)
            await settle(switch)
            assert [b["on"] for b in seen] == [True, False] and switch.confirmed == (False, 0.5)
    asyncio.run(go())


def test_a_dead_or_refusing_url_is_counted_and_retried_at_the_next_tick(caplog):
    async def go():
        async with aiohttp.ClientSession() as client:
            dead = LendingSwitch("http://127.0.0.1:9/emulator/lending", client, timeout_s=0.5)
            dead.want(True, 0.5)
            await settle(dead)
            assert dead.failures == 1 and dead.confirmed is None and "failed" in (dead.last_error or "")
            dead.want(True, 0.5)  # the same decision at the next tick: tried again
            await settle(dead)
            assert dead.failures == dead.failures_in_a_row == 2
        async with switch_server(statuses=[500]) as (url, seen), aiohttp.ClientSession() as client:
            switch = LendingSwitch(url, client)
            switch.want(True, 0.5)
            await settle(switch)
            assert switch.failures == 1 and "HTTP 500" in (switch.last_error or "")
            switch.want(True, 0.5)
            await settle(switch)
            assert switch.confirmed == (True, 0.5) and switch.failures_in_a_row == 0 and len(seen) == 2
            assert switch.state()["confirmed"] == {"on": True, "cap_fraction": 0.5}
    asyncio.run(go())
    assert sum("lending switch" in r.message and "failed" in r.message for r in caplog.records) == 2  # once a run


def test_the_gate_hands_each_ticks_decision_to_the_switch_without_raising():
    async def go():
        async with switch_server() as (url, seen), aiohttp.ClientSession() as client:
            policy = Lender()
            gate = Gate(policy, GatewayConfig(upstream=UPSTREAM, lending_url=url))
            gate.lender = LendingSwitch(url, client)
            for now, lend in enumerate((False, True, True, False)):
                policy.lend = lend
                gate.control_step(float(now))
                await settle(gate.lender)
            assert [b["on"] for b in seen] == [False, True, False] and gate.control_failures == 0
        # Off the event loop (or with the engine gone) the control step still succeeds.
        policy = Lender()
        gate = Gate(policy, GatewayConfig(upstream=UPSTREAM, lending_url=LENDING))
        gate.lender = LendingSwitch(LENDING, client)
        return gate
    gate = asyncio.run(go())
    gate.control_step(10.0)
    assert gate.control_failures == 0 and gate.lender is not None and gate.lender.failures == 1


class Engine:
    capacity_tokens = None

    def __init__(self, snapshot: EngineSnapshot | None, age_s: float):
        self.latest, self.age_s = snapshot, age_s

    def stale_s(self, now_s: float) -> float:
        return self.age_s


def snapshot(lent: int | None, decode_kv: int | None) -> EngineSnapshot:
    return EngineSnapshot(at_s=0.0, hit_rate=0.5, queue_requests=0, running_requests=0, kv_used_fraction=0.2,
                          decode_wait_requests=0, cache_capacity_tokens=50_000, found=(),
                          lent_cache_tokens=lent, decode_kv_tokens=decode_kv)


def test_the_lent_memory_an_engine_reports_reaches_the_policys_signals():
    lending = GatewayConfig(upstream=UPSTREAM, lending_url=LENDING)
    sig = Gate(Lender(), lending, Engine(snapshot(1_234, 9_000), 1.0)).signals(0.0)
    assert (sig.lent_cache_tokens, sig.decode_kv_tokens) == (1_234, 9_000)
    stale = Gate(Lender(), lending, Engine(snapshot(1_234, 9_000), 60.0)).signals(0.0)
    assert (stale.lent_cache_tokens, stale.decode_kv_tokens) == (0, 0)
    absent = Gate(Lender(), lending, Engine(snapshot(None, None), 1.0)).signals(0.0)
    assert (absent.lent_cache_tokens, absent.decode_kv_tokens) == (0, 0)
    # Without the setting, nothing changes: a gateway reports no lent or decode memory.
    plain = Gate(Lender(), GatewayConfig(upstream=UPSTREAM), Engine(snapshot(1_234, 9_000), 1.0)).signals(0.0)
    assert (plain.lent_cache_tokens, plain.decode_kv_tokens) == (0, 0)


def test_basin_keeps_its_lending_with_a_lending_url_and_not_without():
    policy = build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin", lending_url=LENDING))
    assert policy.params.lending is True and "decode-memory lending" in policy.needs.required()
    off = build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin", lending_url=LENDING,
                                     policy_params={"lending": False}))
    assert off.params.lending is False
    assert build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin-prior")).params.lending is False
    with pytest.raises(BasinInputError, match="decode-memory lending .*--lending-url"):
        build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin", policy_params={"lending": True}))
    # Continuum's TTL pins stay out of reach either way.
    with pytest.raises(BasinInputError, match="prefix-cache TTL pins"):
        build_policy(GatewayConfig(upstream=UPSTREAM, policy="continuum", lending_url=LENDING))
    gate = Gate(off, GatewayConfig(upstream=UPSTREAM, lending_url=LENDING))
    assert gate.set_params({"lending": True})["lending"] is True
    plain = Gate(build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin")), GatewayConfig(upstream=UPSTREAM))
    with pytest.raises(ValueError, match="lending_url"):
        plain.set_params({"lending": True})


def test_a_lending_url_must_be_an_http_url():
    with pytest.raises(BasinInputError, match="lending_url"):
        load_gateway_config(upstream=UPSTREAM, lending_url="ftp://127.0.0.1/emulator/lending")
    assert load_gateway_config(upstream=UPSTREAM, lending_url=LENDING + "/").lending_url == LENDING


def test_the_scrape_takes_decode_memory_from_the_decode_servers_first():
    def poller(snap: EngineSnapshot | None) -> SimpleNamespace:
        return SimpleNamespace(latest=snap)

    both = EngineMetrics([poller(snapshot(5, 50))], [poller(snapshot(1, 10)), poller(snapshot(2, 10))])
    merged = both.latest
    assert merged is not None and (merged.lent_cache_tokens, merged.decode_kv_tokens) == (3, 20)
    engine_only = EngineMetrics([poller(snapshot(5, 50))], [poller(snapshot(None, None))])
    merged = engine_only.latest
    assert merged is not None and (merged.lent_cache_tokens, merged.decode_kv_tokens) == (5, 50)
    none = EngineMetrics([poller(snapshot(None, None))], [])
    merged = none.latest
    assert merged is not None and merged.lent_cache_tokens is None and merged.decode_kv_tokens is None


def test_the_emulators_gauges_alone_are_not_an_engines_metrics():
    text = f"{EMULATOR_LENT_CACHE_TOKENS} 5\n{EMULATOR_DECODE_KV_TOKENS} 10\n"
    with pytest.raises(MetricsError, match="none of the expected series"):
        SGLangAdapter().parse_metrics(text, 0.0)
    plain = SGLangAdapter().parse_metrics('sglang:num_queue_reqs{dp_rank="0"} 2\n', 0.0)
    assert plain.lent_cache_tokens is None and plain.decode_kv_tokens is None


TASK = [{"role": "system", "content": "You are a coding agent. " * 60},
        {"role": "user", "content": "Make the flaky integration test deterministic. " * 40}]


def _basin_config(emu_url: str, cache_tokens: int, **overrides: object) -> GatewayConfig:
    """BASIN in front of the emulator, scraping fast and ticking every 0.1 s."""
    return GatewayConfig(upstream=emu_url, engine="sglang", listen_port=0, policy="basin", scrape_interval_s=0.05,
                         cache_tokens=cache_tokens, policy_params={"interval_s": 0.1, "busy_interval_s": 0.1},
                         **overrides)


async def _call(client: aiohttp.ClientSession, url: str, messages: list[dict]) -> dict:
    async with client.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 16},
                           headers={"X-Session-Id": "agent-1"}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _until(check, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


def test_basin_lends_decode_memory_through_the_emulator():
    """BASIN near its cliff (a 500-token cache, below one session's context) switches lending on; the
    emulator keeps the session's prompt lent, and the gateway's next scrape hands it to the policy."""
    async def go():
        async with emulator(speed=50.0) as (emu, client):
            cfg = _basin_config(emu.url, 500, metrics_urls=(emu.url + "/metrics/prefill",),
                                decode_metrics_urls=(emu.url + "/metrics/decode",),
                                lending_url=emu.url + "/emulator/lending")
            gateway = GatewayServer(cfg)
            await gateway.start()
            try:
                assert gateway.policy.params.lending is True
                first = await _call(client, gateway.url, TASK)
                await _until(lambda: emu.engine.lending_on)
                answer = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
                await _call(client, gateway.url, TASK + [answer, {"role": "user", "content": "ok " * 100}])
                assert emu.engine.lent_tokens > 0
                lent = emu.engine.lent_tokens
                gate = gateway.gate
                assert gate is not None and gate.lender is not None
                await _until(lambda: gate.signals(gateway.clock()).lent_cache_tokens == lent)
                sig = gate.signals(gateway.clock())
                assert sig.decode_kv_tokens == 3 * emu.engine.hardware.decode.kv_tokens
                assert gate.lender.confirmed == (True, 0.5) and gate.lender.failures == 0
                async with client.get(gateway.url + "/metrics") as r:
                    text = await r.text()
                assert "basin_gateway_lending_on 1.0" in text
            finally:
                await gateway.stop()
    asyncio.run(go())


def test_without_a_lending_url_the_emulator_is_never_switched():
    async def go():
        async with emulator(speed=50.0) as (emu, client):
            cfg = _basin_config(emu.url, 500)  # near the cliff: it would lend
            gateway = GatewayServer(cfg)
            await gateway.start()
            try:
                assert gateway.policy.params.lending is False and gateway.gate is not None
                assert gateway.gate.lender is None
                await _call(client, gateway.url, TASK)
                await asyncio.sleep(0.3)
                assert emu.engine.cluster.lent_tier is None
                assert gateway.gate.signals(gateway.clock()).lent_cache_tokens == 0
                async with client.get(gateway.url + "/metrics") as r:
                    assert "basin_gateway_lending" not in await r.text()
            finally:
                await gateway.stop()
    asyncio.run(go())


def test_a_dead_lending_url_leaves_the_gateway_serving():
    async def go():
        async with emulator(speed=50.0) as (emu, client):
            cfg = _basin_config(emu.url, 2_000, lending_url=LENDING)
            gateway = GatewayServer(cfg)
            await gateway.start()
            try:
                gate = gateway.gate
                assert gate is not None and gate.lender is not None
                await _call(client, gateway.url, TASK)
                await _until(lambda: gate.lender is not None and gate.lender.failures >= 2)
                assert gate.control_failures == 0 and gate.lender.confirmed is None
                await _call(client, gateway.url, [{"role": "user", "content": "another " * 50}])
                assert not math.isnan(gate.signals(gateway.clock()).stale_s)
            finally:
                await gateway.stop()
    asyncio.run(go())
