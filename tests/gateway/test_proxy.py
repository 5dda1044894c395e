"""The gateway in front of a fake upstream: the request path end to end,
including every fault a client or an upstream can cause."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from tests.support.fake_upstream import FakeUpstream, FakeUpstreamConfig
from tests.support.local_app import start_app

from basin.gateway.config import GatewayConfig
from basin.gateway.server import GatewayServer
from basin.gateway.sessions import SessionState
from basin.policy.base import Admission, ControlDecision, Policy

TOKEN = "test-admin-token-0123456789"


class QueuePolicy(Policy):
    """Admits the first ``admit_first`` sessions, sheds named ones, parks the
    rest and releases ``release_per_tick`` of them per tick, smallest first
    prompt first."""

    name = "queue"

    def __init__(self, admit_first: int = 0, shed: tuple[str, ...] = (), release_per_tick: int = 0):
        super().__init__()
        self.admit_first, self.shed, self.release_per_tick = admit_first, shed, release_per_tick
        self.prio: dict[int, float] = {}
        self.admitted = 0

    def on_session_arrival(self, info, signals):
        self.prio[info.uid] = float(info.first_prompt_tokens)
        if info.session_id in self.shed:
            return Admission.SHED
        if self.admitted < self.admit_first:
            self.admitted += 1
            return Admission.ADMIT
        return Admission.PARK

    def control(self, signals, parked):
        ordered = sorted(parked, key=lambda u: self.prio[u])
        release = tuple(ordered[: self.release_per_tick])
        return ControlDecision(release=release, order_by_priority=True, next_tick_s=3600.0)

    def priority_key(self, uid):
        return self.prio.get(uid)


def _config(upstream: str, **kw) -> GatewayConfig:
    base = dict(upstream=upstream, engine="llamacpp", listen_port=0, policy="hicache", scrape_interval_s=0.2,
                keepalive_s=0.1, admin_token=TOKEN)
    base.update(kw)
    return GatewayConfig(**base)


@asynccontextmanager
async def stack(fake_cfg: FakeUpstreamConfig | None = None, policy_obj: Policy | None = None,
                **cfg) -> AsyncIterator[tuple[FakeUpstream, GatewayServer, aiohttp.ClientSession]]:
    fake = FakeUpstream(fake_cfg or FakeUpstreamConfig())
    upstream = await fake.start()
    server = GatewayServer(_config(upstream, **cfg), policy=policy_obj)
    await server.start()
    client = aiohttp.ClientSession()
    try:
        yield fake, server, client
    finally:
        await client.close()
        await server.stop()
        await fake.stop()


def chat(session: str | None, text: str = "hello there", stream: bool = False, **extra) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream, **extra}
    if session is not None:
        body["session_id"] = session
    return body


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- passing through
def test_non_streamed_call_passes_and_context_follows_usage():
    async def go():
        async with stack(engine="vllm") as (fake, server, client):
            async with client.post(server.url + "/v1/chat/completions", json=chat("s1", session_end=False)) as r:
                assert r.status == 200
                data = await r.json()
            assert data["usage"]["prompt_tokens"] > 0
            forwarded = fake.requests[-1]["body"]
            assert forwarded["session_id"] == "s1" and "session_end" not in forwarded
            sess = server.gate.table.get("s1")
            assert sess.context_tokens == data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"]
            assert sess.in_flight == 0 and sess.unanswered_prompt_tokens == 0
    run(go())


def test_streamed_call_is_relayed_with_usage_and_session_ends_on_marker():
    async def go():
        async with stack(FakeUpstreamConfig(completion_tokens=8)) as (fake, server, client):
            headers = {"X-Session-Id": "st", "X-Session-End": "true"}
            async with client.post(server.url + "/v1/chat/completions", json=chat(None, stream=True),
                                   headers=headers) as r:
                assert r.status == 200 and r.content_type == "text/event-stream"
                raw = await r.read()
            events = [e for e in raw.decode().split("\n\n") if e.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 8
            assert fake.requests[-1]["body"]["stream_options"] == {"include_usage": True}
            assert server.gate.table.get("st") is None and server.gate.counts["finished"] == 1
    run(go())


def test_models_passthrough_and_health():
    async def go():
        async with stack() as (fake, server, client):
            async with client.get(server.url + "/v1/models") as r:
                assert r.status == 200 and "data" in await r.json()
            async with client.get(server.url + "/healthz") as r:
                assert (await r.json())["status"] == "ok"
    run(go())


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("body, headers, status, kind", [
    (b"{not json", {}, 400, "invalid_json"),
    (b"", {}, 400, "missing_body"),
    (b"[1, 2]", {}, 400, "invalid_json"),
    (json.dumps({"messages": "hi", "session_id": "a"}).encode(), {}, 400, "invalid_field"),
    (json.dumps(chat("bad\r\nX-Injected: 1")).encode(), {}, 400, "invalid_session_id"),
    (json.dumps(chat("a" * 300)).encode(), {}, 400, "invalid_session_id"),
    (json.dumps(chat("a")).encode(), {"X-Session-End": "perhaps"}, 400, "invalid_session_marker"),
    (json.dumps(chat("a", session_end="yes")).encode(), {}, 400, "invalid_session_marker"),
    (json.dumps(chat("a", stream="yes")).encode(), {}, 400, "invalid_field"),
    (json.dumps(chat("a", text="x" * 5000)).encode(), {}, 413, "body_too_large"),
])
def test_bad_calls_get_a_clear_4xx(body, headers, status, kind):
    async def go():
        async with stack(max_body_bytes=4096) as (fake, server, client):
            async with client.post(server.url + "/v1/chat/completions", data=body,
                                   headers={"Content-Type": "application/json", **headers}) as r:
                assert r.status == status
                err = (await r.json())["error"]
                assert err["type"] == kind and err["message"]
            assert not fake.requests or all(req["path"] != "/v1/chat/completions" for req in fake.requests)
    run(go())


def test_unknown_path_is_404_and_no_client_chosen_target():
    async def go():
        async with stack() as (fake, server, client):
            async with client.post(server.url + "/v1/embeddings", json={}) as r:
                assert r.status == 404 and "not served" in (await r.json())["error"]["message"]
            async with client.get(server.url + "/http://evil.example/v1/models") as r:
                assert r.status == 404
    run(go())


# --------------------------------------------------------------------------- upstream faults
def test_upstream_down_is_a_502_and_only_the_operator_sees_the_cause():
    async def go():
        server = GatewayServer(_config("http://127.0.0.1:9"))
        await server.start()
        try:
            async with aiohttp.ClientSession() as client:
                async with client.post(server.url + "/v1/chat/completions", json=chat("d")) as r:
                    assert r.status == 502
                    err = (await r.json())["error"]
                    assert err["type"] == "upstream_unavailable"
                    assert "127.0.0.1:9" not in err["message"] and "Error" not in err["message"]
                async with client.get(server.url + "/admin/state",
                                      headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                    assert "127.0.0.1:9" in (await r.json())["engine"]["last_call_error"]
            sess = server.gate.table.get("d")
            assert sess.in_flight == 0 and sess.unanswered_prompt_tokens == 0
        finally:
            await server.stop()
    run(go())


def test_upstream_dying_mid_stream_sends_an_error_event_and_keeps_state_consistent():
    async def go():
        async with stack(FakeUpstreamConfig(fail_mode="die_mid_stream")) as (fake, server, client):
            async with client.post(server.url + "/v1/chat/completions", json=chat("m", stream=True)) as r:
                assert r.status == 200
                raw = b""
                try:
                    async for chunk in r.content.iter_any():
                        raw += chunk
                except aiohttp.ClientPayloadError:
                    pass
            assert b"event: error" in raw and b"upstream_failed" in raw
            sess = server.gate.table.get("m")
            assert server.gate.session_state(sess) is SessionState.ADMITTED and sess.in_flight == 0
            assert server.gate.table.unanswered_prompt_tokens() == 0
    run(go())


def test_upstream_backpressure_is_passed_through():
    async def go():
        async with stack(FakeUpstreamConfig(fail_mode="status:503")) as (fake, server, client):
            async with client.post(server.url + "/v1/chat/completions", json=chat("b")) as r:
                assert r.status == 503
    run(go())


# --------------------------------------------------------------------------- parking, release, shedding
def test_parked_calls_wait_and_are_released_in_priority_order():
    async def go():
        policy = QueuePolicy(admit_first=1)
        async with stack(policy_obj=policy) as (fake, server, client):
            url = server.url + "/v1/chat/completions"
            async with client.post(url, json=chat("first")) as r:
                assert r.status == 200
            sizes = {"large": 3000, "small": 200, "medium": 1000}
            tasks = {sid: asyncio.create_task(client.post(url, json=chat(sid, text="w " * n)))
                     for sid, n in sizes.items()}
            await asyncio.sleep(0.3)
            assert all(not t.done() for t in tasks.values())
            assert server.gate.state()["sessions"]["parked"] == 3
            policy.release_per_tick = 1
            order = []
            for _ in range(3):
                server.gate.tick(server.clock())
                done, _ = await asyncio.wait(tasks.values(), timeout=5, return_when=asyncio.FIRST_COMPLETED)
                for sid, task in list(tasks.items()):
                    if task in done:
                        order.append(sid)
                        resp = task.result()
                        assert resp.status == 200
                        resp.release()
                        del tasks[sid]
            assert order == ["small", "medium", "large"]
            forwarded = [req["body"]["session_id"] for req in fake.requests if req["path"].endswith("completions")]
            assert forwarded == ["first", "small", "medium", "large"]
    run(go())


def test_parked_stream_gets_keepalives_then_the_answer():
    async def go():
        policy = QueuePolicy()
        async with stack(policy_obj=policy) as (fake, server, client):
            resp = await client.post(server.url + "/v1/chat/completions", json=chat("p", stream=True))
            assert resp.status == 200
            first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 2)
            assert first.startswith(b": waiting for admission")
            policy.release_per_tick = 1
            server.gate.tick(server.clock())
            rest = await resp.read()
            assert rest.rstrip().endswith(b"data: [DONE]")
    run(go())


def test_shed_sessions_get_503_with_retry_after_and_a_reason():
    async def go():
        async with stack(policy_obj=QueuePolicy(admit_first=5, shed=("x",)), retry_after_s=42) as (fake, server,
                                                                                                   client):
            async with client.post(server.url + "/v1/chat/completions", json=chat("x")) as r:
                assert r.status == 503 and r.headers["Retry-After"] == "42"
                err = (await r.json())["error"]
                assert err["type"] == "session_shed" and err["reason"] == "policy"
    run(go())


def test_client_leaving_while_parked_frees_the_queue():
    async def go():
        policy = QueuePolicy()
        async with stack(policy_obj=policy) as (fake, server, client):
            task = asyncio.create_task(client.post(server.url + "/v1/chat/completions", json=chat("gone")))
            await asyncio.sleep(0.3)
            assert server.gate.state()["sessions"]["parked"] == 1
            task.cancel()
            for _ in range(50):
                await asyncio.sleep(0.05)
                if server.gate.counts["abandoned"]:
                    break
            assert server.gate.counts["abandoned"] == 1 and server.gate.table.get("gone") is None
    run(go())


def test_many_concurrent_sessions_each_call_answered_once():
    async def go():
        policy = QueuePolicy(admit_first=10)
        async with stack(FakeUpstreamConfig(token_delay_s=0.001), policy_obj=policy) as (fake, server, client):
            url = server.url + "/v1/chat/completions"

            async def session(i: int) -> list[int]:
                statuses = []
                for turn in range(3):
                    async with client.post(url, json=chat(f"c{i}", text=f"turn {turn} " * (i + 1),
                                                          stream=bool(i % 2), session_end=turn == 2)) as r:
                        await r.read()
                        statuses.append(r.status)
                return statuses

            tasks = [asyncio.create_task(session(i)) for i in range(60)]
            policy.release_per_tick = 7
            while not all(t.done() for t in tasks):
                server.gate.tick(server.clock())
                await asyncio.sleep(0.05)
            assert all(t.result() == [200, 200, 200] for t in tasks)
            calls = [req["body"]["session_id"] for req in fake.requests if req["path"].endswith("completions")]
            assert sorted(calls) == sorted(f"c{i}" for i in range(60) for _ in range(3))
            gate = server.gate
            assert not gate.table.sessions and not gate.waiters
            assert gate.counts["admitted"] == 60 and gate.counts["finished"] == 60
    run(go())


# --------------------------------------------------------------------------- priority per engine
@pytest.mark.parametrize("engine, field, header", [
    ("vllm", 7, None), ("sglang", -7, "X-SMG-Routing-Key"), ("llamacpp", None, None)])
def test_priority_and_affinity_in_each_engines_own_fields(engine, field, header):
    async def go():
        policy = QueuePolicy(admit_first=5)
        async with stack(FakeUpstreamConfig(engine=engine if engine != "llamacpp" else "llamacpp"),
                         policy_obj=policy, engine=engine) as (fake, server, client):
            server.gate.tick(server.clock())  # ordering on
            async with client.post(server.url + "/v1/chat/completions", json=chat("pri")) as r:
                assert r.status == 200
            sess = server.gate.table.get("pri")
            policy.prio[sess.uid] = server.gate.origin_s + 7.2
            async with client.post(server.url + "/v1/chat/completions", json=chat("pri")) as r:
                assert r.status == 200
            req = fake.requests[-1]
            assert req["body"].get("priority") == field
            if header:
                assert req["headers"].get(header) == "pri"
    run(go())


# --------------------------------------------------------------------------- metrics and admin
def test_gateway_metrics_and_admin_api():
    async def go():
        async with stack(policy_obj=QueuePolicy(admit_first=1)) as (fake, server, client):
            url = server.url
            async with client.post(url + "/v1/chat/completions", json=chat("m1")) as r:
                assert r.status == 200
            server.gate.tick(server.clock())
            async with client.get(url + "/metrics") as r:
                text = await r.text()
            for name in ("basin_gateway_sessions{state=\"admitted\"} 1.0", "basin_gateway_added_latency_seconds_count",
                         "basin_gateway_working_set_tokens", "basin_gateway_signal_hit_ratio",
                         "basin_gateway_budget_tokens", "basin_gateway_session_outcomes_total"):
                assert name in text, name
            async with client.get(url + "/admin/state") as r:
                assert r.status == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with client.get(url + "/admin/state", headers=auth) as r:
                state = await r.json()
                assert state["sessions"]["admitted"] == 1 and state["engine"]["name"] == "llamacpp"
            async with client.post(url + "/admin/params", json={"x": 1}, headers=auth) as r:
                assert r.status == 400 and "parameter 'x': unknown" in (await r.json())["error"]["message"]
            async with client.post(url + "/admin/drain", headers=auth) as r:
                assert r.status == 200
            async with client.post(url + "/v1/chat/completions", json=chat("late")) as r:
                assert r.status == 503 and (await r.json())["error"]["reason"] == "draining"
            async with client.post(url + "/v1/chat/completions", json=chat("m1")) as r:
                assert r.status == 200
    run(go())


def test_admin_api_is_off_without_a_token():
    async def go():
        async with stack(admin_token=None) as (fake, server, client):
            async with client.get(server.url + "/admin/state") as r:
                assert r.status == 403 and "admin_token" in (await r.json())["error"]["message"]
    run(go())


def test_basin_params_change_at_run_time():
    async def go():
        async with stack(policy="basin") as (fake, server, client):
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with client.post(server.url + "/admin/params", json={"budget_high": 3.0}, headers=auth) as r:
                assert r.status == 200 and (await r.json())["params"]["budget_high"] == 3.0
            assert server.policy.params.lending is False  # engine-side mechanism off at a gateway
            async with client.post(server.url + "/admin/params", json={"budget_high": "lots"}, headers=auth) as r:
                assert r.status == 400
    run(go())


def test_vllm_refusing_priority_makes_the_gateway_drop_the_field_and_retry():
    from aiohttp import web

    seen: list[dict] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if "priority" in body:
            return web.json_response({"error": {"message": "priority scheduling is not enabled"}}, status=400)
        return web.json_response({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}})

    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", completions)
        runner, upstream = await start_app(app)
        policy = QueuePolicy(admit_first=5)
        server = GatewayServer(_config(upstream, engine="vllm", scrape_interval_s=60.0), policy=policy)
        await server.start()
        try:
            server.gate.tick(server.clock())
            async with aiohttp.ClientSession() as client:
                for _ in range(2):
                    async with client.post(server.url + "/v1/chat/completions", json=chat("v")) as r:
                        assert r.status == 200
            assert ["priority" in b for b in seen] == [True, False, False]
            assert server.adapter.priority_enabled is False
        finally:
            await server.stop()
            await runner.cleanup()
    run(go())
