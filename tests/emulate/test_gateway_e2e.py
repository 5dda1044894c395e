"""`basin gateway` in front of `basin emulate`: the gateway's probe, its
scrape of the emulator's SGLang and vLLM metrics, and sessions through it
with usage and cached tokens, as against a real engine."""

from __future__ import annotations

import asyncio
import json

import pytest
from tests.emulate.harness import emulator, last_json, run

from basin.emulate.calls import queue_priority
from basin.gateway.adapters.sglang import SGLangAdapter
from basin.gateway.adapters.vllm import VLLMAdapter
from basin.gateway.config import GatewayConfig
from basin.gateway.server import GatewayServer

TASK = [{"role": "system", "content": "You are a coding agent. " * 60},
        {"role": "user", "content": "Make the flaky integration test deterministic. " * 40}]


@pytest.mark.parametrize("adapter, style", [(SGLangAdapter(), "sglang"), (VLLMAdapter(), "vllm")])
def test_the_gateways_ranks_map_onto_the_emulators_queue_order(adapter, style):
    keys = [queue_priority(int(adapter.priority_fields(rank)["priority"]), style) for rank in range(5)]
    assert keys == sorted(keys) and len(set(keys)) == 5  # rank 0, the most urgent, is served first


@pytest.mark.parametrize("style, policy", [("sglang", "hicache"), ("sglang", "basin"), ("vllm", "basin")])
def test_gateway_in_front_of_the_emulator(style, policy):
    async def go():
        async with emulator(speed=50.0, metrics_style=style) as (emu, client):
            urls = {}
            if style == "sglang":  # PD: the prefill and decode servers' own /metrics
                urls = {"metrics_urls": (emu.url + "/metrics/prefill",),
                        "decode_metrics_urls": (emu.url + "/metrics/decode",)}
            cfg = GatewayConfig(upstream=emu.url, engine=style, listen_port=0, policy=policy,
                                scrape_interval_s=0.1, **urls)
            gateway = GatewayServer(cfg)
            await gateway.start()
            try:
                if style == "sglang":
                    assert gateway.warnings == []  # priority scheduling verified on, direction read
                headers = {"X-Session-Id": "agent-1"}
                body = {"model": "m", "messages": TASK, "max_tokens": 32}
                async with client.post(gateway.url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200, await r.text()
                    first = await r.json()
                sess = gateway.gate.table.get("agent-1")
                usage = first["usage"]
                assert sess.context_tokens == usage["prompt_tokens"] + usage["completion_tokens"]
                messages = TASK + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                                   {"role": "user", "content": "Tests pass now. " * 50}]
                body = {"model": "m", "messages": messages, "max_tokens": 16, "stream": True}
                async with client.post(gateway.url + "/v1/chat/completions", json=body,
                                       headers={**headers, "X-Session-End": "true"}) as r:
                    assert r.status == 200 and r.content_type == "text/event-stream"
                    second = last_json(await r.read())["usage"]  # the gateway asked for usage
                assert second["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 64
                assert gateway.gate.table.get("agent-1") is None and gateway.gate.counts["finished"] == 1
                # Several sessions at once, all answered.
                async def session(i: int) -> int:
                    b = {"messages": [{"role": "user", "content": f"task {i} " * 500}], "max_tokens": 8}
                    async with client.post(gateway.url + "/v1/chat/completions", json=b,
                                           headers={"X-Session-Id": f"s{i}", "X-Session-End": "true"}) as r:
                        await r.read()
                        return r.status
                assert await asyncio.gather(*(session(i) for i in range(12))) == [200] * 12
                await asyncio.sleep(0.3)  # a few scrapes
                snap = gateway.poller.latest
                assert gateway.poller.failures == 0 and snap is not None
                # Every series the adapter reads was found (the hit rate is NaN once no tokens flow).
                adapter = gateway.adapter
                assert set(snap.found) >= set(adapter.expected_series) - {"sglang:cache_hit_rate",
                                                                           "vllm:gpu_cache_usage_perc",
                                                                           "vllm:gpu_prefix_cache_hits_total",
                                                                           "vllm:gpu_prefix_cache_queries_total"}
                tokens, page = emu.engine.hardware.prefill.prefix_cache_tokens, emu.engine.hardware.page_tokens
                assert snap.cache_capacity_tokens == (tokens if style == "sglang" else tokens // page * page)
                async with client.get(gateway.url + "/metrics") as r:
                    assert r.status == 200 and "basin_gateway_" in await r.text()
                async with client.get(gateway.url + "/v1/models") as r:
                    assert json.loads(await r.text())["data"][0]["id"].startswith("basin-emulate/")
            finally:
                await gateway.stop()
    run(go())
