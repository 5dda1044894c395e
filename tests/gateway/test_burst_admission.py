"""Issue 41, findings 1-4: admission that holds under bursts, reservations that
learn from the engine, a control loop woken by what changes the answer and
validated durations, and times relative to the gateway's start."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.gateway.test_gate import CONFIG
from tests.gateway.test_proxy import TOKEN, _config, chat, run, stack
from tests.support.fake_upstream import FakeUpstream, FakeUpstreamConfig

from basin.errors import BasinInputError
from basin.gateway.config import GatewayConfig, load_gateway_config
from basin.gateway.gate import Gate, ShedError
from basin.gateway.server import GatewayServer
from basin.gateway.sessions import SessionState
from basin.gateway.usage import CallUsage
from basin.policy.basin import BasinParams, BasinPolicy
from basin.policy.params import PolicyParamError
from basin.predict.peak import GrowthPredictor

CHAT = "/v1/chat/completions"
CAPACITY = 10_000


def _gate(capacity: int = CAPACITY, **params: object) -> Gate:
    policy = BasinPolicy(BasinParams(lending=False, **params), predictor=GrowthPredictor(1.5))  # type: ignore[arg-type]
    return Gate(policy, CONFIG, capacity_tokens=capacity)


# --------------------------------------------------------------------------- finding 1: bursts
@pytest.mark.parametrize("spread_ms", [0, 200, 1000])
def test_fifty_first_calls_within_a_second_admit_what_fits(spread_ms: int) -> None:
    """The probe: 50 first calls of 1,000 tokens within 0 / 200 / 1,000 ms against a
    10,000-token cache (B0 = 10,000) admitted 50 / 26 / 9; now what fits, every time."""
    gate = _gate()
    gate.control_step(0.0)
    admitted = 0
    for i in range(50):
        now = 1.0 + i * spread_ms / 1000 / 50
        sess = gate.open_call(f"s{i}", now, 1_000, None, end=False)
        if gate.session_state(sess) is SessionState.ADMITTED:
            admitted += 1
    assert 1 <= admitted <= 10
    assert gate.driver.working_set_tokens <= CAPACITY  # counted at admission, before any call went upstream


bursts = st.lists(st.tuples(
    st.integers(1, 40),                                   # first calls in the burst
    st.floats(0.0, 0.05),                                 # seconds between them (0: simultaneous)
    st.lists(st.integers(50, 4_000), min_size=1, max_size=40),  # prompt sizes, cycled
    st.floats(0.0, 40.0),                                 # seconds to the next burst
    st.booleans(),                                        # the calls are forwarded at once, or after the burst
), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(bursts=bursts, answer=st.integers(0, 500))
def test_admission_holds_under_any_burst(bursts, answer: int) -> None:
    """Property: at every arrival, a session is admitted past the reference budget B0 only
    by the budget test (its reservation fits the budget, or no one is resident): the live
    working set never exceeds B0 by more than the one session that crossed it, unless the
    reservations admitted fit the adapted budget."""
    gate = _gate()
    policy = gate.policy
    assert isinstance(policy, BasinPolicy)
    now = 0.0
    gate.control_step(now)
    due = now + 5.0
    uid = 0
    for size, spacing, prompts, gap, at_once in bursts:
        pending = []
        for k in range(size):
            prompt = prompts[k % len(prompts)]
            if now >= due:  # the timed steps still happen at their cadence
                due = now + gate.control_step(now)
            before = gate.driver.working_set_tokens
            try:
                sess = gate.open_call(f"u{uid}", now, prompt, None, end=False)
            except ShedError:
                sess = None
            uid += 1
            if sess is not None and gate.session_state(sess) is SessionState.ADMITTED:
                b0 = policy.state.b0
                st_ = policy.state
                within = before < b0 or st_.residents == 1 or (st_.admit and st_.reserved <= st_.budget)
                assert within, (before, b0, st_.reserved, st_.budget)
                pending.append((sess, prompt))
                if at_once:
                    gate.forwarded(sess, prompt, now)
            now += spacing
        for sess, prompt in pending:
            if not at_once:
                gate.forwarded(sess, prompt, now)
            gate.done(sess, CallUsage(prompt, answer, 0), now + 0.5)
        now += 0.5 + gap


def test_a_burst_through_http_admits_what_fits() -> None:
    async def go():
        async with stack(FakeUpstreamConfig(first_token_delay_s=0.3), policy="basin", cache_tokens=CAPACITY,
                         predictor="growth:1.5", policy_params={"lending": False}) as (fake, server, client):
            await asyncio.sleep(0.1)
            text = "x" * 4_000  # about 1,000 tokens each
            calls = [asyncio.create_task(client.post(server.url + CHAT, json=chat(f"h{i}", text=text)))
                     for i in range(50)]
            await asyncio.sleep(1.0)
            admitted, parked = server.gate.counts["admitted"], len(server.gate.driver.parked)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            assert 1 <= admitted <= 11 and parked >= 39, (admitted, parked)
    run(go())


# --------------------------------------------------------------------------- finding 2: reservations
def test_the_engines_prompt_count_replaces_the_body_estimate() -> None:
    gate = _gate(capacity=10_000_000)
    gate.control_step(0.0)
    sess = gate.open_call("img", 1.0, 550_000, None, end=False)  # a 1.5 MB image read as bytes / 4
    policy = gate.policy
    uid = sess.uid
    assert policy.sessions[uid].reserve == pytest.approx(825_000)
    gate.forwarded(sess, 550_000, 1.0)
    gate.done(sess, CallUsage(123, 20, 0), 2.0)  # online_correction is off: the count is used anyway
    assert policy.sessions[uid].reserve == pytest.approx(184.5)
    assert policy.state.reserved == pytest.approx(184.5)
    assert policy.priority_key(uid) == pytest.approx(1.0 + 184.5 / 30.0)
    # Only the first count replaces it: a later call does not move the reservation.
    gate.forwarded(sess, 400, 3.0)
    gate.done(sess, CallUsage(400, 20, 100), 4.0)
    assert policy.sessions[uid].reserve == pytest.approx(184.5)


def test_a_refused_first_call_releases_its_reservation() -> None:
    gate = _gate(capacity=10_000_000)
    gate.control_step(0.0)
    sess = gate.open_call("refused", 1.0, 40_000, None, end=False)
    gate.forwarded(sess, 40_000, 1.0)
    gate.done(sess, None, 1.5, refused=True)
    assert gate.policy.state.reserved == 0.0 and gate.policy.sessions[sess.uid].reserve == 0.0
    gate.forwarded(sess, 900, 2.0)  # the retry the engine takes
    gate.done(sess, CallUsage(900, 10, 0), 2.5)
    assert gate.policy.state.reserved == pytest.approx(1_350.0)


def test_a_body_with_an_image_is_estimated_by_its_text() -> None:
    image = "data:image/png;base64," + base64.b64encode(b"\x89PNG" + bytes(1_100_000)).decode()
    body = {"model": "m", "session_id": "pic", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Describe this picture in one line."},
        {"type": "image_url", "image_url": {"url": image}}]}]}

    async def go():
        async with stack(FakeUpstreamConfig()) as (fake, server, client):
            seen = []
            open_call = server.gate.open_call

            def spy(sid, now, prompt, *a, **k):
                seen.append(prompt)
                return open_call(sid, now, prompt, *a, **k)
            server.gate.open_call = spy  # type: ignore[method-assign]
            async with client.post(server.url + CHAT, data=json.dumps(body)) as r:
                assert r.status == 200
            assert seen and seen[0] < 200, seen  # 1.5 MB of body, a line of text
    run(go())


# --------------------------------------------------------------------------- finding 3: the control loop
@pytest.mark.parametrize("field, value", [("interval_s", math.inf), ("busy_interval_s", 1e400),
                                          ("cooldown_s", 10 * 86_400.0), ("interval_s", math.nan),
                                          ("shed_horizon_s", math.inf)])
def test_durations_are_finite_and_in_range(field: str, value: float) -> None:
    with pytest.raises(PolicyParamError, match=field):
        BasinParams(**{field: value})


@pytest.mark.parametrize("field", ["idle_timeout_s", "scrape_interval_s", "keepalive_s", "upstream_timeout_s",
                                   "hit_window_s", "control_retry_s"])
def test_gateway_durations_are_finite(field: str) -> None:
    with pytest.raises(BasinInputError, match=field):
        load_gateway_config(None, upstream="http://127.0.0.1:9", **{field: math.inf})
    with pytest.raises(BasinInputError, match=field):
        load_gateway_config(None, upstream="http://127.0.0.1:9", **{field: 1e9})
    assert GatewayConfig(upstream="http://127.0.0.1:9")


def test_an_infinite_interval_is_refused_through_admin_params() -> None:
    async def go():
        async with stack(policy="basin", policy_params={"lending": False}) as (fake, server, client):
            headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
            async with client.post(server.url + "/admin/params", data=b'{"interval_s": 1e400}',
                                   headers=headers) as r:
                assert r.status == 400 and "interval_s" in (await r.json())["error"]["message"]
            assert server.policy.params.interval_s == 30.0
    run(go())


def test_a_parked_session_is_released_when_a_session_ends_not_at_the_next_tick() -> None:
    async def go():
        # Two sessions of about 510 tokens fill a 1,000-token budget; the third waits. Ending one frees room at once,
        # while BASIN's next timed step is 5 s (busy) away.
        async with stack(FakeUpstreamConfig(completion_tokens=4), policy="basin", cache_tokens=1_000,
                         predictor="growth:1.0", policy_params={"lending": False, "margin": 1.0,
                                                                "budget_high": 1.0}) as (fake, server, client):
            text = "y" * 2_000
            for sid in ("a", "b"):
                async with client.post(server.url + CHAT, json=chat(sid, text=text)) as r:
                    assert r.status == 200
            server.request_tick()
            await asyncio.sleep(0.2)
            held = asyncio.create_task(client.post(server.url + CHAT, json=chat("c", text=text)))
            for _ in range(50):
                await asyncio.sleep(0.02)
                sess = server.gate.table.get("c")
                if sess is not None:
                    break
            assert sess is not None and server.gate.session_state(sess) is SessionState.PARKED
            ended = time.perf_counter()
            async with client.post(server.url + CHAT, json=chat("a", text=text + "z"),
                                   headers={"X-Session-End": "true"}) as r:
                assert r.status == 200
            async with client.post(server.url + CHAT, json=chat("b", text=text + "z"),
                                   headers={"X-Session-End": "true"}) as r:
                assert r.status == 200
            r = await asyncio.wait_for(held, 3.0)
            waited = time.perf_counter() - ended
            assert r.status == 200 and waited < 2.0, waited
            r.release()
    run(go())


def test_healthz_is_unhealthy_when_the_loop_has_not_stepped() -> None:
    async def go():
        async with stack() as (fake, server, client):
            async with client.get(server.url + "/healthz") as r:
                assert r.status == 200
            loop_task = server._tasks[1]
            loop_task.cancel()  # a control loop that stopped stepping
            await asyncio.gather(loop_task, return_exceptions=True)
            server.gate.next_step_s = server.clock() - 60.0
            async with client.get(server.url + "/healthz") as r:
                body = await r.json()
                assert r.status == 503 and "control loop" in body["reason"]
    run(go())


# --------------------------------------------------------------------------- finding 4: the gateway's time
def test_policy_times_count_from_the_gateways_start_not_the_machines_boot() -> None:
    async def go():
        fake = FakeUpstream()
        upstream = await fake.start()
        booted = time.monotonic() - 5 * 86_400.0  # a machine up for five days
        server = GatewayServer(_config(upstream), clock=lambda: time.monotonic() - booted)
        await server.start()
        try:
            async with aiohttp.ClientSession() as client:
                for i in range(6):
                    async with client.post(server.url + CHAT, json=chat(f"t{i}")) as r:
                        assert r.status == 200
            now = server.clock()
            assert now < 60.0
            # Six arrivals in the gateway's first seconds: at least six a minute, not 6 / 15.
            assert server.gate.driver.arrival_rate_per_min(now) >= 6.0
        finally:
            await server.stop()
            await fake.stop()
    run(go())
