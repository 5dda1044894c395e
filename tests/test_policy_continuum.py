"""Continuum's decision rules on hand-made event sequences, and the decode
instance's youngest-program retraction under ordered queues."""

from __future__ import annotations

import pytest

from basin.catalog import load_hardware
from basin.errors import BasinInputError
from basin.policy.continuum import PINNED_OFFSET, ContinuumParams, ContinuumPolicy, ReloadCosts
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class
from basin.sim.decode import DecodeInstance
from basin.sim.events import EventLoop
from basin.sim.requests import Callbacks
from basin.sim.sessions import SessionState
from basin.workload.records import Call, Session
from policy_helpers import info, signals

#: The prefill costs the utility rule used to take as constructor defaults.
H200_COSTS = ReloadCosts.from_prefill(load_hardware("h200").prefill)


def _utility(**kw) -> ContinuumPolicy:
    return ContinuumPolicy(ContinuumParams(ttl_mode="utility", **kw), costs=H200_COSTS)


def _arrive(p: ContinuumPolicy, uid: int, t: float) -> None:
    p.on_session_arrival(info(uid, arrival_s=t), signals(t))
    p.on_call_issued(uid, 10_000, t)


def test_registered_and_orders_both_queues():
    assert policy_class("continuum") is ContinuumPolicy
    p = ContinuumPolicy()
    d = p.control(signals(0.0), parked=[4, 7])
    assert d.order_by_priority and d.release == (4, 7) and d.next_tick_s == 5.0
    # The TTL pins are part of the policy: a driver must provide them.
    assert p.needs.prefix_pins and p.needs.required() == ("prefix-cache TTL pins",)
    assert p.needs.decode_prefill_borrowing is None and not p.needs.decode_memory_lending


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
    pooled = ContinuumPolicy(ContinuumParams(tool_class="global"))
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
    p = _utility()
    _arrive(p, 1, 0.0)
    p.control(signals(0.0), [])  # idle engine: holding memory costs nothing
    t = _observe(p, 1, [0.5, 1.0, 3.0, 8.0, 20.0, 90.0])
    ttl = p.on_call_finished(1, 20_000, False, t)
    assert ttl == pytest.approx(20.0)  # the largest observed duration within tau_max (60 s)


def test_utility_rule_shortens_the_pin_when_queues_wait_and_context_is_large():
    p = _utility()
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
    with pytest.raises(PolicyParamError, match="ttl_mode.*'code', 'utility'"):
        ContinuumParams(ttl_mode="lfu")
    with pytest.raises(PolicyParamError, match="tool_class"):
        ContinuumParams.from_mapping({"tool_class": "bash"})


# ---------------------------------------------------------------- params
def test_params_refuse_wrong_types_out_of_range_values_and_unknown_names():
    assert ContinuumParams(fixed_ttl_s=3).fixed_ttl_s == 3.0       # an int for a float is fine
    with pytest.raises(PolicyParamError, match="policy 'continuum', parameter 'fixed_ttl_s'"):
        ContinuumParams(fixed_ttl_s="2 s")
    with pytest.raises(PolicyParamError, match="parameter 'n_min'.*whole number"):
        ContinuumParams(n_min=2.5)
    with pytest.raises(PolicyParamError, match="parameter 'threshold_s'.*>= 0"):
        ContinuumParams(threshold_s=-1.0)
    with pytest.raises(PolicyParamError, match="parameter 'n_min'.*between 1 and 64"):
        ContinuumParams(n_min=65)
    with pytest.raises(PolicyParamError, match="parameter 'tick_s'"):
        ContinuumParams(tick_s=0.0)
    with pytest.raises(PolicyParamError, match="parameter 'tau_max_s'"):
        ContinuumParams(tau_max_s=0.0)
    with pytest.raises(PolicyParamError, match="parameter 'linear_tokens_per_s': unknown; known parameters: ttl_mode"):
        ContinuumParams.from_mapping({"linear_tokens_per_s": 60500})   # a hardware fact, not a setting
    with pytest.raises(TypeError):
        ContinuumPolicy(ContinuumParams, costs=H200_COSTS)   # the class, not an instance


def test_update_params_changes_the_pin_and_a_bad_update_keeps_the_old_settings():
    p = ContinuumPolicy()
    _arrive(p, 1, 0.0)
    assert p.on_call_finished(1, 11_000, False, 10.0) == 2.0
    p.on_call_issued(1, 11_500, 13.0)           # observed 3 s: above the 2 s threshold
    assert p.on_call_finished(1, 12_000, False, 20.0) == 0.0
    p.update_params(threshold_s=5.0, fixed_ttl_s=4.0)
    assert p.on_call_finished(1, 12_000, False, 30.0) == 4.0
    assert p.pinned(1, 33.9) and not p.pinned(1, 34.1)
    before = p.params
    with pytest.raises(PolicyParamError, match="fixed_ttl_s"):
        p.update_params(fixed_ttl_s=-1.0)
    with pytest.raises(PolicyParamError, match="unknown"):
        p.update_params(ttl="code")
    assert p.params is before
    p.update_params(tick_s=1.0)
    assert p.control(signals(40.0), []).next_tick_s == 1.0


def test_the_utility_rule_without_reload_costs_is_refused():
    with pytest.raises(BasinInputError, match="ttl_mode.*reload costs"):
        ContinuumPolicy(ContinuumParams(ttl_mode="utility"))
    p = ContinuumPolicy()
    with pytest.raises(PolicyParamError, match="ttl_mode.*reload costs"):
        p.update_params(ttl_mode="utility")
    assert p.params.ttl_mode == "code"
    # The code rule runs without costs; handed costs, the switch is allowed.
    with_costs = ContinuumPolicy(costs=H200_COSTS)
    assert with_costs.update_params(ttl_mode="utility").ttl_mode == "utility"


def test_switching_to_the_utility_rule_uses_the_durations_seen_before():
    p = ContinuumPolicy(costs=H200_COSTS)
    _arrive(p, 1, 0.0)
    p.control(signals(0.0), [])
    t = _observe(p, 1, [0.5, 1.0, 3.0, 8.0, 20.0, 90.0])
    assert p.on_call_finished(1, 20_000, False, t) == 0.0        # code rule: mean gap 20 s
    p.on_call_issued(1, 20_000, t + 1.0)
    p.update_params(ttl_mode="utility")
    ttl = p.on_call_finished(1, 20_000, False, t + 2.0)
    assert ttl == pytest.approx(20.0)     # as test_utility_rule_covers_the_observed_gaps...


def test_reload_costs_from_a_prefill_profile():
    # The H200 profile gives exactly the constants the policy used to default to.
    assert H200_COSTS == ReloadCosts(linear_tokens_per_s=60500.0, attention_s_per_token_position=1.33e-10,
                                     load_tokens_per_s=4.0e6, backlog_tokens_per_s=55000.0)
    h100 = load_hardware("h100-nvl").prefill
    costs = ReloadCosts.from_prefill(h100)
    assert costs.linear_tokens_per_s == h100.linear_tokens_per_s
    assert costs.backlog_tokens_per_s == pytest.approx(h100.linear_tokens_per_s * 10 / 11)
    # A mapping works too, the instance count scales the drain, a measured rate wins.
    fields = {"linear_tokens_per_s": 36000, "attention_s_per_token_position": 2.24e-10, "load_tokens_per_s": 2e6}
    assert ReloadCosts.from_prefill(fields) == costs
    assert ReloadCosts.from_prefill(fields, prefill_instances=2).backlog_tokens_per_s == pytest.approx(
        2 * costs.backlog_tokens_per_s)
    assert ReloadCosts.from_prefill(fields, backlog_tokens_per_s=30000.0).backlog_tokens_per_s == 30000.0
    # Recompute from position 0: linear plus half the attention of the span.
    assert H200_COSTS.recompute_s(10_000) == pytest.approx(10_000 / 60500 + 1.33e-10 * 10_000 ** 2 / 2)
    with pytest.raises(BasinInputError, match="no 'load_tokens_per_s'"):
        ReloadCosts.from_prefill({"linear_tokens_per_s": 1.0, "attention_s_per_token_position": 0.0})
    with pytest.raises(BasinInputError, match="'linear_tokens_per_s' must be a finite number > 0"):
        ReloadCosts(0.0, 1e-10, 1e6, 1e4)
    with pytest.raises(BasinInputError, match="'attention_s_per_token_position'"):
        ReloadCosts(1e4, "fast", 1e6, 1e4)
    with pytest.raises(BasinInputError, match="prefill_instances"):
        ReloadCosts.from_prefill(h100, prefill_instances=0)


# ---------------------------------------------------------------- engine
def _decode_with(prompts_prios: list[tuple[int, float]], kv_tokens: int, ordered: bool):
    loop = EventLoop()
    hw = load_hardware("h100-nvl")
    profile = hw.decode.model_copy(update={"kv_tokens": kv_tokens, "reserve_output_tokens": 16})
    dec = DecodeInstance(0, profile, hw.itl_slo_s, loop, lambda r: None, Callbacks())
    dec.set_ordered(ordered)
    session = Session("x", (Call(1000, 1000, 5000),))
    reqs = []
    for uid, (prompt, prio) in enumerate(prompts_prios):
        s = SessionState(uid, session, "base", 0.0, 0, None)
        r = s.request(0, [], uid + 1, 0.0)
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
