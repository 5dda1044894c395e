"""Decode-memory lending in the emulator: the simulator's lending model driven
call by call, switched by ``POST /emulator/lending`` (bad bodies refused
naming the field), and exported as ``basin_emulator_*`` gauges that the
gateway's adapters read, in both metrics styles."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.emulate.harness import emulator, run
from tests.emulate.test_engine import call, drain, engine

from basin.emulate.exposition import DECODE_KV_TOKENS, LENT_CACHE_TOKENS
from basin.gateway.adapters.sglang import SGLangAdapter
from basin.gateway.adapters.vllm import VLLMAdapter

PROMPT = ((11, 30_000),)
NEXT = PROMPT + ((12, 2_000),)


def test_lending_keeps_a_prompt_for_the_sessions_next_call():
    e = engine()
    e.lending(True)
    e.submit(call(PROMPT), 0.0, 0.0)
    drain(e)
    assert e.lent_tokens == 30_000 and [f.lent_tokens for f in e.decode_figures()].count(30_000) == 1
    second = e.submit(call(NEXT), 0.0, e.now + 5.0)
    drain(e)
    # The prefill cache matches whole pages; the lent unit covers the rest of the last prompt.
    tier = e.cluster.lent_tier
    assert second.cached_tokens == 30_000 and tier is not None and tier.fetched_tokens == 48
    assert e.lent_tokens == 32_000  # the unit now holds the session's latest prompt
    plain = engine()
    plain.submit(call(PROMPT), 0.0, 0.0)
    drain(plain)
    again = plain.submit(call(NEXT), 0.0, plain.now + 5.0)
    drain(plain)
    page = plain.hardware.page_tokens
    assert again.cached_tokens == 30_000 - 30_000 % page
    assert plain.cluster.lent_tier is None and plain.lent_tokens == 0  # never switched on: not even wired in


def test_switching_off_adopts_no_more_units():
    e = engine()
    e.lending(True)
    e.submit(call(PROMPT), 0.0, 0.0)
    drain(e)
    state = e.lending(False)
    # As in the simulator, units already lent stay until decode needs the memory or the session moves on.
    assert not state.on and state.lent_tokens == 30_000
    e.submit(call(NEXT), 0.0, e.now + 5.0)
    drain(e)
    assert e.lent_tokens == 0 and not e.lending_state().on


def test_a_call_that_does_not_extend_its_sessions_unit_drops_it():
    e = engine()
    e.lending(True)
    e.submit(call(PROMPT), 0.0, 0.0)
    drain(e)
    # Another conversation under the same routing key: its first message is not the unit's.
    other = dataclasses.replace(call(((99, 29_000),)), affinity=call(PROMPT).affinity)
    handle = e.submit(other, 0.0, e.now + 5.0)
    assert e.lent_tokens == 0  # dropped at once, never fetched as if it were a prefix
    drain(e)
    assert handle.cached_tokens == 0


def test_the_cap_bounds_lent_memory():
    e = engine()
    state = e.lending(True, cap_fraction=0.001)  # 3,320 tokens of a 3.32M-token decode instance
    assert state.cap_fraction == 0.001 and state.decode_kv_tokens == 3 * e.hardware.decode.kv_tokens
    e.submit(call(PROMPT), 0.0, 0.0)
    drain(e)
    assert e.lent_tokens == 0
    with pytest.raises(ValueError, match="cap_fraction"):
        e.lending(True, cap_fraction=1.5)


def test_the_endpoint_switches_the_engines_lending():
    async def go():
        async with emulator() as (emu, client):
            async with client.get(emu.url + "/emulator/lending") as r:
                assert r.status == 200 and (await r.json())["on"] is False
            async with client.post(emu.url + "/emulator/lending", json={"on": True}) as r:
                assert r.status == 200
                state = await r.json()
            assert state == {"on": True, "cap_fraction": 0.5, "lent_tokens": 0,
                             "decode_kv_tokens": 3 * emu.engine.hardware.decode.kv_tokens}
            assert emu.engine.lending_on and emu.engine.cluster.lent_tier is not None
            async with client.post(emu.url + "/emulator/lending", json={"on": False, "cap_fraction": 0.25}) as r:
                assert (await r.json())["on"] is False and emu.engine.lend_cap_fraction == 0.25
            assert not emu.engine.lending_on
    run(go())


@pytest.mark.parametrize("body, field", [
    ({}, "on"),
    ({"on": 1}, "on"),
    ({"on": "true"}, "on"),
    ({"enabled": True}, "enabled"),
    ({"on": True, "cap_fraction": 0}, "cap_fraction"),
    ({"on": True, "cap_fraction": True}, "cap_fraction"),
    ([True], "(body)"),
])
def test_a_bad_body_is_a_400_naming_the_field(body, field):
    async def go():
        async with emulator() as (emu, client):
            async with client.post(emu.url + "/emulator/lending", json=body) as r:
                assert r.status == 400
                err = (await r.json())["error"]
            assert err["param"] == field and f"field '{field}'" in err["message"]
            async with client.post(emu.url + "/emulator/lending", data=b"{on: yes") as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "(body)"
            assert not emu.engine.lending_on and emu.engine.cluster.lent_tier is None
    run(go())


def _gauges(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (LENT_CACHE_TOKENS, DECODE_KV_TOKENS):
            out[family.name] = [(dict(s.labels), s.value) for s in family.samples]
    return out


async def _lend_one(emu, client) -> None:
    """Lending on, then one call: its prompt stays lent on its decode instance."""
    async with client.post(emu.url + "/emulator/lending", json={"on": True}) as r:
        assert r.status == 200
    body = {"messages": [{"role": "user", "content": "Fix the parser. " * 2_000}], "max_tokens": 8}
    async with client.post(emu.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        prompt = (await r.json())["usage"]["prompt_tokens"]
    assert emu.engine.lent_tokens == prompt


def test_sglang_metrics_carry_the_lent_memory_per_decode_instance():
    async def go():
        async with emulator() as (emu, client):
            await _lend_one(emu, client)
            kv = emu.engine.hardware.decode.kv_tokens
            for path in ("/metrics", "/metrics/decode"):
                async with client.get(emu.url + path) as r:
                    text = await r.text()
                gauges = _gauges(text)
                assert [labels["engine_type"] for labels, _ in gauges[DECODE_KV_TOKENS]] == ["decode"] * 3
                assert [v for _, v in gauges[DECODE_KV_TOKENS]] == [kv] * 3
                assert sum(v for _, v in gauges[LENT_CACHE_TOKENS]) == emu.engine.lent_tokens
                assert "real SGLang and vLLM have no such metric" in text
                snap = SGLangAdapter().parse_metrics(text, 0.0)
                assert (snap.lent_cache_tokens, snap.decode_kv_tokens) == (emu.engine.lent_tokens, 3 * kv)
                assert LENT_CACHE_TOKENS in snap.found
            async with client.get(emu.url + "/metrics/prefill") as r:
                text = await r.text()
            assert _gauges(text) == {}  # decode memory is not the prefill servers'
            snap = SGLangAdapter().parse_metrics(text, 0.0)
            assert snap.lent_cache_tokens is None and snap.decode_kv_tokens is None
    run(go())


def test_vllm_metrics_carry_the_lent_memory_of_the_one_engine():
    async def go():
        async with emulator(metrics_style="vllm") as (emu, client):
            async with client.get(emu.url + "/metrics") as r:
                before = VLLMAdapter().parse_metrics(await r.text(), 0.0)
            assert before.lent_cache_tokens == 0  # exported, and 0, before lending was ever on
            await _lend_one(emu, client)
            async with client.get(emu.url + "/metrics") as r:
                text = await r.text()
            gauges = _gauges(text)
            assert gauges[LENT_CACHE_TOKENS] == [({"engine": "0", "model_name": emu.config.model_id},
                                                  float(emu.engine.lent_tokens))]
            snap = VLLMAdapter().parse_metrics(text, 0.0)
            assert snap.lent_cache_tokens == emu.engine.lent_tokens > 0
            assert snap.decode_kv_tokens == 3 * emu.engine.hardware.decode.kv_tokens
    run(go())
