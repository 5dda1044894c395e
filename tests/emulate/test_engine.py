"""The simulator's instances driven call by call: timings against the
calibrated costs, prefix reuse, the host tier, priority order under load,
withdrawal, refusals and determinism. No HTTP, no wall clock."""

from __future__ import annotations

import math

import pytest

from basin.catalog import load_deployment, load_hardware, with_host_ratio
from basin.emulate.calls import ChatCall, RequestError, parse_chat, queue_priority
from basin.emulate.engine import EmulatedCall, EmulatedEngine


def engine(name: str = "1p3d-h200", host_ratio: float | None = None) -> EmulatedEngine:
    dep = with_host_ratio(load_deployment(name), host_ratio)
    return EmulatedEngine(load_hardware(dep.hardware), dep)


def call(key: tuple[tuple[int, int], ...], output: int = 32, priority: int = 0) -> ChatCall:
    return ChatCall(key=key, prompt_tokens=sum(n for _, n in key), output_tokens=output, limited=True,
                    priority=priority, stream=False, include_usage=False, model=None, affinity=str(key[0][0]),
                    digest=0)


def drain(e: EmulatedEngine) -> None:
    while e.next_due_s is not None:
        e.advance(e.next_due_s)


def test_an_unloaded_call_costs_what_the_calibrated_profile_says():
    e = engine()
    hw = e.hardware
    prompt, output = 6000, 200
    h = e.submit(call(((1, prompt),), output), 0.0, 5.0)
    drain(e)
    ttft = hw.prefill.step_overhead_s + hw.prefill.tokens_cost_s(prompt, 0) + hw.transfer_s
    m = output - 1
    a = hw.decode.step_s(1, prompt + 1)
    k = hw.decode.step_per_context_token_s
    assert h.arrival_s == 5.0
    assert h.ttft_s == pytest.approx(ttft, rel=1e-9)
    assert h.latency_s == pytest.approx(ttft + m * a + k * m * (m - 1) / 2, rel=1e-9)
    assert h.cached_tokens == 0 and e.generated(h) == output


def test_a_conversation_extended_by_messages_reuses_its_prefix():
    e = engine()
    msgs = [{"role": "system", "content": "s" * 8000}, {"role": "user", "content": "u" * 20000}]
    first = parse_chat({"messages": msgs, "max_tokens": 16})
    h1 = e.submit(first, 0.0, 0.0)
    drain(e)
    msgs += [{"role": "assistant", "content": "a" * 64}, {"role": "user", "content": "t" * 4000}]
    h2 = e.submit(parse_chat({"messages": msgs, "max_tokens": 16}), 0.0, 10.0)
    drain(e)
    page = e.hardware.page_tokens
    assert h1.cached_tokens == 0
    assert h2.cached_tokens == first.prompt_tokens - first.prompt_tokens % page
    assert h2.ttft_s < h1.ttft_s  # the reused prefix is not recomputed


def test_the_host_tier_keeps_what_the_gpu_cache_evicted():
    def revisit(host_ratio: float) -> int:
        e = engine("1p1d-h100", host_ratio)  # 1.09M-token GPU prefix cache
        t = 0.0
        for chunk in (1, 2, 3):  # 1.6M tokens in all: the first conversation leaves the GPU
            e.submit(call(((chunk, 530_000),), output=2), 0.0, t)
            drain(e)
            t = e.now + 1.0
        again = e.submit(call(((1, 530_000),), output=2), 0.0, t)
        drain(e)
        return again.cached_tokens

    assert revisit(0.0) == 0
    assert revisit(2.0) > 500_000


@pytest.mark.parametrize("style, low, high", [("sglang", 0, 10), ("vllm", 10, 0)])
def test_a_lower_priority_call_waits_behind_a_higher_one_under_load(style, low, high):
    def first_tokens(low_prio: int, high_prio: int) -> tuple[EmulatedCall, EmulatedCall]:
        e = engine()
        e.submit(call(((1, 60_000),)), 0.0, 0.0)  # keeps prefill busy for about a second
        slow = e.submit(call(((2, 3000),), priority=low_prio), queue_priority(low_prio, style), 0.05)
        fast = e.submit(call(((3, 3000),), priority=high_prio), queue_priority(high_prio, style), 0.06)
        drain(e)
        return slow, fast

    slow, fast = first_tokens(low, high)
    assert fast.first_token_s < slow.first_token_s
    # With equal priorities the queue is first come, first served.
    slow, fast = first_tokens(low, low)
    assert slow.first_token_s < fast.first_token_s


def test_a_call_withdrawn_before_its_prefill_frees_everything():
    e = engine()
    busy = e.submit(call(((1, 60_000),)), 0.0, 0.0)
    queued = e.submit(call(((2, 3000),)), 0.0, 0.01)
    assert not queued.started and e.withdraw(queued)
    assert busy.started and not e.withdraw(busy)  # a running call runs to its end
    drain(e)
    assert busy.finished and not queued.finished and e.calls_in_flight == 0
    assert all(p.cache.lock_handles == 0 and p.cache.inflight == 0 for p in e.cluster.prefills)
    assert all(d.used == 0 for d in e.cluster.decodes)


def test_calls_no_instance_could_hold_are_refused_naming_the_field():
    e = engine("1p1d-h100")
    with pytest.raises(RequestError) as err:
        e.check_fits(call(((1, 2_000_000),)))
    assert err.value.field == "messages"
    with pytest.raises(RequestError) as err:
        e.check_fits(call(((1, 1_000_000),), output=1_000_000))
    assert err.value.field == "max_tokens" and "at most" in err.value.message


def test_same_calls_at_same_times_give_same_timings():
    def run() -> list[tuple[float, float, int]]:
        e = engine("2P4D-h200")
        hs = [e.submit(call(((i % 5, 4000 + 500 * i), (100 + i, 700)), output=50 + i), float(i % 3), 0.02 * i)
              for i in range(40)]
        drain(e)
        return [(h.first_token_s, h.finished_s, h.cached_tokens) for h in hs]

    a, b = run(), run()
    assert a == b and all(math.isfinite(f) for _, f, _ in a)
