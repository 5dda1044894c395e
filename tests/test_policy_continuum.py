"""Continuum's decision rules on hand-made event sequences, and the decode
instance's youngest-program retraction under ordered queues."""

from __future__ import annotations

import pytest
from policy_helpers import info, signals

from basin.policy.continuum import PINNED_OFFSET, ContinuumPolicy
from basin.policy.registry import make_policy
from basin.sim.config import load_hardware
from basin.sim.decode import DecodeInstance
from basin.sim.events import EventLoop
from basin.sim.sessions import Request, SessionState
from basin.workload.records import Call, Session


def _arrive(p: ContinuumPolicy, uid: int, t: float) -> None:
    p.on_session_arrival(info(uid, arrival_s=t), signals(t))
    p.on_call_issued(uid, 10_000, t)


def test_registered_and_orders_both_queues():
    p = make_policy("continuum")
    assert isinstance(p, ContinuumPolicy)
    d = p.control(signals(0.0), parked=[4, 7])
    assert d.order_by_priority and d.release == (4, 7)


def test_unpinned_sessions_are_ordered_by_program_age_not_call_time():
    p = ContinuumPolicy()
    _arrive(p, 1, 10.0)
    _arrive(p, 2, 5.0)
    # Session 1 issues a later call long after session 2's first: still ordered by arrival.
    assert p.on_call_finished(1, 12_000, False, 100.0) == 2.0  # nothing observed yet: pinned
    p.on_call_issued(1, 12_500, 150.0)  # the pin (2 s) has long expired
    assert p.priority_key(1) == 10.0
    assert p.priority_key(2) == 5.0


def test_a_call_issued_while_pinned_sorts_before_every_unpinned_one():
    p = ContinuumPolicy()
    _arrive(p, 1, 50.0)   # young program
    _arrive(p, 2, 0.0)    # old program
    ttl = p.on_call_finished(1, 12_000, False, 100.0)
    assert ttl == 2.0
    p.on_call_issued(1, 12_300, 101.0)   # within the TTL
    assert p.priority_key(1) == 50.0 - PINNED_OFFSET
    assert p.priority_key(1) < p.priority_key(2)
    # Among pinned programs the older goes first.
    p.on_call_finished(2, 11_000, False, 200.0)
    p.on_call_issued(2, 11_100, 200.5)
    assert p.priority_key(2) < p.priority_key(1)


def test_fixed_rule_pins_only_tool_classes_with_short_mean_durations():
    p = ContinuumPolicy()
    _arrive(p, 1, 0.0)
    assert p.on_call_finished(1, 11_000, False, 10.0) == 2.0
    p.on_call_issued(1, 11_500, 11.0)      # observed 1 s
    assert p.on_call_finished(1, 12_000, False, 20.0) == 2.0
    p.on_call_issued(1, 12_500, 30.0)      # observed 10 s: mean 5.5 s > 2 s
    assert p.on_call_finished(1, 13_000, False, 40.0) == 0.0
    # The last call never pins.
    assert ContinuumPolicy().on_call_finished(9, 1000, True, 1.0) == 0.0


def test_session_classes_are_separate_and_global_class_pools_them():
    per_session = ContinuumPolicy()
    pooled = ContinuumPolicy(tool_class="global")
    for p in (per_session, pooled):
        _arrive(p, 1, 0.0)
        _arrive(p, 2, 0.0)
        p.on_call_finished(1, 11_000, False, 10.0)
        p.on_call_issued(1, 11_500, 40.0)  # a 30 s tool call of session 1
    assert per_session.on_call_finished(2, 11_000, False, 50.0) == 2.0
    assert pooled.on_call_finished(2, 11_000, False, 50.0) == 0.0


def _observe(p: ContinuumPolicy, uid: int, gaps: list[float]) -> float:
    t = 0.0
    for g in gaps:
        p.on_call_finished(uid, 20_000, False, t)
        t += g
        p.on_call_issued(uid, 20_000, t)
        t += 1.0
    return t


def test_utility_rule_covers_the_observed_gaps_when_holding_is_free():
    p = ContinuumPolicy(ttl_mode="utility")
    _arrive(p, 1, 0.0)
    p.control(signals(0.0), [])  # idle engine: holding memory costs nothing
    t = _observe(p, 1, [0.5, 1.0, 3.0, 8.0, 20.0, 90.0])
    ttl = p.on_call_finished(1, 20_000, False, t)
    assert ttl == pytest.approx(20.0)  # the largest observed duration within tau_max (60 s)


def test_utility_rule_shortens_the_pin_when_queues_wait_and_context_is_large():
    p = ContinuumPolicy(ttl_mode="utility")
    _arrive(p, 1, 0.0)
    busy = signals(0.0, prefill_queue_requests=50, prefill_backlog_tokens=500_000, decode_wait_requests=10,
                   gpu_cache_tokens=100_000, host_cache_tokens=0)
    p.control(busy, [])
    t = _observe(p, 1, [0.5, 0.6, 0.7, 30.0, 40.0, 50.0])
    ttl = p.on_call_finished(1, 60_000, False, t)
    # Holding 60K of a 100K GPU-only cache for tens of seconds costs more
    # than it saves; the short gaps are still worth covering.
    assert ttl == pytest.approx(0.7)
    # A small context is worth holding through the long gaps too.
    assert p.on_call_finished(1, 5_000, False, t + 50.0) == pytest.approx(50.0)
    # With a host tier the reload is cheap (5 ms), and nothing is worth pinning.
    p.control(signals(0.0, prefill_queue_requests=50, decode_wait_requests=10, gpu_cache_tokens=100_000,
                      host_cache_tokens=200_000), [])
    assert p.on_call_finished(1, 60_000, False, t + 100.0) == 0.0


def test_unknown_mode_is_rejected():
    with pytest.raises(Exception):
        make_policy("continuum", ttl_mode="lfu")


# ---------------------------------------------------------------- engine
def _decode_with(prompts_prios: list[tuple[int, float]], kv_tokens: int, ordered: bool):
    loop = EventLoop()
    hw = load_hardware("h100-nvl")
    profile = hw.decode.model_copy(update={"kv_tokens": kv_tokens, "reserve_output_tokens": 16})
    dec = DecodeInstance(0, profile, hw.itl_slo_s, loop, lambda r: None, lambda r: None)
    dec.set_ordered(ordered)
    session = Session("x", (Call(1000, 1000, 5000),))
    reqs = []
    for uid, (prompt, prio) in enumerate(prompts_prios):
        s = SessionState(uid, session, "base", 0.0, 0, None)
        r = Request(s, 0, [], uid + 1, 0.0)
        r.prompt, r.output, r.decode_steps = prompt, 5000, 4999
        r.prio = prio
        dec.request_memory(r)
        reqs.append(r)
    for r in reqs:
        dec.join(r)
    return loop, dec, reqs


def _first_retracted(loop, reqs):
    while not any(r.retractions for r in reqs):
        loop.run(loop.now + 0.05)
    return [r.retractions for r in reqs]


def test_ordered_decode_retracts_the_youngest_program_first():
    # Joined in uid order; uid 1 has the largest key (the youngest program).
    # Memory runs out as the requests grow past their reservation.
    loop, dec, reqs = _decode_with([(1000, 1.0), (1000, 9.0), (1000, 2.0), (1000, 3.0)], 4200, ordered=True)
    assert _first_retracted(loop, reqs) == [0, 1, 0, 0]


def test_unordered_decode_retracts_the_latest_joined():
    loop, dec, reqs = _decode_with([(1000, 1.0), (1000, 9.0), (1000, 2.0), (1000, 3.0)], 4200, ordered=False)
    assert _first_retracted(loop, reqs) == [0, 0, 0, 1]
