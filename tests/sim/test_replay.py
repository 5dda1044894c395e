"""The prefix cache alone on a request trace (basin.sim.replay)."""

from __future__ import annotations

import pytest

from basin.sim.replay import ReplayResult, replay_trace

TRACE = [((1, 2, 3), 192), ((1, 2, 4), 192), ((5, 6, 7), 192), ((1, 2, 3), 192)]


def test_a_hand_worked_trace_with_a_host_tier():
    # 256-token pool, 64-token blocks and pages:
    # r0 misses; r1 hits blocks 1-2 (128); r2 evicts 3, 4 then 2 (LRU leaves,
    # 192 tokens, kept on the host); r3 hits block 1 on the device and loads
    # 2-3 back from the host after evicting 7 and 6 (128 more).
    r = replay_trace(TRACE, capacity_tokens=256, block_tokens=64, page_tokens=64, host_tokens=1024)
    assert r == ReplayResult(requests=4, prompt_tokens=768, device_hit_tokens=192, host_hit_tokens=128,
                             evicted_device_tokens=320, evicted_host_tokens=0)
    d = r.to_dict()
    assert d["hit_rate"] == pytest.approx(320 / 768)
    assert d["device_hit_rate"] == pytest.approx(192 / 768)
    assert d["host_hit_rate"] == pytest.approx(128 / 768)


def test_the_same_trace_without_a_host_tier_recomputes_what_was_evicted():
    r = replay_trace(TRACE, capacity_tokens=256, block_tokens=64, page_tokens=64)
    assert (r.device_hit_tokens, r.host_hit_tokens) == (192, 0)
    assert (r.evicted_device_tokens, r.evicted_host_tokens) == (320, 0)


def test_lru_thrashes_on_a_cycle_one_prompt_larger_than_the_pool():
    trace = [(tuple(10 * p + b for b in range(3)), 192) for p in range(4)] * 3
    gpu = replay_trace(trace, capacity_tokens=3 * 192, block_tokens=64, page_tokens=64)
    assert gpu.hit_rate == 0.0 and gpu.evicted_device_tokens == (12 - 3) * 192
    host = replay_trace(trace, capacity_tokens=3 * 192, block_tokens=64, page_tokens=64, host_tokens=8 * 192)
    # After the first round everything comes back from the host tier.
    assert (host.device_hit_tokens, host.host_hit_tokens) == (0, 8 * 192)


def test_unhashed_tails_are_private_and_pages_cut_the_match():
    # 200 tokens: three 64-token blocks and an 8-token private tail; only
    # whole pages are cached, so a repeat hits 192 tokens.
    trace = [((1, 2, 3), 200), ((1, 2, 3), 200), ((1, 2), 150)]
    r = replay_trace(trace, capacity_tokens=10_000, block_tokens=64, page_tokens=64)
    assert r.device_hit_tokens == 192 + 128
    assert r.prompt_tokens == 550
    # A block cut short by the prompt's end is a prefix of the full block:
    # finer pages keep more of it (96 of 100 tokens with 16-token pages, the
    # first block only with 64-token pages).
    trace = [((1, 2), 100), ((1, 2), 150)]
    r16 = replay_trace(trace, capacity_tokens=10_000, block_tokens=64, page_tokens=16)
    r64 = replay_trace(trace, capacity_tokens=10_000, block_tokens=64, page_tokens=64)
    assert (r16.device_hit_tokens, r64.device_hit_tokens) == (96, 64)


def test_an_empty_trace():
    r = replay_trace([], capacity_tokens=1024, block_tokens=64)
    assert r.requests == 0 and r.hit_rate == 0.0 and r.to_dict()["device_hit_rate"] == 0.0
