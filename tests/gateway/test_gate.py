"""The gate drives a policy from the gateway's session table: admission,
parking, release order, shedding, pausing, ending, and that every held call is
woken exactly once whatever order things happen in."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.gateway.config import GatewayConfig
from basin.gateway.gate import UNKNOWN_CAPACITY_TOKENS, Gate, ShedError
from basin.gateway.sessions import SessionState
from basin.gateway.usage import CallUsage
from basin.policy.base import Admission, ControlDecision, Policy
from basin.policy.basin import BasinParams, BasinPolicy, CliffSummary
from basin.predict.peak import GrowthPredictor

CONFIG = GatewayConfig(upstream="http://127.0.0.1:9", idle_timeout_s=100.0)


class OnceFuture:
    """A waiter that fails the test if it is resolved twice."""

    def __init__(self) -> None:
        self.results: list[object] = []

    def done(self) -> bool:
        return bool(self.results)

    def set_result(self, result: object) -> None:
        if self.results:
            raise AssertionError("waiter resolved twice")
        self.results.append(result)


class Scripted(Policy):
    """Admission decided by a list; control answers with a queued decision."""

    name = "scripted"

    def __init__(self, verdicts: list[Admission]):
        self.verdicts = list(verdicts)
        self.next_decision = ControlDecision()
        self.finished: list[int] = []
        self.issued: list[tuple[int, int]] = []
        self.held: list[int] = []
        self.last_calls: list[tuple[int, int, bool]] = []
        self.keys: dict[int, float] = {}

    def on_session_arrival(self, info, signals):
        return self.verdicts.pop(0) if self.verdicts else Admission.ADMIT

    def on_call_issued(self, uid, prompt_tokens, now_s):
        self.issued.append((uid, prompt_tokens))

    def on_call_held(self, uid, now_s):
        self.held.append(uid)

    def on_call_finished(self, uid, context_tokens, last_call, now_s):
        self.last_calls.append((uid, context_tokens, last_call))
        return 0.0

    def on_session_finished(self, uid, now_s):
        self.finished.append(uid)

    def control(self, signals, parked):
        decision, self.next_decision = self.next_decision, ControlDecision()
        return decision

    def priority_key(self, uid):
        return self.keys.get(uid)


def test_admitted_parked_and_shed_sessions():
    policy = Scripted([Admission.ADMIT, Admission.PARK, Admission.SHED])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    a = gate.open_call("a", 0.0, 100, "task a", end=False)
    b = gate.open_call("b", 1.0, 100, "task b", end=False)
    assert gate.session_state(a) is SessionState.ADMITTED and not gate.must_wait(a)
    assert gate.session_state(b) is SessionState.PARKED and gate.must_wait(b)
    with pytest.raises(ShedError) as shed:
        gate.open_call("c", 2.0, 100, None, end=False)
    assert shed.value.reason == "policy"
    assert gate.table.get("c") is None
    assert gate.counts["admitted"] == 1 and gate.counts["parked"] == 1 and gate.counts["shed"] == 1
    # A later call of an admitted session passes without asking the policy again.
    assert gate.open_call("a", 3.0, 150, None, end=False) is a


def test_standing_is_read_from_the_drivers_ledger_alone():
    """The gateway keeps no standing of its own: what it answers (the held
    call, /state's counts and working set) follows the driver's ledger."""
    policy = Scripted([Admission.ADMIT, Admission.PARK])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    a = gate.open_call("a", 0.0, 100, None, end=False)
    b = gate.open_call("b", 1.0, 300, None, end=False)
    assert not hasattr(a, "state")
    assert gate.session_counts() == {"admitted": 1, "parked": 1} == gate.state()["sessions"]
    assert gate.state()["working_set_tokens"] == gate.driver.working_set_tokens == 100
    policy.next_decision = ControlDecision(release=(b.uid,))
    gate.tick(2.0)  # the driver admits b: nothing else is told
    assert gate.driver.is_admitted(b.uid) and gate.session_state(b) is SessionState.ADMITTED
    assert not gate.must_wait(b) and gate.session_counts() == {"admitted": 2, "parked": 0}
    assert gate.state()["working_set_tokens"] == 400


def test_release_wakes_each_waiter_once_and_ignores_repeats():
    policy = Scripted([Admission.PARK])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    sess = gate.open_call("s", 0.0, 100, None, end=False)
    waiter = OnceFuture()
    gate.wait(sess, waiter)
    policy.next_decision = ControlDecision(release=(sess.uid, sess.uid))
    gate.tick(1.0)
    assert waiter.results == [SessionState.ADMITTED]
    policy.next_decision = ControlDecision(release=(sess.uid,))
    gate.tick(2.0)  # released again: nothing to wake, no error
    assert gate.counts["admitted"] == 1


def test_shed_while_parked_wakes_with_shed_and_forgets_the_session():
    policy = Scripted([Admission.PARK])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    sess = gate.open_call("s", 0.0, 100, None, end=False)
    waiter = OnceFuture()
    gate.wait(sess, waiter)
    policy.next_decision = ControlDecision(shed=(sess.uid,))
    gate.tick(1.0)
    assert waiter.results == [SessionState.SHED]
    assert sess.shed_reason == "persistent-overload"
    assert gate.table.get("s") is None and policy.finished == [sess.uid]


def test_abandoned_parked_call_leaves_the_queue():
    policy = Scripted([Admission.PARK])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    sess = gate.open_call("s", 0.0, 100, None, end=False)
    waiter = OnceFuture()
    gate.wait(sess, waiter)
    gate.abandon(sess, waiter, 5.0)
    assert gate.table.get("s") is None
    assert policy.finished == [sess.uid] and gate.counts["abandoned"] == 1
    policy.next_decision = ControlDecision(release=(sess.uid,))
    gate.tick(6.0)
    assert waiter.results == []


def test_end_marker_finishes_after_the_last_answer_and_context_follows_usage():
    policy = Scripted([])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    sess = gate.open_call("s", 0.0, 100, None, end=False)
    gate.forwarded(sess, 100, 0.0)
    gate.done(sess, CallUsage(prompt_tokens=120, completion_tokens=30, cached_tokens=0), 1.0)
    assert sess.context_tokens == 150 and gate.driver.working_set_tokens == 150
    gate.open_call("s", 2.0, 200, None, end=True)
    gate.forwarded(sess, 200, 2.0)
    assert gate.table.get("s") is sess  # still answering
    gate.done(sess, CallUsage(prompt_tokens=200, completion_tokens=40, cached_tokens=150), 3.0)
    assert gate.table.get("s") is None and gate.session_state(sess) is SessionState.FINISHED
    assert policy.last_calls[-1] == (sess.uid, 240, True)
    assert policy.issued == [(sess.uid, 100), (sess.uid, 200)]
    assert gate.signals(3.5).hit_rate == pytest.approx(150 / 320)


def test_idle_sessions_expire_but_not_while_a_call_is_in_flight():
    policy = Scripted([])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    busy = gate.open_call("busy", 0.0, 100, None, end=False)
    gate.forwarded(busy, 100, 0.0)
    idle = gate.open_call("idle", 0.0, 100, None, end=False)
    gate.tick(150.0)
    assert gate.table.get("idle") is None and gate.session_state(idle) is SessionState.FINISHED
    assert gate.table.get("busy") is busy and gate.counts["expired"] == 1


def test_a_long_parked_call_does_not_expire():
    gate = Gate(Scripted([Admission.PARK]), CONFIG, capacity_tokens=10_000)
    sess = gate.open_call("s", 0.0, 100, None, end=False)
    waiter = OnceFuture()
    gate.wait(sess, waiter)
    gate.tick(1_000.0)
    assert gate.table.get("s") is sess and waiter.results == []


def test_paused_session_holds_its_next_call_until_resumed():
    policy = Scripted([])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    sess = gate.open_call("s", 0.0, 100, None, end=False)
    policy.next_decision = ControlDecision(pause=(sess.uid,))
    gate.tick(1.0)
    gate.open_call("s", 2.0, 200, None, end=False)
    assert gate.must_wait(sess) and policy.held == [sess.uid]
    waiter = OnceFuture()
    gate.wait(sess, waiter)
    policy.next_decision = ControlDecision(resume=(sess.uid,))
    gate.tick(3.0)
    assert waiter.results == [SessionState.ADMITTED] and not gate.must_wait(sess)


def test_priority_rank_only_while_ordering_and_relative_to_start():
    policy = Scripted([])
    gate = Gate(policy, CONFIG, capacity_tokens=10_000, origin_s=1000.0)
    sess = gate.open_call("s", 1000.0, 100, None, end=False)
    policy.keys[sess.uid] = 1042.4
    assert gate.priority_rank(sess) is None
    policy.next_decision = ControlDecision(order_by_priority=True)
    gate.tick(1001.0)
    assert gate.priority_rank(sess) == 42
    policy.keys[sess.uid] = math.inf
    assert gate.priority_rank(sess) is None


def test_draining_refuses_new_sessions_only():
    gate = Gate(Scripted([]), CONFIG, capacity_tokens=10_000)
    gate.open_call("old", 0.0, 100, None, end=False)
    gate.draining = True
    assert gate.open_call("old", 1.0, 100, None, end=False).session_id == "old"
    with pytest.raises(ShedError) as exc:
        gate.open_call("new", 1.0, 100, None, end=False)
    assert exc.value.reason == "draining"


class StaleEngine:
    capacity_tokens = None

    def __init__(self, snapshot: object, age_s: float):
        self.latest, self.age_s = snapshot, age_s

    def stale_s(self, now_s: float) -> float:
        return self.age_s


class Snap:
    hit_rate = 0.2
    queue_requests = 7
    decode_wait_requests = 3
    kv_used_fraction = 0.5
    cache_capacity_tokens = 50_000


def test_signals_use_fresh_scrapes_and_treat_stale_ones_as_unknown():
    fresh = Gate(Scripted([]), CONFIG, StaleEngine(Snap(), 1.0))
    sig = fresh.signals(0.0)
    assert (sig.hit_rate, sig.prefill_queue_requests, sig.decode_wait_requests) == (0.2, 7, 3)
    assert sig.gpu_cache_tokens == 50_000 and sig.stale_s == 1.0
    stale = Gate(Scripted([]), CONFIG, StaleEngine(Snap(), 60.0))
    sess = stale.open_call("s", 0.0, 500, None, end=False)
    stale.forwarded(sess, 500, 0.0)
    sig = stale.signals(0.0)
    assert math.isnan(sig.hit_rate) and sig.decode_wait_requests == 0
    assert sig.prefill_queue_requests == 1  # the gateway's own unanswered calls stand in for the queue
    assert sig.prefill_backlog_tokens == 500
    assert sig.gpu_cache_tokens == UNKNOWN_CAPACITY_TOKENS and sig.stale_s == 60.0
    remembered = StaleEngine(Snap(), 60.0)
    remembered.capacity_tokens = 70_000
    assert Gate(Scripted([]), CONFIG, remembered).signals(0.0).gpu_cache_tokens == 70_000
    configured = Gate(Scripted([]), CONFIG, StaleEngine(Snap(), 1.0), capacity_tokens=8_000)
    assert configured.signals(0.0).gpu_cache_tokens == 8_000


def test_the_backlog_counts_the_prefill_work_a_call_adds_not_its_whole_prompt():
    """An agent's second call resends 30K tokens the engine already holds: only
    the new 2K are prefill work, as in the simulator, where a running prefill
    counts only its uncached tokens."""
    gate = Gate(Scripted([]), CONFIG, StaleEngine(Snap(), 60.0))
    sess = gate.open_call("s", 0.0, 30_000, None, end=False)
    first = gate.forwarded(sess, 30_000, 0.0)
    assert first == 30_000 and gate.signals(0.0).prefill_backlog_tokens == 30_000  # nothing cached yet
    gate.answering(sess, first)
    assert gate.signals(0.5).prefill_backlog_tokens == 0
    gate.done(sess, CallUsage(prompt_tokens=30_000, completion_tokens=200, cached_tokens=0), 1.0)
    second = gate.forwarded(sess, 32_200, 2.0)
    assert second == 2_000 and gate.signals(2.0).prefill_backlog_tokens == 2_000
    gate.answering(sess, second)
    assert gate.signals(2.5).prefill_backlog_tokens == 0
    # A call the engine refused leaves the confirmed context where it was: its retry is charged again.
    gate.done(sess, None, 3.0, refused=True)
    assert gate.forwarded(sess, 32_200, 4.0) == 2_000


def _basin(capacity: int) -> tuple[Gate, BasinPolicy]:
    policy = BasinPolicy(BasinParams(lending=False, margin=1.0, cooldown_s=60.0), predictor=GrowthPredictor(1.5),
                         cliff=CliffSummary(kappa=1.0, x_knee=1.0))
    return Gate(policy, CONFIG, capacity_tokens=capacity), policy


def _grow(gate: Gate, sid: str, now: float, prompt: int, answer: int) -> None:
    sess = gate.open_call(sid, now, prompt, None, end=False)
    gate.forwarded(sess, prompt, now)
    gate.done(sess, CallUsage(prompt, answer, prompt - 50), now + 0.5)


def test_basin_parks_beyond_the_budget_and_releases_smallest_first():
    gate, policy = _basin(capacity=4_000)
    for i, sid in enumerate(("a", "b")):
        _grow(gate, sid, float(i), 1_000, 900)  # contexts of 1,900 tokens: W = 3,800
    gate.tick(10.0)
    assert not policy.state.admit
    _grow(gate, "c", 11.0, 1_000, 300)  # W = 5,100 >= B0 = 4,000: admission engages at the next tick
    gate.tick(12.0)
    assert policy.state.admit and policy.state.budget == pytest.approx(4_000)
    big = gate.open_call("big", 13.0, 1_200, None, end=False)
    small = gate.open_call("small", 14.0, 600, None, end=False)
    assert gate.session_state(big) is SessionState.PARKED and gate.session_state(small) is SessionState.PARKED
    waiters = {"big": OnceFuture(), "small": OnceFuture()}
    gate.wait(big, waiters["big"])
    gate.wait(small, waiters["small"])
    for sid in ("a", "b"):
        sess = gate.open_call(sid, 20.0, 1_900, None, end=True)
        gate.forwarded(sess, 1_900, 20.0)
        gate.done(sess, CallUsage(1_900, 10, 1_850), 21.0)
    gate.tick(22.0)
    # Reserved now: c's 1,500; small (900) fits the 4,000 budget first, then big (1,800) too.
    assert gate.session_state(small) is SessionState.ADMITTED and waiters["small"].results == [SessionState.ADMITTED]
    assert gate.session_state(big) is SessionState.ADMITTED
    assert policy.state.reserved <= policy.state.budget


def test_set_params_validates_names_and_types():
    gate, policy = _basin(capacity=4_000)
    assert gate.set_params({"budget_high": 3})["budget_high"] == 3.0
    assert policy.params.budget_high == 3.0
    with pytest.raises(ValueError, match="parameter 'nope': unknown"):
        gate.set_params({"nope": 1})
    with pytest.raises(ValueError, match="'shedding': expected true or false"):
        gate.set_params({"shedding": 1})
    with pytest.raises(ValueError, match="'backlog_ticks': expected a whole number"):
        gate.set_params({"backlog_ticks": 2.5})
    # Values out of range are refused before they reach a tick (a tick that
    # raised would stop the control loop).
    with pytest.raises(ValueError, match=r"'context_smoothing_s': must be in \(0, 604800\]"):
        gate.set_params({"context_smoothing_s": 0})
    with pytest.raises(ValueError, match="'budget_high': must be >= budget_low"):
        gate.set_params({"budget_high": -5})
    with pytest.raises(ValueError, match="decode-memory lending inside the engine"):
        gate.set_params({"lending": True})
    assert policy.params.budget_high == 3.0 and policy.params.lending is False  # refusals changed nothing
    with pytest.raises(ValueError, match="parameter 'x': unknown; known parameters: [(]none[)]"):
        Gate(Scripted([]), CONFIG).set_params({"x": 1})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["arrive", "wait", "abandon", "release", "shed", "finish", "tick"]),
                          st.integers(0, 5)), max_size=60),
       st.lists(st.sampled_from([Admission.ADMIT, Admission.PARK]), max_size=60))
def test_no_held_call_is_lost_or_woken_twice(ops, verdicts):
    """Whatever the interleaving, every waiter ends woken once or abandoned,
    and the table's states agree with the policy's view."""
    policy = Scripted(verdicts)
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    waiters: dict[int, list[OnceFuture]] = {}
    abandoned: set[int] = set()
    now = 0.0
    for op, k in ops:
        now += 1.0
        sid = f"s{k}"
        sess = gate.table.get(sid)
        if op == "arrive":
            gate.open_call(sid, now, 100, None, end=False)
        elif sess is None:
            continue
        elif op == "wait" and gate.must_wait(sess):
            w = OnceFuture()
            waiters.setdefault(id(w), []).append(w)
            gate.wait(sess, w)
        elif op == "abandon":
            for w in list(gate.waiters.get(sess.uid, [])):
                abandoned.add(id(w))
                gate.abandon(sess, w, now)
        elif op == "release":
            policy.next_decision = ControlDecision(release=(sess.uid,))
            gate.tick(now)
        elif op == "shed":
            policy.next_decision = ControlDecision(shed=(sess.uid,))
            gate.tick(now)
        elif op == "finish" and gate.session_state(sess) is SessionState.ADMITTED:
            gate.forwarded(sess, 10, now)
            sess.ending = True
            gate.done(sess, None, now)
        elif op == "tick":
            gate.tick(now)
    for uid, held in gate.waiters.items():
        sess = gate.table.by_uid[uid]
        assert gate.must_wait(sess), "a released session kept waiters"
        for w in held:
            assert not w.done()
    for ws in waiters.values():
        for w in ws:
            if w.done():
                assert len(w.results) == 1
            else:
                held_somewhere = any(w in held for held in gate.waiters.values())
                assert held_somewhere or id(w) in abandoned, "a held call was lost"
    for sess in gate.table.sessions.values():
        assert gate.session_state(sess) in (SessionState.ADMITTED, SessionState.PARKED)
    assert len(set(policy.finished)) == len(policy.finished)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 2_000), st.integers(1, 2_000)), max_size=40),
       st.floats(1, 30))
def test_windowed_hit_rate_matches_a_recount(calls, window_s):
    """The running sums agree with summing the calls inside the window."""
    from basin.gateway.sessions import SessionTable

    table = SessionTable()
    sess = table.add("s", 0.0, 10, None)
    now, seen = 0.0, []
    for gap, cached, prompt in calls:
        now += gap
        table.call_forwarded(sess, prompt, now)
        table.call_done(sess, CallUsage(prompt, 1, cached), now)
        seen.append((now, min(cached, prompt), prompt))
        inside = [(c, p) for t, c, p in seen if t >= now - window_s]
        expected = sum(c for c, _ in inside) / sum(p for _, p in inside)
        assert table.hit_rate(now, window_s) == pytest.approx(expected)
