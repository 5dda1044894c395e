"""ThunderAgent's decision rules on hand-made signal and event sequences."""

from __future__ import annotations

import pytest

from basin.policy.base import Admission, EngineNeeds
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class
from basin.policy.thunderagent import (
    ACTING,
    REASONING,
    Program,
    ThunderAgentParams,
    ThunderAgentPolicy,
    best_fit_decreasing,
)
from policy_helpers import info, signals

# Capacity in these tests: max(gpu 100K, host 200K) = 200K tokens.


def _admit(p: ThunderAgentPolicy, uid: int, tokens: int, t: float = 0.0) -> Admission:
    a = p.on_session_arrival(info(uid, arrival_s=t, prompt=tokens), signals(t))
    if a is Admission.ADMIT:
        p.on_call_issued(uid, tokens, t)
    return a


def _finish(p: ThunderAgentPolicy, uid: int, tokens: int, t: float) -> None:
    p.on_call_finished(uid, tokens, False, t)


def test_capacity_is_the_larger_cache_tier_and_ticks_every_5_s():
    assert policy_class("thunderagent") is ThunderAgentPolicy
    p = ThunderAgentPolicy()
    assert p.needs == EngineNeeds()
    d = p.control(signals(0.0, gpu_cache_tokens=100_000, host_cache_tokens=250_000), [])
    assert p.capacity() == 250_000 and d.next_tick_s == 5.0
    p.control(signals(0.0, gpu_cache_tokens=100_000, host_cache_tokens=0), [])
    assert p.capacity() == 100_000
    gpu_only = ThunderAgentPolicy(ThunderAgentParams(capacity="gpu"))
    gpu_only.control(signals(0.0), [])
    assert gpu_only.capacity() == 100_000


def test_ledger_counts_reasoning_acting_and_a_buffer_per_program():
    p = ThunderAgentPolicy()
    p.control(signals(0.0), [])
    _admit(p, 1, 50_000)
    _admit(p, 2, 30_000)
    _finish(p, 2, 31_000, 10.0)
    assert p.programs[1].status == REASONING and p.programs[2].status == ACTING
    assert p.remaining(10.0) == 200_000 - 50_000 - 31_000 - 200
    # The resume view decays ACTING programs by 2^-t.
    assert p.remaining(12.0, view="resume") == 200_000 - 50_000 - 31_000 * 0.25 - 200


def test_new_sessions_are_admitted_while_they_fit_and_held_otherwise():
    p = ThunderAgentPolicy()
    p.control(signals(0.0), [])
    assert _admit(p, 1, 120_000) is Admission.ADMIT
    assert _admit(p, 2, 70_000) is Admission.ADMIT
    assert _admit(p, 3, 20_000) is Admission.PARK        # 190.2K used: 9.8K left
    assert _admit(p, 4, 1_000) is Admission.PARK         # fits, but work is waiting


def test_pause_takes_the_smallest_acting_program_first_then_marks_reasoning():
    p = ThunderAgentPolicy()
    p.control(signals(0.0), [])
    for uid, tok in ((1, 60_000), (2, 50_000), (3, 40_000), (4, 30_000)):
        _admit(p, uid, tok)
    _finish(p, 3, 40_000, 1.0)
    _finish(p, 4, 30_000, 1.0)
    # The contexts grow past the capacity (tokens update when calls finish).
    _finish(p, 1, 90_000, 2.0)
    p.on_call_issued(1, 90_000, 2.5)
    _finish(p, 2, 60_000, 2.0)
    p.on_call_issued(2, 60_000, 2.5)
    # used = 90K + 60K (reasoning) + 40K + 30K (acting) + 400 = 220.4K: 20.4K over.
    d = p.control(signals(5.0), [])
    assert d.pause == (4,)          # the smallest ACTING program covers 30.1K
    assert p.programs[4].paused and not p.programs[3].paused
    # Grow again so that no ACTING program is left to pause.
    p.on_call_issued(3, 40_000, 6.0)
    _finish(p, 1, 120_000, 7.0)
    p.on_call_issued(1, 120_000, 7.5)
    # used = 120K + 60K + 40K + 300 = 220.3K: 20.3K over; marking stops at the
    # smallest REASONING program whose tokens cover it.
    d = p.control(signals(10.0), [])
    assert d.pause == (3,)
    assert p.programs[3].marked and not p.programs[3].paused
    # A marked program is paused when its call finishes, not before.
    _finish(p, 3, 41_000, 12.0)
    assert p.programs[3].paused and not p.programs[3].marked


def test_mark_all_reproduces_the_code_quirk():
    p = ThunderAgentPolicy(ThunderAgentParams(mark_all=True))
    p.control(signals(0.0), [])
    _admit(p, 1, 90_000)
    _admit(p, 2, 60_000)
    p.programs[3] = Program(3, 55_000, 0.0, admitted=True)   # all three REASONING, 5.2K over
    d = p.control(signals(5.0), [])
    assert set(d.pause) == {1, 2, 3}
    paper = ThunderAgentPolicy()
    paper.control(signals(0.0), [])
    _admit(paper, 1, 90_000)
    _admit(paper, 2, 60_000)
    paper.programs[3] = Program(3, 55_000, 0.0, admitted=True)
    assert paper.control(signals(5.0), []).pause == (3,)


def test_resume_order_pending_first_then_new_then_acting_shortest_first():
    p = ThunderAgentPolicy(ThunderAgentParams(decay="none"))
    p.control(signals(0.0), [])
    _admit(p, 1, 150_000)
    p.programs[2] = Program(2, 20_000, 0.0, admitted=True, paused=True, pending=True, held_since=1.0)
    p.programs[6] = Program(6, 12_000, 0.0, admitted=True, paused=True, pending=True, held_since=1.0)
    p.programs[3] = Program(3, 10_000, 0.0, admitted=True, paused=True, status=ACTING)
    p.parked[4] = Program(4, 5_000, 1.0)
    p.parked[5] = Program(5, 8_000, 2.0)
    assert [q.uid for q in p.resume_order()] == [6, 2, 4, 5, 3]
    # Room: 200K - 150.1K = 49.9K; taken in order while they fit:
    # 6 (12.1K), 2 (20.1K), 4 (5.1K), 5 (8.1K) = 45.4K; 3 (10.1K) does not fit.
    d = p.control(signals(5.0), [4, 5])
    assert d.resume == (6, 2) and d.release == (4, 5)
    assert p.programs[3].paused and not p.parked


def test_resume_stops_at_the_first_program_that_does_not_fit():
    p = ThunderAgentPolicy(ThunderAgentParams(decay="none"))
    p.control(signals(0.0), [])
    _admit(p, 1, 170_000)
    _admit(p, 2, 40_000)   # parked: does not fit
    _admit(p, 3, 1_000)    # parked: work is waiting
    d = p.control(signals(5.0), [2, 3])
    # 2 (40K) comes after 3 (1K) in the NEW group (shortest first).
    assert d.release == (3,)
    assert list(p.parked) == [2]


def test_forced_resume_after_30_minutes():
    p = ThunderAgentPolicy()
    p.control(signals(0.0), [])
    _admit(p, 1, 199_000)
    assert _admit(p, 2, 50_000, t=10.0) is Admission.PARK
    p.programs[1].paused = False
    d = p.control(signals(1000.0), [2])
    assert d.release == ()
    d = p.control(signals(1810.0), [2])
    assert d.release == (2,)
    # A held call of a paused program is forced through as well.
    q = ThunderAgentPolicy()
    q.control(signals(0.0), [])
    _admit(q, 1, 199_000)
    _admit(q, 3, 150_000)  # parked
    q.programs[1].paused = True
    q.on_call_held(1, 100.0)
    assert q.programs[1].pending and q.programs[1].status == REASONING
    assert 1 not in q.control(signals(1800.0), [3]).resume
    assert 1 in q.control(signals(1900.0), [3]).resume


def test_a_program_resumed_in_a_tick_is_not_paused_in_the_same_tick():
    p = ThunderAgentPolicy(ThunderAgentParams(decay="resume"))
    p.control(signals(0.0), [])
    _admit(p, 1, 150_000)
    _finish(p, 1, 150_000, 0.0)
    _admit(p, 2, 60_000)   # parked: 150.1K (acting, undecayed) + 60.1K > 200K
    # Ten seconds later the decayed resume view has room; the pause view does not.
    d = p.control(signals(10.0), [2])
    assert d.release == (2,)
    assert 2 not in d.pause and d.pause == (1,)


def test_params_refuse_wrong_types_and_out_of_range_values():
    assert ThunderAgentParams(tick_s=5, capacity_scale=1).tick_s == 5.0
    with pytest.raises(PolicyParamError, match="policy 'thunderagent', parameter 'decay'.*'none', 'resume', 'both'"):
        ThunderAgentParams(decay="half")
    with pytest.raises(PolicyParamError, match="parameter 'capacity'"):
        ThunderAgentParams(capacity="host")
    with pytest.raises(PolicyParamError, match="parameter 'buffer'.*whole number"):
        ThunderAgentParams(buffer=100.5)
    with pytest.raises(PolicyParamError, match="parameter 'mark_all'.*true or false"):
        ThunderAgentParams(mark_all="yes")
    with pytest.raises(PolicyParamError, match="parameter 'buffer'.*>= 0"):
        ThunderAgentParams(buffer=-1)
    with pytest.raises(PolicyParamError, match="parameter 'decay_half_life_s'.*> 0"):
        ThunderAgentParams(decay_half_life_s=0.0)
    with pytest.raises(PolicyParamError, match="parameter 'capacity_scale'"):
        ThunderAgentParams(capacity_scale=0.0)
    with pytest.raises(PolicyParamError, match="parameter 'tick_s'"):
        ThunderAgentParams(tick_s=-5.0)
    with pytest.raises(PolicyParamError, match="parameter 'force_after_s'"):
        ThunderAgentParams(force_after_s=-1.0)
    with pytest.raises(PolicyParamError, match="parameter 'acting_weight'"):
        ThunderAgentParams(acting_weight=-0.5)


def test_update_params_changes_the_ledger_and_a_bad_update_keeps_the_old_settings():
    p = ThunderAgentPolicy()
    p.control(signals(0.0), [])
    _admit(p, 1, 50_000)
    assert p.remaining(0.0) == 200_000 - 50_000 - 100
    p.update_params(capacity="gpu", buffer=1000)
    assert p.remaining(0.0) == 100_000 - 50_000 - 1000
    assert _admit(p, 2, 49_500) is Admission.PARK          # fitted under the old bound
    before = p.params
    with pytest.raises(PolicyParamError, match="capacity_scale"):
        p.update_params(capacity_scale=-2.0)
    with pytest.raises(PolicyParamError, match="decay"):
        p.update_params(capacity="sum", decay="always")   # one bad field: nothing changes
    assert p.params is before and p.params.capacity == "gpu"
    p.update_params(tick_s=2.0, capacity="sum")
    d = p.control(signals(1.0), [2])
    assert d.next_tick_s == 2.0 and d.release == (2,)       # 300K now: room for the parked session


def test_best_fit_decreasing_places_largest_first_on_the_roomiest_backend():
    placed = best_fit_decreasing({1: 50, 2: 30, 3: 30, 4: 5}, [70, 60], buffer=1)
    # 1 -> backend 0 (19 left), 2 -> backend 1 (29 left), 3 fits nowhere, 4 -> backend 1.
    assert placed == {1: 0, 2: 1, 4: 1}
    assert best_fit_decreasing({1: 100}, [50, 40], buffer=1) == {}


def test_engine_reports_held_calls_and_keeps_its_invariants():
    from test_sim_engine import CheckedSimulator, config, make_arrivals, make_sessions

    class Recording(ThunderAgentPolicy):
        held = 0

        def on_call_held(self, uid, now_s):
            Recording.held += 1
            super().on_call_held(uid, now_s)

    sessions = make_sessions(40, seed=31, calls=(10, 20))
    arrivals = make_arrivals(sessions, 20.0, 900.0, seed=32)
    policy = Recording(ThunderAgentParams(capacity_scale=0.05))   # a tight bound: pauses and parking happen
    result = CheckedSimulator(config(arrivals, 900.0), policy).run()
    assert Recording.held > 0
    assert result.timeseries["parked_sessions"].max() > 0
    s = result.sessions
    started = s["first_admitted_s"] == s["first_admitted_s"]
    assert started.sum() > 0
