"""Several metrics sources merged: a PD deployment's prefill servers give the
cache figures, its decode servers the decode-memory queue."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from tests.support.local_app import start_app

from basin.gateway.scrape import EngineMetrics

FIXTURES = Path(__file__).parent / "fixtures"


async def _serve(texts: dict[str, str]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    for path, text in texts.items():
        async def handler(request: web.Request, text: str = text) -> web.Response:
            return web.Response(text=text, content_type="text/plain")
        app.router.add_get(path, handler)
    return await start_app(app)


def test_pd_prefill_and_decode_scrapes_merge_by_role():
    prefill = (FIXTURES / "sglang_pd_prefill.txt").read_text()
    decode = (FIXTURES / "sglang_pd_decode.txt").read_text()

    async def go():
        runner, base = await _serve({"/p0": prefill, "/p1": prefill, "/d0": decode})
        clock = [100.0]
        try:
            async with aiohttp.ClientSession() as session:
                view = EngineMetrics.build("sglang", session, [base + "/p0", base + "/p1"], [base + "/d0"],
                                           interval_s=5.0, clock=lambda: clock[0])
                assert view.latest is None and view.stale_s(100.0) == math.inf
                snap = await view.scrape_once()
                # Two prefill servers with 800K-token caches and 14 queued requests each.
                assert snap.cache_capacity_tokens == 1_600_000 and view.capacity_tokens == 1_600_000
                assert snap.queue_requests == 28
                assert snap.hit_rate == pytest.approx(3.1 / 5.0)
                # Decode memory usage is the decode servers' (0.91 and 0.87), not the prefill servers'.
                assert snap.kv_used_fraction == pytest.approx(0.89)
                assert snap.decode_wait_requests > 0
                clock[0] = 130.0
                assert view.stale_s(130.0) == 30.0
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_a_failing_source_makes_the_view_stale_but_keeps_the_capacity():
    prefill = (FIXTURES / "sglang_pd_prefill.txt").read_text()

    async def go():
        runner, base = await _serve({"/p0": prefill})
        clock = [0.0]
        try:
            async with aiohttp.ClientSession() as session:
                view = EngineMetrics.build("sglang", session, [base + "/p0"], ["http://127.0.0.1:9/metrics"],
                                           interval_s=5.0, clock=lambda: clock[0])
                await view.scrape_once()
                assert view.stale_s(0.0) == math.inf  # the decode server never answered
                assert view.failures == 1 and "127.0.0.1:9" in view.last_error
                assert view.capacity_tokens == 800_000
        finally:
            await runner.cleanup()
    asyncio.run(go())

