"""Issue 41, findings 5 and 6: bodies and engine answers that made the gateway
answer 500, and relay defects (an encoded answer, usage far from a stream's
end, a client hanging up mid-stream)."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging

import aiohttp
from aiohttp import web
from tests.gateway.test_proxy import _config, chat, run, stack
from tests.support.fake_upstream import FakeUpstreamConfig
from tests.support.local_app import start_app

from basin.gateway import body as bodies
from basin.gateway.server import GatewayServer
from basin.gateway.usage import CallUsage, usage_from_body

CHAT = "/v1/chat/completions"
USAGE = {"prompt_tokens": 321, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 300}}


def _count(text: str, outcome: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'basin_gateway_calls_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


# --------------------------------------------------------------------------- finding 5: the two 500s
def test_a_lone_surrogate_in_a_body_the_gateway_rewrites_is_forwarded() -> None:
    raw = b'{"model":"m","priority":3,"session_id":"sur","messages":[{"role":"user","content":"a\\ud800b"}]}'
    _, facts = bodies.inspect(raw, None, 1 << 20, ("session_id", "priority"))
    out = bodies.rewrite(raw, facts, ("priority",), {"x": 1})
    assert json.loads(out)["messages"][0]["content"] == "a\ud800b" and "priority" not in json.loads(out)

    async def go():
        async with stack() as (fake, server, client):
            async with client.post(server.url + CHAT, data=raw, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, await r.text()
            forwarded = fake.requests[-1]["body"]
            assert "priority" not in forwarded and forwarded["messages"][0]["content"] == "a\ud800b"
    run(go())


def test_a_lone_surrogate_in_the_task_text_is_recorded(tmp_path) -> None:
    raw = b'{"model":"m","session_end":true,"session_id":"r","messages":[{"role":"user","content":"\\udfff"}]}'

    async def go():
        async with stack(record=str(tmp_path / "t.jsonl")) as (fake, server, client):
            async with client.post(server.url + CHAT, data=raw) as r:
                assert r.status == 200, await r.text()
    run(go())
    assert "sha256:" in (tmp_path / "t.jsonl").read_text()


def test_an_engine_usage_of_1e400_is_no_usage() -> None:
    assert usage_from_body(b'{"usage":{"prompt_tokens":1e400,"completion_tokens":1}}') is None
    assert usage_from_body(b'{"usage":{"prompt_tokens":10,"completion_tokens":-1e400}}') == CallUsage(10, 0, None)
    assert usage_from_body(b'{"usage":{"prompt_tokens":NaN}}') is None
    assert usage_from_body(b'{"timings":{"cache_n":1e400,"prompt_n":3}}') is None

    async def engine(request: web.Request) -> web.Response:
        return web.Response(body=b'{"choices":[],"usage":{"prompt_tokens":1e400,"completion_tokens":2}}',
                            content_type="application/json")

    async def go():
        app = web.Application()
        app.router.add_post(CHAT, engine)
        runner, url = await start_app(app)
        server = GatewayServer(_config(url, engine="openai"))
        await server.start()
        try:
            async with aiohttp.ClientSession() as client:
                async with client.post(server.url + CHAT, json=chat("inf")) as r:
                    assert r.status == 200
            sess = server.gate.table.get("inf")
            assert sess.context_tokens > 0 and sess.in_flight == 0
        finally:
            await server.stop()
            await runner.cleanup()
    run(go())


# --------------------------------------------------------------------------- finding 6: the relay
def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _encoded_engine(stream: bool, usage_then_padding: int = 0):
    """An engine that gzips its answers (whatever Accept-Encoding says), or streams usage
    followed by ``usage_then_padding`` bytes of further events."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if not stream:
            body = gzip.compress(json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": USAGE}).encode())
            return web.Response(body=body, headers={"Content-Type": "application/json",
                                                    "Content-Encoding": "gzip"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_sse({"choices": [{"delta": {"content": "hi"}}]}))
        await resp.write(_sse({"choices": [], "usage": USAGE}))
        sent = 0
        while sent < usage_then_padding:
            event = _sse({"choices": [{"delta": {"content": "x" * 1000}}]})
            await resp.write(event)
            sent += len(event)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post(CHAT, handle)
    return await start_app(app)


def test_an_encoded_answer_keeps_its_content_encoding_and_its_usage_is_read() -> None:
    async def go():
        runner, url = await _encoded_engine(stream=False)
        server = GatewayServer(_config(url, engine="openai"))
        await server.start()
        try:
            async with aiohttp.ClientSession() as client:
                async with client.post(server.url + CHAT, json=chat("gz")) as r:
                    assert r.status == 200 and r.headers.get("Content-Encoding") == "gzip"
                    assert (await r.json())["usage"] == USAGE  # the client decodes what it is told is gzip
            assert server.gate.table.get("gz").context_tokens == 328
        finally:
            await server.stop()
            await runner.cleanup()
    run(go())


def test_usage_followed_by_more_than_16_kb_of_stream_is_read() -> None:
    async def go():
        runner, url = await _encoded_engine(stream=True, usage_then_padding=64_000)
        server = GatewayServer(_config(url, engine="openai"))
        await server.start()
        try:
            async with aiohttp.ClientSession() as client:
                async with client.post(server.url + CHAT, json=chat("far", stream=True)) as r:
                    assert r.status == 200
                    assert len(await r.read()) > 64_000
            assert server.gate.table.get("far").context_tokens == 328
        finally:
            await server.stop()
            await runner.cleanup()
    run(go())


def test_stream_usage_is_found_across_chunks_and_compressed() -> None:
    from basin.gateway.usage import StreamUsage

    stream = (_sse({"choices": [{"delta": {"content": "a"}}]}) + _sse({"choices": [], "usage": USAGE})
              + _sse({"choices": [{"delta": {"content": "z" * 40_000}}]}) + b"data: [DONE]\n\n")
    for encoding, data in ((None, stream), ("gzip", gzip.compress(stream))):
        scanner = StreamUsage(encoding)
        for i in range(0, len(data), 7):
            scanner.feed(data[i:i + 7])
        assert scanner.close() == CallUsage(321, 7, 300), encoding
    broken = StreamUsage("gzip")
    broken.feed(b"not gzip at all" + stream)
    assert broken.close() is None


def test_a_client_hanging_up_mid_stream_is_client_gone_once_without_a_traceback(caplog) -> None:
    caplog.set_level(logging.INFO)

    async def go():
        async with stack(FakeUpstreamConfig(token_delay_s=0.03, completion_tokens=60)) as (fake, server, client):
            for i in range(3):
                resp = await client.post(server.url + CHAT, json=chat(f"gone{i}", stream=True))
                await resp.content.readuntil(b"\n\n")
                resp.close()
            for _ in range(200):
                await asyncio.sleep(0.02)
                if all(server.gate.table.get(f"gone{i}").in_flight == 0 for i in range(3)):
                    break
            await asyncio.sleep(0.1)
            async with client.get(server.url + "/metrics") as r:
                text = await r.text()
            assert _count(text, "client_gone") == 3.0
            assert _count(text, "upstream_broke") == 0.0
            assert server.proxy.last_upstream_error is None
    run(go())
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]


def test_a_write_to_a_client_that_reset_is_client_gone_not_upstream_broke(monkeypatch, caplog) -> None:
    """The race the replay hit: the client's transport is closing when the next chunk is written, before
    the handler is cancelled; aiohttp's error for it is a ConnectionError and a ClientConnectionError."""
    caplog.set_level(logging.INFO)
    write = web.StreamResponse.write
    gateway_app: list[web.Application] = []
    writes: dict[int, int] = {}

    async def resetting(self: web.StreamResponse, data: bytes) -> None:
        req = self._req
        if req is not None and gateway_app and req.app is gateway_app[0]:
            writes[id(self)] = writes.get(id(self), 0) + 1
            if writes[id(self)] >= 3:
                raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        await write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", resetting)

    async def go():
        async with stack(FakeUpstreamConfig(completion_tokens=30, token_delay_s=0.01)) as (fake, server, client):
            gateway_app.append(server._runner.app)
            try:  # the client is not really gone here: it may read on until the gateway ends the answer
                async with asyncio.timeout(5.0), client.post(server.url + CHAT, json=chat("reset", stream=True)) as r:
                    await r.read()
            except (aiohttp.ClientError, TimeoutError):
                pass
            for _ in range(100):
                await asyncio.sleep(0.02)
                sess = server.gate.table.get("reset")
                if sess is None or sess.in_flight == 0:
                    break
            text = server.telemetry.render().decode()
            assert _count(text, "client_gone") == 1.0 and _count(text, "upstream_broke") == 0.0
            assert server.proxy.last_upstream_error is None
    run(go())
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
