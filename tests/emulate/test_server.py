"""The emulator over HTTP: chat completions streamed and not, usage with
cached tokens, priorities in each engine's convention, the accelerated
clock, refusals naming the field, and /metrics as the gateway's own
adapters read it."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.emulate.harness import emulator, events, last_json, run

from basin.emulate.server import _TEXT_CYCLE_TOKENS, _VOCAB, _answer_text
from basin.gateway.adapters.sglang import SGLangAdapter
from basin.gateway.adapters.vllm import VLLMAdapter

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}


def turn1() -> list[dict]:
    return [SYSTEM, {"role": "user", "content": "Fix the failing test in parser.py. " * 60}]


def turn2(answer: str) -> list[dict]:
    return turn1() + [{"role": "assistant", "content": answer},
                      {"role": "user", "content": "The test output: " + "ok " * 300}]


async def post(client: aiohttp.ClientSession, url: str, body: dict, **kw) -> dict:
    async with client.post(url + "/v1/chat/completions", json=body, **kw) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def test_non_streamed_calls_report_usage_and_the_second_turn_is_cached():
    async def go():
        async with emulator() as (emu, client):
            first = await post(client, emu.url, {"model": "m", "messages": turn1(), "max_tokens": 24})
            usage = first["usage"]
            assert usage["completion_tokens"] == 24 and usage["prompt_tokens"] > 64
            assert usage["prompt_tokens_details"]["cached_tokens"] == 0
            assert usage["total_tokens"] == usage["prompt_tokens"] + 24
            answer = first["choices"][0]["message"]["content"]
            assert first["choices"][0]["finish_reason"] == "length" and len(answer) == 4 * 24
            second = await post(client, emu.url, {"model": "m", "messages": turn2(answer), "max_tokens": 8})
            page = emu.engine.hardware.page_tokens
            cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached > 0
            # The whole first conversation (page-aligned) is reused, and the answer sent
            # back counts the tokens it was generated as.
            assert cached >= usage["prompt_tokens"] - page
            assert second["emulator"]["ttft_s"] < first["emulator"]["ttft_s"]
    run(go())


def test_streamed_calls_send_one_event_per_token_then_usage():
    async def go():
        async with emulator() as (emu, client):
            body = {"messages": turn1(), "max_tokens": 12, "stream": True,
                    "stream_options": {"include_usage": True}}
            async with client.post(emu.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200 and r.content_type == "text/event-stream"
                raw = await r.read()
            payloads = events(raw)
            assert payloads[-1] == "[DONE]"
            chunks = [json.loads(p) for p in payloads[:-1]]
            tokens = [c["choices"][0]["delta"]["content"] for c in chunks[:12]]
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and len(tokens) == 12
            assert chunks[12]["choices"][0]["finish_reason"] == "length"
            assert chunks[13]["choices"] == [] and chunks[13]["usage"]["completion_tokens"] == 12
            body = {"messages": turn2("".join(tokens)), "max_tokens": 4, "stream": True,
                    "stream_options": {"include_usage": True}}
            async with client.post(emu.url + "/v1/chat/completions", json=body) as r:
                usage = last_json(await r.read())["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] > 0
            # Without include_usage the stream ends on the finish chunk.
            async with client.post(emu.url + "/v1/chat/completions",
                                   json={"messages": turn1(), "max_tokens": 3, "stream": True}) as r:
                tail = last_json(await r.read())
            assert tail["choices"][0]["finish_reason"] == "length" and "usage" not in tail
    run(go())


@pytest.mark.parametrize("speed", [10.0, 40.0])
def test_speed_compresses_time(speed):
    async def go():
        async with emulator(speed=speed) as (emu, client):
            body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 400}
            t0 = time.monotonic()
            data = await post(client, emu.url, body)
            wall = time.monotonic() - t0
            sim = data["emulator"]["latency_s"]
            assert sim > 1.5  # about 400 decode steps of 4.4 ms on H200
            assert 0.9 * sim / speed <= wall <= sim / speed + 0.08
    run(go())


@pytest.mark.parametrize("style, low, high", [("sglang", 0, 10), ("vllm", 10, 0)])
def test_priority_is_honoured_in_each_engines_convention(style, low, high):
    async def go():
        async with emulator(speed=10.0, metrics_style=style) as (emu, client):
            big = {"messages": [{"role": "user", "content": "x" * 240_000}], "max_tokens": 2}
            busy = asyncio.create_task(post(client, emu.url, big))  # about 1.2 s of prefill
            await asyncio.sleep(0.02)
            small = [{"role": "user", "content": "y" * 12_000}]  # one prefill step each, not one for both
            slow = asyncio.create_task(post(client, emu.url, {"messages": small, "max_tokens": 2, "priority": low}))
            await asyncio.sleep(0.02)
            fast = asyncio.create_task(post(client, emu.url, {"messages": [{"role": "user", "content": "z" * 12_000}],
                                                              "max_tokens": 2, "priority": high}))
            b, s, f = await asyncio.gather(busy, slow, fast)
            assert s["emulator"]["arrival_s"] < f["emulator"]["arrival_s"] < b["emulator"]["first_token_s"]
            assert f["emulator"]["first_token_s"] < s["emulator"]["first_token_s"]
    run(go())


@pytest.mark.parametrize("body, field", [
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "max_tokens"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "priority": 1.5}, "priority"),
    ({"messages": [{"role": "user", "content": "x" * 9_000_000}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4_000_000}, "max_tokens"),
])
def test_bad_input_is_a_400_naming_the_field(body, field):
    async def go():
        async with emulator() as (emu, client):
            async with client.post(emu.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 400
                err = (await r.json())["error"]
            assert err["param"] == field and f"field '{field}'" in err["message"]
            async with client.post(emu.url + "/v1/chat/completions", data=b"{not json") as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "(body)"
            assert emu.engine.calls_in_flight == 0
    run(go())


def test_models_health_server_info_and_unknown_paths():
    async def go():
        async with emulator(deployment="1p1d-h100") as (emu, client):
            async with client.get(emu.url + "/v1/models") as r:
                assert (await r.json())["data"][0]["id"] == "basin-emulate/1p1d-h100"
            async with client.get(emu.url + "/health") as r:
                assert r.status == 200
            async with client.post(emu.url + "/v1/completions", json={"prompt": "x"}) as r:
                assert r.status == 404 and "chat" in (await r.json())["error"]["message"]
            async with client.get(emu.url + "/metrics/nope") as r:
                assert r.status == 404
            # The gateway's own start-up probe finds priority scheduling on, higher first.
            adapter = SGLangAdapter()
            assert await adapter.check_features(client, emu.url) == []
            assert adapter.priority_enabled is True and adapter.low_priority_first is False
    run(go())


def test_sglang_metrics_are_read_by_the_gateways_adapter():
    async def go():
        async with emulator(speed=5.0) as (emu, client):
            async def scrape(adapter: SGLangAdapter, path: str = "/metrics"):
                async with client.get(emu.url + path) as r:
                    return adapter.parse_metrics(await r.text(), time.monotonic())

            whole, pre, dec = SGLangAdapter(), SGLangAdapter(), SGLangAdapter()
            first = await post(client, emu.url, {"messages": turn1(), "max_tokens": 8})
            for a, path in ((whole, "/metrics"), (pre, "/metrics/prefill"), (dec, "/metrics/decode")):
                await scrape(a, path)
            second = await post(client, emu.url, {"messages": turn2(first["choices"][0]["message"]["content"]),
                                                  "max_tokens": 8})
            async with client.get(emu.url + "/metrics") as r:
                text = await r.text()
            names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
            assert names >= set(whole.expected_series)  # every series the adapter knows, by its real name
            snap = whole.parse_metrics(text, time.monotonic())
            # ... and read by it (the hit-rate gauge is the fallback when the counters are absent)
            assert set(snap.found) >= set(whole.expected_series) - {"sglang:cache_hit_rate"}
            usage = second["usage"]
            assert snap.hit_rate == pytest.approx(usage["prompt_tokens_details"]["cached_tokens"]
                                                  / usage["prompt_tokens"])
            assert snap.cache_capacity_tokens == emu.engine.hardware.prefill.prefix_cache_tokens
            assert (await scrape(pre, "/metrics/prefill")).cache_capacity_tokens == snap.cache_capacity_tokens
            decode_kv = 3 * emu.engine.hardware.decode.kv_tokens
            assert (await scrape(dec, "/metrics/decode")).cache_capacity_tokens == decode_kv
            # Under load the queues show: a long prefill holds the next calls back.
            big = {"messages": [{"role": "user", "content": "x" * 400_000}], "max_tokens": 2}
            tasks = [asyncio.create_task(post(client, emu.url, big)) for _ in range(3)]
            await asyncio.sleep(0.05)
            busy = await scrape(whole)
            assert busy.queue_requests >= 1 and busy.running_requests >= 1
            await asyncio.gather(*tasks)
    run(go())


def test_vllm_metrics_are_read_by_the_gateways_adapter():
    async def go():
        async with emulator(metrics_style="vllm", deployment="1p1d-h100") as (emu, client):
            adapter = VLLMAdapter()
            first = await post(client, emu.url, {"messages": turn1(), "max_tokens": 8})
            async with client.get(emu.url + "/metrics") as r:
                adapter.parse_metrics(await r.text(), 0.0)
            second = await post(client, emu.url, {"messages": turn2(first["choices"][0]["message"]["content"]),
                                                  "max_tokens": 8})
            async with client.get(emu.url + "/metrics") as r:
                snap = adapter.parse_metrics(await r.text(), 1.0)
            assert set(snap.found) >= {"vllm:num_requests_waiting", "vllm:num_requests_running",
                                       "vllm:kv_cache_usage_perc", "vllm:cache_config_info",
                                       "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"}
            usage = second["usage"]
            assert snap.hit_rate == pytest.approx(usage["prompt_tokens_details"]["cached_tokens"]
                                                  / usage["prompt_tokens"])
            page = emu.engine.hardware.page_tokens  # whole blocks of one page
            assert snap.cache_capacity_tokens == emu.engine.hardware.prefill.prefix_cache_tokens // page * page
            async with client.get(emu.url + "/get_server_info") as r:
                assert r.status == 404  # vLLM has no such endpoint
    run(go())


def test_a_call_whose_client_leaves_before_its_prefill_is_withdrawn():
    async def go():
        async with emulator(speed=5.0) as (emu, client):
            big = {"messages": [{"role": "user", "content": "x" * 400_000}], "max_tokens": 2}
            busy = asyncio.create_task(post(client, emu.url, big))  # seconds of prefill at 5x
            await asyncio.sleep(0.02)
            with pytest.raises(asyncio.TimeoutError):
                await post(client, emu.url, {"messages": [{"role": "user", "content": "y" * 4000}]},
                           timeout=aiohttp.ClientTimeout(total=0.05))
            await asyncio.sleep(0.05)
            assert emu.engine.calls_in_flight == 1  # only the busy call is left in the model
            await busy
            assert emu.engine.calls_in_flight == 0
            assert all(p.cache.lock_handles == 0 for p in emu.engine.cluster.prefills)
    run(go())


def test_answers_are_deterministic_from_the_seed():
    async def answer(seed: int, text: str = "same task") -> str:
        async with emulator(seed=seed) as (emu, client):
            data = await post(client, emu.url, {"messages": [{"role": "user", "content": text}], "max_tokens": 40})
            return data["choices"][0]["message"]["content"]

    async def go():
        a = await answer(3)
        assert a == await answer(3)
        assert a != await answer(4) and a != await answer(3, "another task")
    run(go())


def test_a_stream_whose_client_leaves_mid_way_leaves_the_emulator_serving():
    async def go():
        async with emulator(speed=5.0) as (emu, client):
            body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 300, "stream": True}
            async with client.post(emu.url + "/v1/chat/completions", json=body) as r:
                assert (await r.content.readline()).startswith(b"data: ")
            # The connection is closed with the answer half sent; the next call is served as usual.
            data = await post(client, emu.url, {"messages": [{"role": "user", "content": "next"}], "max_tokens": 4})
            assert data["usage"]["completion_tokens"] == 4
    run(go())


def test_answer_text_is_cut_from_the_cycle_and_wraps_round_for_long_answers():
    long = _answer_text(_TEXT_CYCLE_TOKENS + 1234, random.Random(7))
    assert len(long) == _TEXT_CYCLE_TOKENS + 1234 and set(long) <= set(_VOCAB)
    assert _answer_text(50, random.Random(7)) == long[:50]  # the same conversation, the same answer
    assert _answer_text(50, random.Random(8)) != long[:50]
    assert _answer_text(0, random.Random(7)) == []
