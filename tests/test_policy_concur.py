"""CONCUR's window law and turn-boundary admission on hand-made signals."""

from __future__ import annotations

import math

import pytest

from basin.policy.base import Admission, EngineNeeds
from basin.policy.concur import ConcurParams, ConcurPolicy
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class
from policy_helpers import info, signals


def _policy(window: float, agents: int = 0, **kw) -> ConcurPolicy:
    p = ConcurPolicy(ConcurParams(w_init=window, **kw))
    for uid in range(agents):
        p.active[uid] = (True, float(uid))
    return p


def test_registered_with_the_papers_constants():
    assert policy_class("concur") is ConcurPolicy
    p = ConcurPolicy()
    q = p.params
    assert (q.alpha, q.beta, q.u_low, q.u_high, q.h_thresh, q.tick_s) == (2.0, 0.5, 0.2, 0.5, 0.7, 1.0)
    assert (p.window, q.w_min, q.w_max) == (4.0, 1.0, None)
    assert p.needs == EngineNeeds()


def test_additive_increase_below_u_low():
    p = _policy(10.0, agents=50)
    assert p.update_window(0.1, 0.9) == 12.0
    assert p.update_window(0.19, float("nan")) == 14.0


def test_multiplicative_decrease_needs_high_usage_and_a_low_hit_rate():
    p = _policy(40.0, agents=50)
    assert p.update_window(0.6, 0.65) == 20.0
    assert p.update_window(0.6, 0.75) == 20.0   # reuse still fine: hold
    assert p.update_window(0.45, 0.1) == 20.0   # usage in the hold band
    assert p.update_window(0.9, math.nan) == 20.0  # hit rate not measured yet


def test_window_is_clamped_to_the_population_and_to_w_min():
    p = _policy(10.0, agents=11)
    assert p.update_window(0.0, 0.9) == 11.0
    for _ in range(10):
        p.update_window(0.9, 0.1)
    assert p.window == 1.0
    fixed = _policy(10.0, agents=3, w_max=100.0)
    assert fixed.update_window(0.0, 0.9) == 12.0


def test_new_agents_enter_only_below_the_window_with_nothing_waiting():
    p = _policy(3.0)
    for uid in range(3):
        assert p.on_session_arrival(info(uid), signals()) is Admission.ADMIT
    assert p.on_session_arrival(info(3), signals()) is Admission.PARK
    del p.active[0]
    # Room now, but an agent is waiting: the newcomer queues behind it.
    assert p.on_session_arrival(info(4), signals()) is Admission.PARK
    d = p.control(signals(1.0, decode_used_fraction=0.3), [3, 4])
    assert d.release == (3,)
    assert list(p.parked) == [4]


def test_over_the_window_the_agents_nearest_a_boundary_are_paused():
    p = _policy(5.0)
    p.active = {1: (True, 10.0), 2: (False, 12.0), 3: (True, 5.0), 4: (False, 14.0), 5: (True, 8.0),
                6: (True, 20.0), 7: (True, 1.0)}
    # 7 active, window 3 after the decrease (usage high, reuse low).
    p.window = 6.0
    d = p.control(signals(30.0, decode_used_fraction=0.8, hit_rate=0.4), [])
    assert p.limit == 3
    # Between calls first (latest finished first), then in flight (issued earliest first).
    assert d.pause == (4, 2, 7, 3)
    assert set(p.active) == {1, 5, 6} and list(p.paused) == [4, 2, 7, 3]


def test_paused_agents_resume_fifo_before_parked_agents_are_released():
    p = _policy(2.0)
    p.active = {1: (True, 0.0)}
    p.paused = {5: None, 3: None}
    p.parked = {9: None}
    d = p.control(signals(1.0, decode_used_fraction=0.1), [9])   # W: 2 -> 4
    assert d.resume == (5, 3) and d.release == (9,)
    assert set(p.active) == {1, 5, 3, 9}


def test_turn_boundaries_update_the_active_agents():
    p = _policy(4.0)
    p.on_session_arrival(info(1), signals(0.0))
    p.on_call_finished(1, 1000, False, 3.0)
    assert p.active[1] == (False, 3.0)
    p.on_call_issued(1, 1100, 4.0)
    assert p.active[1] == (True, 4.0)
    p.on_session_finished(1, 9.0)
    assert not p.active


def test_params_refuse_wrong_types_and_out_of_range_values():
    assert ConcurParams(w_init=4, w_max=8).w_max == 8.0
    with pytest.raises(PolicyParamError, match="policy 'concur', parameter 'alpha'.*a number"):
        ConcurParams(alpha="2")
    with pytest.raises(PolicyParamError, match="parameter 'w_max'.*a number"):
        ConcurParams(w_max=True)
    with pytest.raises(PolicyParamError, match="parameter 'beta'.*\\(0, 1\\]"):
        ConcurParams(beta=1.5)
    with pytest.raises(PolicyParamError, match="parameter 'beta'"):
        ConcurParams(beta=0.0)
    with pytest.raises(PolicyParamError, match="parameter 'u_low'"):
        ConcurParams(u_low=-0.1)
    with pytest.raises(PolicyParamError, match="parameter 'u_high'.*u_low"):
        ConcurParams(u_low=0.6, u_high=0.5)
    with pytest.raises(PolicyParamError, match="parameter 'h_thresh'"):
        ConcurParams(h_thresh=70.0)
    with pytest.raises(PolicyParamError, match="parameter 'w_min'.*>= 1"):
        ConcurParams(w_min=0.5, w_init=0.5)
    with pytest.raises(PolicyParamError, match="parameter 'w_init'.*w_min"):
        ConcurParams(w_init=2.0, w_min=3.0)
    with pytest.raises(PolicyParamError, match="parameter 'w_max'.*w_init"):
        ConcurParams(w_init=4.0, w_max=3.0)
    with pytest.raises(PolicyParamError, match="parameter 'tick_s'"):
        ConcurParams(tick_s=0.0)
    with pytest.raises(PolicyParamError, match="parameter 'gamma': unknown; known parameters: alpha, beta"):
        ConcurParams.from_mapping({"gamma": 1.0})


def test_update_params_changes_the_law_and_a_bad_update_keeps_the_old_settings():
    p = _policy(10.0, agents=50)
    assert p.update_window(0.1, 0.9) == 12.0
    p.update_params(alpha=5.0, tick_s=2.0)
    assert p.update_window(0.1, 0.9) == 17.0           # the window is run state: kept
    assert p.control(signals(1.0, decode_used_fraction=0.5), []).next_tick_s == 2.0
    p.update_params(w_max=15.0)
    assert p.update_window(0.3, 0.9) == 15.0           # clamped by the new bound at once
    before = p.params
    with pytest.raises(PolicyParamError, match="w_max"):
        p.update_params(w_max=2.0)                     # below w_init
    with pytest.raises(PolicyParamError, match="beta"):
        p.update_params(alpha=1.0, beta=2.0)
    assert p.params is before and p.params.alpha == 5.0
