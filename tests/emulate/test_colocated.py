"""`basin emulate` of a colocated deployment (``1C-HW``): one server whose
prefill and decode share one pool, exporting vLLM's metrics."""

from __future__ import annotations

import pytest
from tests.emulate.harness import emulator, run
from tests.emulate.test_server import post, turn1, turn2

from basin.gateway.adapters.vllm import VLLMAdapter


def test_a_colocated_server_reuses_a_conversation_and_reports_vllms_figures():
    async def go():
        async with emulator(metrics_style="vllm", deployment="1C-h100-nvl") as (emu, client):
            adapter = VLLMAdapter()
            first = await post(client, emu.url, {"messages": turn1(), "max_tokens": 8})
            async with client.get(emu.url + "/metrics") as r:
                adapter.parse_metrics(await r.text(), 0.0)
            second = await post(client, emu.url, {"messages": turn2(first["choices"][0]["message"]["content"]),
                                                  "max_tokens": 8})
            async with client.get(emu.url + "/metrics") as r:
                snap = adapter.parse_metrics(await r.text(), 1.0)
            return emu.engine, first["usage"], second["usage"], snap

    engine, first, second, snap = run(go())
    assert engine.deployment.topology == "colocated"
    page = engine.hardware.page_tokens
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert cached >= first["prompt_tokens"] - page and cached % page == 0
    assert snap.hit_rate == pytest.approx(cached / second["prompt_tokens"])
    pool = engine.hardware.prefill.prefix_cache_tokens
    assert snap.cache_capacity_tokens == pool // page * page
    assert snap.queue_requests == 0 and snap.running_requests == 0
