"""Cheap requests cannot freeze the gateway, and slow or idle clients cannot
hold it (issue 14, items 2 and 7, and the minor input items): body caps before
and after decompression, large and compressed bodies parsed off the event
loop, size caps on engine /metrics and buffered answers, client timeouts, a
connection limit, and JSON errors with no echo of the client's bytes."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from tests.gateway.test_proxy import QueuePolicy, _config, chat, run, stack
from tests.support.fake_upstream import FakeUpstream, FakeUpstreamConfig

from basin.gateway import body as bodies
from basin.gateway.server import GatewayServer

CHAT = "/v1/chat/completions"


@asynccontextmanager
async def quiet_stack(fake_cfg: FakeUpstreamConfig | None = None,
                      **cfg) -> AsyncIterator[tuple[FakeUpstream, GatewayServer, aiohttp.ClientSession]]:
    """Like ``stack``, with a fake that keeps no record (so it never parses what it receives)."""
    fake = FakeUpstream(fake_cfg or FakeUpstreamConfig(), record=False)
    server = GatewayServer(_config(await fake.start(), **cfg))
    await server.start()
    client = aiohttp.ClientSession()
    try:
        yield fake, server, client
    finally:
        await client.close()
        await server.stop()
        await fake.stop()


# --------------------------------------------------------------------------- the body functions
def test_a_gzip_bomb_is_refused_once_it_passes_the_limit() -> None:
    bomb = gzip.compress(b'{"a":"' + b" " * (64 * 1024 * 1024) + b'"}')
    assert len(bomb) < 100_000
    started = time.perf_counter()
    with pytest.raises(bodies.BadBody) as err:
        bodies.decode(bomb, "gzip", 1024 * 1024)
    assert err.value.status == 413 and time.perf_counter() - started < 0.5  # stopped at 1 MiB, not 64
    assert bodies.decode(zlib.compress(b'{"x":1}'), "deflate", 100) == b'{"x":1}'


@pytest.mark.parametrize("raw, encoding, status, kind", [
    (b"not gzip at all", "gzip", 400, "invalid_encoding"),
    (gzip.compress(b'{"x": 1}')[:-12], "gzip", 400, "invalid_encoding"),
    (b"{}", "br", 415, "unsupported_encoding"),
])
def test_bad_encodings_are_named(raw, encoding, status, kind) -> None:
    with pytest.raises(bodies.BadBody) as err:
        bodies.decode(raw, encoding, 1024)
    assert (err.value.status, err.value.kind) == (status, kind)


@pytest.mark.parametrize("raw, says", [
    (b"[" * 100_000 + b"]" * 100_000, "nests JSON too deeply"),
    (b'{"x": NaN}', "NaN is not a JSON value"),
    (b'{"x": -Infinity}', "-Infinity is not a JSON value"),
    ("{\"x\": \"\u00e9\"}".encode("latin-1"), "not UTF-8"),
    (b'"a string"', "must be a JSON object"),
])
def test_bodies_json_cannot_read_are_a_400_that_says_why(raw, says) -> None:
    with pytest.raises(bodies.BadBody, match=says) as err:
        bodies.parse(raw)
    assert err.value.status == 400


def test_the_forwarded_body_is_the_clients_bytes_with_the_gateways_fields_spliced_in() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}  \n'
    plain, facts = bodies.inspect(raw, None, 1 << 20, ("stream", "priority", "session_end"))
    out = bodies.rewrite(plain, facts, ("session_end", "priority"), {"stream_options": {"include_usage": True}})
    assert out.startswith(raw.rstrip()[:-1]) and json.loads(out)["stream_options"] == {"include_usage": True}
    assert bodies.rewrite(b"{ }", bodies.inspect(b"{ }", None, 10, ())[1], (), {"a": 1}) == b'{"a":1}'
    # A field the gateway owns is dropped or replaced, which takes a rewrite.
    raw = b'{"messages": [], "priority": -999999, "session_end": true}'
    _, facts = bodies.inspect(raw, None, 1 << 20, ("priority", "session_end"))
    assert bodies.needs_rewrite(facts, ("session_end", "priority"), {})
    assert json.loads(bodies.rewrite(raw, facts, ("session_end", "priority"), {})) == {"messages": []}
    assert json.loads(bodies.rewrite(raw, facts, ("session_end", "priority"), {"priority": 3})) == {
        "messages": [], "priority": 3}


# --------------------------------------------------------------------------- over HTTP
async def _healthz_latencies(client: aiohttp.ClientSession, url: str, until: asyncio.Future) -> list[float]:
    out = []
    while not until.done():
        started = time.perf_counter()
        async with client.get(url + "/healthz") as r:
            await r.read()
        out.append(time.perf_counter() - started)
        await asyncio.sleep(0.01)
    return out


def test_large_and_compressed_bodies_do_not_stall_other_clients() -> None:
    messages = [{"role": "user", "content": "x"}] * 230_000  # about 7 MiB of small JSON objects
    plain = json.dumps({"model": "m", "messages": messages}).encode()
    packed = gzip.compress(plain)
    bomb = gzip.compress(b'{"a":"' + b" " * (64 * 1024 * 1024) + b'"}')

    async def go():
        # The fake refuses what it is sent unread, so only the gateway's own work is measured.
        async with quiet_stack(FakeUpstreamConfig(refuse_body_bytes=1024)) as (fake, server, client):
            async def post(data: bytes, encoding: str = "gzip") -> int:
                headers = {"Content-Encoding": encoding, "Content-Type": "application/json", "X-Session-Id": "big"}
                async with client.post(server.url + CHAT, data=data, headers=headers) as r:
                    error = (await r.json())["error"]
                    # 400s come from the engine (its refusal names the context), 413s from the gateway.
                    assert ("longer than the context" in error["message"]) == (r.status == 400), error
                    return r.status

            async with client.post(server.url + CHAT, data=gzip.compress(b"{}"),
                                   headers={"Content-Encoding": "gzip"}) as r:  # the worker starts on first use
                assert r.status == 400

            calls = asyncio.gather(*(post(d) for d in [packed] * 4 + [bomb] * 4), post(plain, "identity"))
            latencies = await _healthz_latencies(client, server.url, calls)
            statuses = await calls
            return statuses, latencies

    statuses, latencies = run(go())
    # The 7 MiB bodies reached the engine (which refused them unread, 400); the bombs stopped at 8 MiB (413).
    assert statuses == [400] * 4 + [413] * 4 + [400]
    assert max(latencies) < 0.3, f"/healthz waited {max(latencies):.3f} s behind the large bodies"


def test_gzip_bodies_are_inflated_and_forwarded_as_plain_json() -> None:
    async def go():
        async with stack() as (fake, server, client):
            data = gzip.compress(json.dumps(chat("gz", text="compressed")).encode())
            async with client.post(server.url + CHAT, data=data, headers={"Content-Encoding": "gzip"}) as r:
                assert r.status == 200
            forwarded = fake.requests[-1]
            assert forwarded["body"]["messages"][0]["content"] == "compressed"
            assert "Content-Encoding" not in forwarded["headers"]
            async with client.post(server.url + CHAT, data=b"plain text", headers={"Content-Encoding": "gzip"}) as r:
                assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_encoding"
    run(go())


@pytest.mark.parametrize("data, kind", [
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid_json"),
    (b'{"messages": [], "temperature": NaN}', "invalid_json"),
])
def test_json_the_gateway_cannot_read_is_a_400_not_a_500(data, kind) -> None:
    async def go():
        async with stack() as (fake, server, client):
            async with client.post(server.url + CHAT, data=data) as r:
                assert r.status == 400 and r.content_type == "application/json"
                assert (await r.json())["error"]["type"] == kind
    run(go())


def test_stream_null_means_not_streamed() -> None:
    async def go():
        async with stack() as (fake, server, client):
            async with client.post(server.url + CHAT, json=chat("n", stream=None)) as r:
                assert r.status == 200 and r.content_type == "application/json"
    run(go())


def test_huge_engine_metrics_are_refused_and_large_ones_read_off_the_loop() -> None:
    async def go():
        fake_cfg = FakeUpstreamConfig(metrics_padding_bytes=3 * 1024 * 1024)
        async with quiet_stack(fake_cfg, max_metrics_bytes=2 * 1024 * 1024) as (fake, server, client):
            poller = server.poller.engine_pollers[0]
            assert await poller.scrape_once() is None
            assert "max_metrics_bytes" in poller.last_error
            poller.max_bytes = 4 * 1024 * 1024
            snap = await poller.scrape_once()
            assert snap is not None and "llamacpp:prompt_tokens_total" in snap.found
    run(go())


def test_an_answer_too_large_to_buffer_is_a_502_naming_the_limit() -> None:
    async def go():
        fake_cfg = FakeUpstreamConfig(answer_padding_bytes=600_000)
        async with quiet_stack(fake_cfg, max_upstream_body_bytes=500_000) as (fake, server, client):
            async with client.post(server.url + CHAT, json=chat("a")) as r:
                assert r.status == 502 and "max_upstream_body_bytes" in (await r.json())["error"]["message"]
            assert server.gate.table.get("a").in_flight == 0
    run(go())


def test_a_silent_upstream_is_a_504_not_cannot_reach() -> None:
    async def go():
        async with stack(FakeUpstreamConfig(first_token_delay_s=2.0), upstream_timeout_s=0.2) as (fake, server,
                                                                                                 client):
            async with client.post(server.url + CHAT, json=chat("slow")) as r:
                assert r.status == 504 and (await r.json())["error"]["type"] == "upstream_timeout"
    run(go())


def test_a_client_leaving_mid_stream_is_counted() -> None:
    async def go():
        async with stack(FakeUpstreamConfig(token_delay_s=0.05, completion_tokens=40)) as (fake, server, client):
            resp = await client.post(server.url + CHAT, json=chat("gone", stream=True))
            await resp.content.readuntil(b"\n\n")
            resp.close()
            for _ in range(100):
                await asyncio.sleep(0.02)
                if server.gate.table.get("gone").in_flight == 0:
                    break
            async with client.get(server.url + "/metrics") as r:
                text = await r.text()
            assert 'basin_gateway_calls_total{outcome="client_gone"} 1.0' in text
    run(go())


# --------------------------------------------------------------------------- connections
async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    return await asyncio.wait_for(reader.read(), seconds)


def test_idle_and_slow_header_connections_are_closed() -> None:
    async def go():
        async with stack(client_idle_timeout_s=0.3) as (fake, server, client):
            host, port = server.url.removeprefix("http://").split(":")
            idle_r, idle_w = await asyncio.open_connection(host, int(port))
            drip_r, drip_w = await asyncio.open_connection(host, int(port))
            drip = asyncio.create_task(_drip(drip_w, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: " +
                                             b"a" * 100))
            started = time.perf_counter()
            assert await _closed_within(idle_r, 2.0) == b""
            assert await _closed_within(drip_r, 2.0) == b""
            assert time.perf_counter() - started < 1.5
            drip.cancel()
            idle_w.close()
            drip_w.close()
            assert server.guard.events["idle_closed"] >= 2
    run(go())


async def _drip(writer: asyncio.StreamWriter, data: bytes) -> None:
    for i in range(len(data)):
        writer.write(data[i:i + 1])
        await asyncio.sleep(0.05)


def test_a_body_that_trickles_gets_a_408() -> None:
    async def go():
        async with stack(client_body_timeout_s=0.3) as (fake, server, client):
            host, port = server.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"messages\"")
            answer = await asyncio.wait_for(reader.read(), 2.0)
            writer.close()
            head, _, payload = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408") and json.loads(payload)["error"]["type"] == "body_timeout"
    run(go())


def test_connections_past_the_limit_get_a_503_and_a_log_line(caplog) -> None:
    async def go():
        async with stack(max_connections=2) as (fake, server, client):
            host, port = server.url.removeprefix("http://").split(":")
            held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
            await asyncio.sleep(0.05)
            async with aiohttp.ClientSession() as fresh:
                async with fresh.post(server.url + CHAT, json=chat("x")) as r:
                    assert r.status == 503 and r.headers["Retry-After"] == "1"
                    assert (await r.json())["error"]["type"] == "too_many_connections"
            for _, writer in held:
                writer.close()
            await asyncio.sleep(0.05)
            async with aiohttp.ClientSession() as fresh:  # once others leave, calls are served again
                async with fresh.post(server.url + CHAT, json=chat("x")) as r:
                    assert r.status == 200
            async with client.get(server.url + "/metrics") as r:
                assert 'basin_gateway_calls_total{outcome="too_many_connections"} 1.0' in await r.text()
    with caplog.at_level(logging.WARNING, logger="basin.gateway"):
        run(go())
    assert any("connection limit reached" in r.getMessage() for r in caplog.records)


def test_malformed_http_gets_a_json_400_that_does_not_echo_it() -> None:
    async def go():
        async with stack() as (fake, server, client):
            host, port = server.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header<script>: 1\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 2.0)
            writer.close()
            head, _, payload = answer.partition(b"\r\n\r\n")
            assert head.split()[1] == b"400" and b"application/json" in head
            assert json.loads(payload)["error"]["type"] == "bad_request" and b"script" not in payload
    run(go())


def test_parked_calls_do_not_count_as_idle_connections() -> None:
    async def go():
        policy = QueuePolicy()
        async with stack(policy_obj=policy, client_idle_timeout_s=0.2) as (fake, server, client):
            task = asyncio.create_task(client.post(server.url + CHAT, json=chat("wait")))
            await asyncio.sleep(0.5)
            policy.release_per_tick = 1
            server.gate.tick(server.clock())
            resp = await asyncio.wait_for(task, 2)
            assert resp.status == 200
            resp.release()
    run(go())


# --------------------------------------------------------------------------- what outsiders and operators see
def test_healthz_names_no_upstream_and_unknown_capacity_is_nan_not_2_to_the_60() -> None:
    async def go():
        async with stack(engine="openai", metrics_urls=[]) as (fake, server, client):
            async with client.get(server.url + "/healthz") as r:
                health = await r.json()
            assert health == {"status": "ok", "policy": "hicache"}
            server.gate.tick(server.clock())
            async with client.get(server.url + "/metrics") as r:
                text = await r.text()
            assert 'basin_gateway_signal_gpu_cache_tokens NaN' in text
    run(go())


def test_listening_beyond_loopback_without_binding_or_token_warns() -> None:
    async def go():
        fake = FakeUpstream()
        server = GatewayServer(_config(await fake.start(), listen_host="0.0.0.0", admin_token=None))
        await server.start()
        try:
            assert any("session_binding" in w for w in server.warnings)
            assert any("admin_token" in w for w in server.warnings)
        finally:
            await server.stop()
            await fake.stop()
        quiet = GatewayServer(_config("http://127.0.0.1:9"))
        await quiet.start()
        await quiet.stop()
        assert not any("session_binding" in w for w in quiet.warnings)
    run(go())
