"""The composition: ThunderAgent's admission, Continuum's ordering and pins,
Crossflow's borrowing, wired as one policy."""

from __future__ import annotations

import pytest

from basin.catalog import load_hardware
from basin.errors import BasinInputError
from basin.policy.base import Admission, BorrowSettings
from basin.policy.composition import CompositionParams, CompositionPolicy
from basin.policy.continuum import PINNED_OFFSET, ContinuumParams, ReloadCosts
from basin.policy.crossflow import CrossflowParams
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class
from basin.policy.thunderagent import ThunderAgentParams
from policy_helpers import info, signals

H200_COSTS = ReloadCosts.from_prefill(load_hardware("h200").prefill)


def test_registered_and_declares_borrowing_and_pins():
    assert policy_class("composition") is CompositionPolicy
    p = CompositionPolicy(CompositionParams.from_mapping({"crossflow": {"chunk_charge_s": 0.02}}))
    assert p.needs.decode_prefill_borrowing == BorrowSettings(chunk_charge_s=0.02)
    assert p.needs.prefix_pins
    assert set(p.needs.required()) == {"prefix-cache TTL pins", "prefill on decode instances"}
    assert CompositionPolicy().needs.decode_prefill_borrowing == BorrowSettings()


def test_params_nest_the_parts_and_refuse_bad_values_naming_the_field():
    q = CompositionParams.from_mapping({"thunderagent": {"decay": "none"}, "continuum": {"tool_class": "global"}})
    assert q.thunderagent == ThunderAgentParams(decay="none")
    assert q.continuum == ContinuumParams(tool_class="global") and q.crossflow == CrossflowParams()
    p = CompositionPolicy(q)
    assert p.admission.params is q.thunderagent and p.ordering.params is q.continuum
    assert CompositionParams() == CompositionParams(ThunderAgentParams(), ContinuumParams(), CrossflowParams())
    with pytest.raises(PolicyParamError, match="policy 'composition', parameter 'crossflow'"):
        CompositionParams(crossflow=0.1)
    with pytest.raises(PolicyParamError, match="policy 'composition', parameter 'continuum'"):
        CompositionParams(continuum=CrossflowParams())      # another part's parameters
    with pytest.raises(PolicyParamError, match="policy 'crossflow', parameter 'margin'"):
        CompositionParams.from_mapping({"crossflow": {"margin": 1.5}})
    with pytest.raises(PolicyParamError, match="policy 'thunderagent', parameter 'capacity'"):
        CompositionParams.from_mapping({"thunderagent": {"capacity": "host"}})
    with pytest.raises(PolicyParamError,
                       match="policy 'crossflow', parameter 'lease': unknown; known parameters: margin"):
        CompositionParams.from_mapping({"crossflow": {"lease": 3}})
    with pytest.raises(PolicyParamError, match="parameter 'margin': unknown; known parameters: thunderagent"):
        CompositionParams.from_mapping({"margin": 0.1})


def test_continuums_utility_rule_needs_the_costs_forwarded():
    utility = CompositionParams(continuum=ContinuumParams(ttl_mode="utility"))
    with pytest.raises(BasinInputError, match="ttl_mode.*reload costs"):
        CompositionPolicy(utility)
    p = CompositionPolicy(utility, costs=H200_COSTS)
    assert p.ordering.costs is H200_COSTS and p.ordering.params.ttl_mode == "utility"


def test_update_params_merges_into_a_part_and_a_bad_update_changes_nothing():
    p = CompositionPolicy()
    p.control(signals(0.0), [])
    p.update_params(crossflow={"margin": 0.2}, thunderagent={"capacity": "gpu", "tick_s": 2.0})
    assert p.params.crossflow == CrossflowParams(margin=0.2)
    assert p.needs.decode_prefill_borrowing == BorrowSettings(margin=0.2)
    assert p.admission.params.capacity == "gpu" and p.admission.capacity() == 100_000
    assert p.control(signals(1.0), []).next_tick_s == 2.0
    p.update_params(continuum=ContinuumParams(fixed_ttl_s=3.0))   # a parameter object replaces the part
    p.on_session_arrival(info(1, 1.0, 10_000), signals(1.0))
    p.on_call_issued(1, 10_000, 1.0)
    assert p.on_call_finished(1, 11_000, False, 5.0) == 3.0
    assert p.admission.programs[1].resident_until == 8.0
    before = p.params
    with pytest.raises(PolicyParamError, match="policy 'continuum', parameter 'ttl_mode'"):
        p.update_params(crossflow={"margin": 0.3}, continuum={"ttl_mode": "utility"})   # no costs
    with pytest.raises(PolicyParamError, match="policy 'thunderagent', parameter 'buffer'"):
        p.update_params(thunderagent={"buffer": -1})
    with pytest.raises(PolicyParamError, match="policy 'crossflow', parameter 'lease': unknown"):
        p.update_params(crossflow={"lease": 2})
    assert p.params is before
    assert p.ordering.params is before.continuum and p.admission.params is before.thunderagent


def test_admission_is_thunderagents_and_ordering_is_continuums():
    p = CompositionPolicy()
    d = p.control(signals(0.0), [])
    assert d.order_by_priority and d.next_tick_s == 5.0
    assert p.on_session_arrival(info(1, 10.0, 150_000), signals(10.0)) is Admission.ADMIT
    p.on_call_issued(1, 150_000, 10.0)
    assert p.on_session_arrival(info(2, 20.0, 60_000), signals(20.0)) is Admission.PARK  # over 200K
    assert p.priority_key(1) == 10.0
    ttl = p.on_call_finished(1, 151_000, False, 30.0)
    assert ttl == 2.0
    p.on_call_issued(1, 151_500, 31.0)
    assert p.priority_key(1) == 10.0 - PINNED_OFFSET


def test_a_pinned_program_counts_undecayed_in_the_resume_view():
    p = CompositionPolicy()
    p.control(signals(0.0), [])
    p.on_session_arrival(info(1, 0.0, 100_000), signals(0.0))
    p.on_call_issued(1, 100_000, 0.0)
    p.on_call_finished(1, 100_000, False, 10.0)          # pinned until 12 s
    room_pinned = p.admission.remaining(11.5, view="resume")
    room_after = p.admission.remaining(13.0, view="resume")
    assert room_pinned == 200_000 - 100_000 - 100
    assert room_after > 200_000 - 100_000  # the pin lapsed: the ACTING weight decays


def test_pausing_a_program_drops_its_pin_from_the_ledger():
    p = CompositionPolicy()
    p.control(signals(0.0), [])
    for uid, tok in ((1, 120_000), (2, 70_000)):
        p.on_session_arrival(info(uid, 0.0, tok), signals(0.0))
        p.on_call_issued(uid, tok, 0.0)
    p.on_call_finished(1, 125_000, False, 1.0)   # pinned, ACTING
    p.on_call_finished(2, 80_000, False, 1.0)    # pinned, ACTING: 205.2K > 200K
    d = p.control(signals(2.0), [])
    assert d.pause == (2,) and d.order_by_priority
    assert p.admission.programs[2].resident_until < 0
