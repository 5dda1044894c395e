"""SIGTERM (what Kubernetes and systemd send) drains as SIGINT does (issue 14,
item 5): new sessions are refused and nothing new is accepted, parked calls get
a retryable 503, calls in flight finish up to the deadline, and a stream cut at
the deadline is told why."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import aiohttp
import pytest
from tests.gateway.test_proxy import QueuePolicy, _config, chat, run
from tests.support.fake_upstream import FakeUpstream, FakeUpstreamConfig

from basin.gateway.server import GatewayServer, run_until_signalled

CHAT = "/v1/chat/completions"


async def _serving(fake_cfg: FakeUpstreamConfig, **cfg) -> tuple[FakeUpstream, GatewayServer, asyncio.Task[None]]:
    fake = FakeUpstream(fake_cfg)
    server = GatewayServer(_config(await fake.start(), **cfg), policy=QueuePolicy(admit_first=1))
    await server.start()
    task = asyncio.create_task(run_until_signalled(server))
    await asyncio.sleep(0.05)  # the signal handlers are in place
    return fake, server, task


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_drains(sig, caplog) -> None:
    async def go():
        fake, server, task = await _serving(FakeUpstreamConfig(token_delay_s=0.02, completion_tokens=20),
                                            shutdown_timeout_s=5.0)
        url = server.url + CHAT
        async with aiohttp.ClientSession() as client:
            live = await client.post(url, json=chat("live", stream=True))
            await live.content.readuntil(b"\n\n")
            parked = asyncio.create_task(client.post(url, json=chat("parked")))
            await asyncio.sleep(0.1)
            assert server.gate.table.get("parked") is not None
            os.kill(os.getpid(), sig)
            rest = await asyncio.wait_for(live.read(), 5)
            assert rest.rstrip().endswith(b"data: [DONE]")  # the call in flight finished
            refused = await asyncio.wait_for(parked, 5)
            assert refused.status == 503 and refused.headers["Retry-After"] == "60"
            assert (await refused.json())["error"]["reason"] == "shutting-down"
            await asyncio.wait_for(task, 5)
            with pytest.raises(aiohttp.ClientConnectorError):
                await client.post(url, json=chat("late"))
        await fake.stop()

    with caplog.at_level(logging.INFO, logger="basin.gateway"):
        run(go())
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{sig.name} received: draining") for m in messages)
    assert any("1 parked call(s) answered with 503" in m for m in messages) and "stopped" in messages


def test_a_stream_cut_at_the_deadline_gets_an_error_event() -> None:
    async def go():
        fake, server, task = await _serving(FakeUpstreamConfig(token_delay_s=0.1, completion_tokens=50),
                                            shutdown_timeout_s=0.3)
        async with aiohttp.ClientSession() as client:
            live = await client.post(server.url + CHAT, json=chat("long", stream=True))
            await live.content.readuntil(b"\n\n")
            os.kill(os.getpid(), signal.SIGTERM)
            raw = b""
            try:
                async for chunk in live.content.iter_any():
                    raw += chunk
            except aiohttp.ClientPayloadError:
                pass
            await asyncio.wait_for(task, 5)
        assert b"event: error" in raw and b"gateway_shutdown" in raw and b"[DONE]" not in raw
        await fake.stop()
    run(go())
