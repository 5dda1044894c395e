"""BASIN's decision rules on hand-made signal sequences (section 6, Algorithm 1)."""

from __future__ import annotations

import math

from basin.catalog import load_hardware
from basin.policy.base import Admission, SessionInfo, Signals
from basin.policy.basin import BasinParams, BasinPolicy, BasinPriorPolicy, CliffSummary
from basin.sim.decode import DecodeInstance
from basin.sim.events import EventLoop
from basin.sim.lending import LendingConfig
from basin.sim.requests import Callbacks
from basin.sim.sessions import SessionState
from basin.workload.records import Call, Session

GPU = 1_000_000


class TablePredictor:
    """Predicts whatever the test says for a session id."""

    def __init__(self, peaks: dict[str, float] | None = None, default: float = 50_000):
        self.peaks = peaks or {}
        self.default = default

    def predict_peak_tokens(self, task_text, first_prompt_tokens, session_id, oracle_peak_tokens):
        return self.peaks.get(session_id, self.default)


def signals(now, active=10, mean_ctx=20_000, hit=0.95, backlog=0, decode_wait=0, rate=1.0, parked=0,
            lent=0) -> Signals:
    return Signals(
        now_s=now, active_sessions=active, parked_sessions=parked, working_set_tokens=int(active * mean_ctx),
        mean_context_tokens=mean_ctx, hit_rate=hit, prefill_queue_requests=0, prefill_backlog_tokens=backlog,
        decode_wait_requests=decode_wait, decode_used_fraction=0.3, arrival_rate_per_min=rate,
        gpu_cache_tokens=GPU, host_cache_tokens=0, lent_cache_tokens=lent, decode_kv_tokens=2 * GPU,
        effective_cache_tokens=GPU,
    )


def info(uid, arrival, first_prompt=5_000, sid=None) -> SessionInfo:
    return SessionInfo(uid, sid or f"s{uid}", "base", arrival, first_prompt)


def policy(**kw) -> BasinPolicy:
    predictor = TablePredictor(kw.pop("peaks", None))
    cliff = CliffSummary(kappa=1.0, x_knee=1.9, lambda_c_per_min=kw.pop("lambda_c", 5.0))
    return BasinPolicy(BasinParams(**kw), predictor=predictor, cliff=cliff)


def test_reference_budget_is_the_cliff_margin_capped_by_capacity():
    p = policy()
    p.control(signals(0.0, active=10), [])
    # B0 = min(m kappa x_k C, C) = min(0.9 * 1.9 * 1e6, 1e6)
    assert p.state.b0 == GPU
    p2 = BasinPolicy(predictor=TablePredictor(), cliff=CliffSummary(kappa=0.4))
    p2.control(signals(0.0, active=10), [])
    assert math.isclose(p2.state.b0, 0.9 * 0.4 * 1.9 * GPU)


def test_admission_activates_at_b0_and_releases_below_alpha_r_after_cooldown():
    p = policy(cooldown_s=60.0)
    assert not p.control(signals(0.0, active=40, mean_ctx=20_000), []).order_by_priority  # W = 0.8M
    p.control(signals(5.0, active=40), [])
    assert not p.state.admit
    p.control(signals(10.0, active=55), [])  # W = 1.1M >= B0
    assert p.state.admit
    # Between alpha_R B0 and B0: stays active (hysteresis).
    p.control(signals(15.0, active=45), [])  # 0.9M
    assert p.state.admit
    # Below alpha_R B0 but within the cool-down: still active.
    p.control(signals(40.0, active=30), [])  # 0.6M
    assert p.state.admit
    p.control(signals(80.0, active=30), [])
    assert not p.state.admit


def test_admission_never_exceeds_budget_except_with_no_residents():
    p = policy(peaks={f"s{i}": 300_000 for i in range(20)})
    for i in range(3):  # residents before admission engages
        assert p.on_session_arrival(info(i, float(i)), signals(float(i))) is Admission.ADMIT
    p.control(signals(10.0, active=60), [])  # engage admission: W = 1.2M
    assert p.state.admit
    parked = []
    for i in range(3, 10):
        decision = p.on_session_arrival(info(i, 10.0 + i), signals(10.0 + i, active=60))
        if decision is Admission.PARK:
            parked.append(i)
        assert p.state.reserved <= p.state.budget or p.state.residents == 1
    assert parked, "a 300K-token session cannot fit once 3 residents reserve 900K"
    for t in range(30, 200, 5):
        d = p.control(signals(float(t), active=60), parked)
        parked = [u for u in parked if u not in d.release]
        assert p.state.reserved <= max(p.state.budget, 300_000) + 1e-9
    # With every resident gone, the head enters even though it exceeds B.
    for uid in [u for u, s in p.sessions.items() if s.admitted]:
        p.on_session_finished(uid, 300.0)
    p.state.budget = 100_000.0
    d = p.control(signals(300.0, active=60), parked)
    assert len(d.release) == 1


def test_priority_is_fixed_at_the_first_call_and_favours_small_sessions():
    p = policy(peaks={"s1": 600_000, "s2": 30_000})
    p.on_session_arrival(info(1, 100.0), signals(100.0))
    p.on_session_arrival(info(2, 110.0), signals(110.0))
    k1, k2 = p.priority_key(1), p.priority_key(2)
    assert k1 == 100.0 + 600_000 / 30.0 and k2 == 110.0 + 30_000 / 30.0
    assert k2 < k1
    p.on_call_finished(1, 900_000, False, 500.0)
    p.on_call_issued(1, 950_000, 510.0)
    assert p.priority_key(1) == k1  # kept while the context grows
    # A session arriving after a_i + W_i / r never overtakes it.
    late = 100.0 + 600_000 / 30.0 + 1.0
    p.on_session_arrival(info(3, late), signals(late))
    assert p.priority_key(3) > k1


def test_prior_controller_orders_by_arrival():
    p = BasinPriorPolicy(cliff=CliffSummary())
    p.on_session_arrival(info(1, 5.0), signals(5.0))
    p.on_session_arrival(info(2, 7.0, first_prompt=100), signals(7.0))
    assert p.priority_key(1) == 5.0 and p.priority_key(2) == 7.0


def test_shedding_needs_excess_arrivals_and_a_stalled_head():
    p = policy(peaks={f"s{i}": 400_000 for i in range(10)}, lambda_c=5.0, cooldown_s=10_000.0)
    for i in range(3):
        p.on_session_arrival(info(i, 0.0), signals(0.0))
    p.control(signals(1.0, active=80), [])
    parked = [i for i in range(3, 6)
              if p.on_session_arrival(info(i, 2.0 + i), signals(2.0 + i, active=80)) is Admission.PARK]
    assert parked
    # Arrivals below lambda_c: never shed, however long the wait.
    d = p.control(signals(2000.0, active=80, rate=4.0), parked)
    assert d.shed == ()
    # Above lambda_c but the head has not waited T_s: no shedding.
    d = p.control(signals(300.0, active=80, rate=9.0), parked)
    assert d.shed == ()
    # Both: exactly one, the lowest-priority parked session.
    d = p.control(signals(2005.0, active=80, rate=9.0), parked)
    assert len(d.shed) == 1 and d.shed[0] == max(parked, key=lambda u: (400_000 / 30 + 2.0 + u))


def test_ordering_engages_on_a_persistent_backlog_only():
    p = policy(cooldown_s=30.0)
    assert not p.control(signals(0.0, backlog=100_000), []).order_by_priority  # one tick: not persistent
    assert p.control(signals(5.0, backlog=100_000), []).order_by_priority
    assert p.control(signals(20.0), []).order_by_priority  # cool-down
    assert not p.control(signals(60.0), []).order_by_priority


def test_budget_falls_when_reuse_falls_and_stays_in_range():
    p = policy(cooldown_s=10_000.0)
    p.control(signals(0.0, active=10, hit=0.95), [])  # learns the plateau
    p.control(signals(5.0, active=60, hit=0.95), [])
    b0 = p.state.b0
    for t in range(10, 400, 5):
        p.control(signals(float(t), active=60, hit=0.5), [1000])
        assert 0.5 * b0 - 1e-6 <= p.state.budget <= 2.0 * b0 + 1e-6
    assert p.state.budget < b0


def test_lent_memory_never_takes_what_a_decode_allocation_needs():
    hw = load_hardware("h100-nvl")
    loop = EventLoop()
    reserved: list[int] = []
    dec = DecodeInstance(0, hw.decode.model_copy(update={"kv_tokens": 100_000}), 0.05, loop,
                         lambda r: reserved.append(r.session), Callbacks())
    dec.lend(LendingConfig(cap_fraction=0.5))
    assert dec.lending is not None and dec.lending.adopt(7, 40_000, dec.free_beyond_demand())
    assert dec.lending.adopt(8, 40_000, dec.free_beyond_demand()) is False  # over the cap
    assert dec.lending.adopt(8, 9_000, dec.free_beyond_demand())
    session = Session("x", (Call(80_000, 80_000, 10),))
    s = SessionState(1, session, "base", 0.0, 0, None)
    req = s.request(0, [], 1, 0.0)
    dec.request_memory(req)  # needs 80.5K: the units give way
    assert reserved == [1]
    assert dec.used + dec.lent <= dec.capacity
    assert dec.lending.reclaimed >= 1
    dec.check()  # ROUTER-ROOM: the router saw the units come and go


def _engaged_with_parked(**kw):
    """A controller with the plateau learned (0.95), admission engaged and
    one session parked that no budget in these tests can fit."""
    p = policy(peaks={"s0": 800_000, "s1": 10 ** 12}, cooldown_s=10_000.0, **kw)
    p.control(signals(0.0, active=10, hit=0.95), [])  # no control: learns the plateau
    assert p.on_session_arrival(info(0, 1.0), signals(1.0)) is Admission.ADMIT
    p.control(signals(5.0, active=55, hit=0.95), [])  # W = 1.1M >= B0: engaged
    assert p.state.admit
    assert p.on_session_arrival(info(1, 6.0), signals(6.0, active=55)) is Admission.PARK
    return p


def test_budget_rises_past_the_cap_while_the_engine_has_headroom():
    # W = 1.1M: above B0 = 1M, below the cliff margin m W_c = 0.9 * 1.9 * 1M;
    # reuse on its plateau, no backlog, a session waiting.
    p = _engaged_with_parked()
    assert math.isclose(p.state.cliff_margin, 0.9 * 1.9 * GPU)
    b0 = p.state.b0
    for t in range(10, 200, 5):
        p.control(signals(float(t), active=55, hit=0.95), [1])
    assert p.state.budget > 2.0 * b0 * 1.5
    # It still falls when reuse falls, as within the range.
    high = p.state.budget
    p.control(signals(205.0, active=55, hit=0.80), [1])
    assert p.state.budget < high


def test_cap_binds_at_the_cliff_margin_or_on_a_persistent_backlog():
    for blocked in ({"active": 90}, {"backlog": 100_000}):  # W = 1.8M >= m W_c; or a backlog
        p = _engaged_with_parked()
        b0 = p.state.b0
        for t in range(10, 200, 5):  # headroom first: B grows past the cap
            p.control(signals(float(t), active=55, hit=0.95), [1])
        assert p.state.budget > 2.0 * b0
        args = {"active": 55, **blocked}
        p.control(signals(200.0, hit=0.95, **args), [1])
        if "backlog" in blocked:  # one tick is not persistent
            assert p.state.budget > 2.0 * b0
            p.control(signals(205.0, hit=0.95, **args), [1])
        assert p.state.budget == 2.0 * b0  # back to the cap at once
        for t in range(210, 300, 5):
            p.control(signals(float(t), hit=0.95, **args), [1])
            assert p.state.budget <= 2.0 * b0 + 1e-6
        p.control(signals(300.0, active=55, hit=0.95), [1])
        if "backlog" in blocked:  # computation has kept up for one tick only: still capped
            assert p.state.budget == 2.0 * b0
            p.control(signals(305.0, active=55, hit=0.95), [1])
        assert p.state.budget > 2.0 * b0  # headroom again


def test_a_single_backlog_tick_neither_caps_nor_lifts_the_cap():
    p = _engaged_with_parked()
    b0 = p.state.b0
    for t in range(10, 100, 5):
        p.control(signals(float(t), active=55, hit=0.95), [1])
    # Lone backlog ticks between clear ones: B keeps rising past the cap.
    for t in range(100, 200, 10):
        before = p.state.budget
        p.control(signals(float(t), active=55, hit=0.95, backlog=100_000), [1])
        p.control(signals(float(t) + 5.0, active=55, hit=0.95), [1])
        assert p.state.budget > before > 2.0 * b0
    # Once capped by a persistent backlog, lone clear ticks keep the cap.
    p.control(signals(200.0, active=55, hit=0.95, backlog=100_000), [1])
    p.control(signals(205.0, active=55, hit=0.95, backlog=100_000), [1])
    for t in range(210, 300, 10):
        p.control(signals(float(t), active=55, hit=0.95), [1])
        p.control(signals(float(t) + 5.0, active=55, hit=0.95, backlog=100_000), [1])
        assert p.state.budget <= 2.0 * b0 + 1e-6


def test_fixed_cap_when_growth_past_it_is_switched_off():
    p = _engaged_with_parked(budget_past_cap_with_headroom=False)
    b0 = p.state.b0
    for t in range(10, 400, 5):
        p.control(signals(float(t), active=55, hit=0.95), [1])
        assert p.state.budget <= 2.0 * b0 + 1e-6
    assert p.state.budget == 2.0 * b0


def test_prior_controller_keeps_the_fixed_cap():
    # It admits by current context, already in working-set units.
    p = BasinPriorPolicy(BasinParams(cooldown_s=10_000.0), cliff=CliffSummary(kappa=1.0, x_knee=1.9,
                                                                              lambda_c_per_min=5.0))
    p.control(signals(0.0, active=10, hit=0.95), [])
    assert p.on_session_arrival(info(0, 1.0), signals(1.0)) is Admission.ADMIT
    p.control(signals(5.0, active=55, hit=0.95), [])
    assert p.state.admit
    assert p.on_session_arrival(info(1, 6.0, first_prompt=10 ** 9), signals(6.0, active=55)) is Admission.PARK
    for t in range(10, 400, 5):
        p.control(signals(float(t), active=55, hit=0.95), [1])
        assert p.state.budget <= 2.0 * p.state.b0 + 1e-6


# ---------------------------------------------------------------- reservation options


class QuantilePredictor(TablePredictor):
    """Point prediction from the table, reservation twice that."""

    def reserve_peak_tokens(self, task_text, first_prompt_tokens, session_id, oracle_peak_tokens):
        return 2 * self.peaks.get(session_id, self.default)


def test_a_reserving_predictor_sets_the_reservation_not_the_priority():
    from basin.policy.basin import BasinPolicy as Basin

    p = Basin(BasinParams(), predictor=QuantilePredictor({"s1": 40_000}), cliff=CliffSummary())
    p.on_session_arrival(info(1, 10.0), signals(10.0))
    assert p.priority_key(1) == 10.0 + 40_000 / 30.0
    assert p.state.reserved == 80_000
    p.on_session_finished(1, 20.0)
    assert p.state.reserved == 0


def test_online_correction_is_off_by_default_and_revises_only_the_reservation():
    from basin.policy.basin import GrowthCorrection

    # log R = log(1 + c) + log 2: twice the context so far.
    corr = GrowthCorrection(intercept=math.log(2), coef_context=1.0, coef_calls=0.0, coef_initial=0.0)
    for on in (False, True):
        p = BasinPolicy(BasinParams(online_correction=on), predictor=TablePredictor({"s1": 50_000}),
                        cliff=CliffSummary(), correction=corr)
        p.on_session_arrival(info(1, 0.0), signals(0.0))
        key = p.priority_key(1)
        p.on_call_finished(1, 100_000, False, 5.0)
        assert p.priority_key(1) == key  # the priority stays fixed
        expected = 2 * 100_001 if on else 50_000
        assert math.isclose(p.state.reserved, expected)
        p.on_call_finished(1, 120_000, True, 9.0)  # the last call: nothing to revise
        assert math.isclose(p.state.reserved, expected)
        p.on_session_finished(1, 10.0)
        assert abs(p.state.reserved) < 1e-6


def test_growth_correction_never_reserves_less_than_the_context():
    from basin.policy.basin import GrowthCorrection

    corr = GrowthCorrection(intercept=-5.0, coef_context=0.0, coef_calls=0.0, coef_initial=0.0)
    assert corr.reservation(10_000, 70_000, 3) == 70_000


def test_online_correction_needs_a_predictor_with_a_growth_fit():
    import pytest

    from basin.policy.params import PolicyParamError
    from basin.systems import build_policy

    with pytest.raises(PolicyParamError, match="online_correction.*ridge:q=0.9"):
        build_policy("basin", {"predictor": "oracle", "online_correction": True})
