"""The colocated instance: vLLM's rules C1-C8 (basin.sim.colocated), one by
one, then as a whole under random load (the pool never overflows, every call
finishes with all its tokens, locks and allocations balance)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from basin.catalog import load_hardware
from basin.sim.cache import RadixCache
from basin.sim.colocated import ColocatedInstance, Plan
from basin.sim.costs import DecodeCosts, PrefillCosts
from basin.sim.events import CLIENT, EventLoop
from basin.sim.invariants import RequestNeverFits
from basin.sim.requests import Callbacks, Request, Route

HW = load_hardware("h100-nvl")
PAGE = 64


def checked(inst: ColocatedInstance, after_step: Callable[[], None] | None = None) -> ColocatedInstance:
    """``inst`` checking every invariant after every step (and calling
    ``after_step``): its own step-end handler wrapped (the class is compiled,
    so a test wraps what it would otherwise override)."""
    end_step = inst._end_step

    def checked_end_step(plan: Plan) -> None:
        end_step(plan)
        inst.check()
        if after_step is not None:
            after_step()

    inst._end_step_handler = checked_end_step
    return inst


class Engine:
    """One instance on a loop, with what it reported."""

    def __init__(self, pool_tokens: int, *, chunk_tokens: int = 512, max_running: int = 64):
        self.loop = EventLoop()
        prefill = HW.prefill.model_copy(update={"chunk_tokens": chunk_tokens})
        self.first: list[Request] = []
        self.done: list[Request] = []
        self.inst = checked(ColocatedInstance(0, prefill, HW.decode, RadixCache(pool_tokens, 0, PAGE), self.loop,
                                              Callbacks(self.first.append, self.done.append),
                                              max_running=max_running))
        self.seq = 0
        self.routes: dict[int, Route] = {}

    def call(self, session: int, prompt: int, output: int, *, prio: float | None = None, shared: int = 0,
             at: float | None = None) -> Request:
        """A call whose prompt is ``shared`` tokens common to all sessions, then the session's own."""
        route = self.routes.setdefault(session, Route(session))
        key = ([(("system",), shared)] if shared else []) + [(session, prompt - shared)]
        self.seq += 1
        req = Request(session, route, 0, key, self.seq, self.loop.now, prompt, prompt - shared, output)
        req.prio = prio
        route.take_key(key)
        if at is None:
            self.inst.submit(req)
        else:
            self.loop.at(at, CLIENT, self.inst.submit, req)
        return req

    def run(self, for_s: float = 1e7) -> None:
        self.loop.run(self.loop.now + for_s)


def test_one_call_prefills_in_chunks_then_decodes_and_leaves_its_prompt_cached():
    e = Engine(100_000, chunk_tokens=512)
    req = e.call(1, 1000, 5)
    e.run()
    p, d = PrefillCosts(HW.prefill), DecodeCosts(HW.decode)
    prefill_s = (HW.prefill.step_overhead_s + p.tokens_cost_s(512, 0)) + \
        (HW.prefill.step_overhead_s + p.tokens_cost_s(488, 512))
    assert req.first_token_s == pytest.approx(prefill_s, rel=1e-12)
    decode_s = sum(d.step_s(1, 1000 + g) for g in range(1, 5))
    assert req.finished_s == pytest.approx(prefill_s + decode_s, rel=1e-12)
    assert e.first == [req] and e.done == [req] and req.generated == 5
    assert (req.cached, req.uncached) == (0, 1000)
    again = e.call(1, 1100, 2)
    e.run()
    assert again.cached == 960  # the first prompt's whole pages
    assert e.inst.cache.lock_handles == 0 and e.inst.cache.inflight == 0


def test_the_front_ends_read_of_a_whole_prompt_is_charged_once_to_the_next_step():
    front = 2e-6
    e = Engine(100_000, chunk_tokens=2048)
    e.inst.frontend_s_per_prompt_token = front
    first = e.call(1, 400, 2)
    e.run()
    p = PrefillCosts(HW.prefill)
    assert first.first_token_s == pytest.approx(HW.prefill.step_overhead_s + p.tokens_cost_s(400, 0) + 400 * front,
                                                rel=1e-12)
    # Cached or not, every token of the prompt is read; the next call pays for all 1,000.
    start = e.loop.now
    again = e.call(1, 1000, 2)
    e.run()
    assert again.cached == 384
    assert again.first_token_s - start == pytest.approx(
        HW.prefill.step_overhead_s + p.tokens_cost_s(616, 384) + 1000 * front, abs=1e-9)
    assert e.inst.frontend_owed_s == 0.0


def test_decodes_and_a_prefill_chunk_share_one_step_and_its_budget():
    e = Engine(100_000, chunk_tokens=256)
    a = e.call(1, 100, 50)
    p, d = PrefillCosts(HW.prefill), DecodeCosts(HW.decode)
    a_first = HW.prefill.step_overhead_s + p.tokens_cost_s(100, 0)
    # b arrives while a's second decode step runs; it joins the step after.
    arrive = a_first + d.step_s(1, 101) + d.step_s(1, 102) / 2
    b = e.call(2, 1000, 2, at=arrive)
    e.run()
    t = a_first + d.step_s(1, 101) + d.step_s(1, 102)
    # Then each step decodes a's next token and prefills up to 255 of b's prompt (one budget of 256).
    for k, (take, pos) in enumerate(((255, 0), (255, 255), (255, 510), (235, 765))):
        t += d.step_s(1, 103 + k) + p.tokens_cost_s(take, pos)
    assert b.first_token_s == pytest.approx(t, rel=1e-12)
    assert a.generated == 50 and b.generated == 2 and b.finished_s < a.finished_s


def test_the_last_token_is_always_computed_and_hits_are_whole_pages():
    e = Engine(100_000)
    e.call(1, 640, 1)
    e.run()
    again = e.call(1, 640, 1)  # the same prompt: all of it cached, yet its last page is computed
    e.run()
    assert again.cached == 576 and again.uncached == 64


def test_under_pool_pressure_the_last_admitted_is_preempted_and_recomputes_then_finishes():
    e = Engine(3 * 1024, chunk_tokens=2048)
    first = e.call(1, 1000, 600)
    second = e.call(2, 1000, 600)
    e.run()
    assert {r.session for r in e.done} == {1, 2}
    assert second.retractions >= 1 and first.retractions == 0
    assert first.generated == 600 and second.generated == 600
    assert e.inst.preemptions == second.retractions
    # Hit rates count first admissions only.
    assert e.inst.prompt_tokens_total == 2000


def test_with_ordering_on_the_largest_priority_value_is_preempted_even_if_admitted_first():
    e = Engine(3 * 1024, chunk_tokens=2048)
    e.inst.set_ordered(True)
    low = e.call(1, 1000, 600, prio=9.0)
    high = e.call(2, 1000, 600, prio=1.0)
    e.run()
    assert low.retractions >= 1 and high.retractions == 0
    assert high.finished_s < low.finished_s


def test_waiting_calls_are_admitted_by_priority_when_ordered_and_first_come_otherwise():
    for ordered, expect in ((False, [2, 3, 4]), (True, [4, 3, 2])):
        e = Engine(100_000, chunk_tokens=4096, max_running=1)
        e.inst.set_ordered(ordered)
        e.call(1, 200, 30, prio=0.0)  # runs; the rest wait behind it
        for s, prio in ((2, 3.0), (3, 2.0), (4, 1.0)):
            e.call(s, 200, 2, prio=prio)
        e.run()
        assert [r.session for r in e.done][1:] == expect


def test_the_head_blocks_the_queue_when_the_pool_cannot_take_it():
    e = Engine(4096, chunk_tokens=8192)
    e.call(1, 2000, 400)  # holds about half the pool while it decodes
    big = e.call(2, 3000, 2)  # cannot be admitted beside it
    small = e.call(3, 100, 2)  # would fit, but waits behind the head
    e.run()
    assert small.prefill_start_s >= big.prefill_start_s
    assert [r.session for r in e.done] == [1, 2, 3]


def test_a_call_larger_than_the_pool_is_refused_at_once():
    e = Engine(1024)
    with pytest.raises(RequestNeverFits, match="LIVE-COLOCATED-FITS"):
        e.call(1, 1024, 4)


def test_a_waiting_call_can_be_withdrawn_but_not_a_running_one():
    e = Engine(100_000, max_running=1)
    running = e.call(1, 200, 50)
    waiting = e.call(2, 200, 5)
    assert not e.inst.withdraw(running)
    assert e.inst.withdraw(waiting) and waiting.cancelled
    e.run()
    assert e.done == [running]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool_pages=st.integers(24, 120),
    chunk=st.sampled_from([64, 256, 1024]),
    max_running=st.integers(1, 8),
    ordered=st.booleans(),
    calls=st.lists(st.tuples(st.integers(0, 5), st.integers(2, 900), st.integers(1, 300),
                             st.floats(0.0, 2.0), st.integers(0, 3), st.sampled_from([0, 128, 300])),
                   min_size=1, max_size=25),
)
def test_under_any_load_every_call_finishes_whole_and_the_pool_holds(pool_pages, chunk, max_running, ordered,
                                                                     calls):
    pool = pool_pages * PAGE
    e = Engine(pool, chunk_tokens=chunk, max_running=max_running)
    e.inst.set_ordered(ordered)
    made = []
    for i, (session, prompt, output, at, prio, shared) in enumerate(calls):
        prompt = max(prompt, shared + 1)
        if prompt + output + 2 * PAGE > pool // 2:
            continue  # a call that alone could fill the pool is a different test
        made.append(e.call(session * 100 + i, prompt, output, prio=float(prio), shared=shared, at=at))
    e.run()
    assert sorted(id(r) for r in e.done) == sorted(id(r) for r in made)
    for r in made:
        assert r.generated == r.output
        assert r.first_token_s <= r.finished_s
        assert 0 <= r.cached <= r.prompt - 1 and r.cached % PAGE == 0
    assert e.inst.cache.lock_handles == 0 and e.inst.cache.inflight == 0
    assert not e.inst.running and not e.inst.queue
    e.inst.check()


def test_nothing_is_admitted_in_a_step_that_preempted():
    """C waits (the pool is full) with the best priority; when A's growth
    preempts B, the room B leaves is C's only from the next step on."""
    preempted_at: list[float] = []

    def watch() -> None:
        # A step is planned (and may preempt) as the previous one ends, at this time.
        if e.inst.preemptions > len(preempted_at):
            preempted_at.append(e.loop.now)

    e = Engine(40 * PAGE, chunk_tokens=4096)
    e.inst = checked(ColocatedInstance(0, HW.prefill.model_copy(update={"chunk_tokens": 4096}), HW.decode,
                                       RadixCache(40 * PAGE, 0, PAGE), e.loop,
                                       Callbacks(e.first.append, e.done.append)),
                     watch)
    e.inst.set_ordered(True)
    a = e.call(1, 1000, 1000, prio=1.0)
    b = e.call(2, 1000, 1000, prio=5.0)
    while a.generated < 200:
        e.loop.run(e.loop.now + 0.005)
    c = e.call(3, 300, 2, prio=0.0)
    assert c.match is None and not preempted_at, "C waits for room, nothing preempted yet"
    e.run()
    assert b.retractions >= 1 and a.retractions == 0
    assert c.prefill_start_s > preempted_at[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool_pages=st.integers(30, 200),
    sessions=st.lists(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 80)), min_size=1, max_size=6),
                      min_size=1, max_size=8),
    ordered=st.booleans(),
)
def test_closed_loop_sessions_reuse_their_growing_prompts_and_all_finish(pool_pages, sessions, ordered):
    """Each session sends its calls one after another, each prompt its
    previous prompt plus a new chunk: with room, every call after the first
    finds its predecessor's whole pages cached; without, every call still finishes."""
    pool = pool_pages * PAGE
    e = Engine(pool, chunk_tokens=256, max_running=4)
    e.inst.set_ordered(ordered)
    keys: dict[int, list] = {}
    plan = {uid: [(n, out) for n, out in calls] for uid, calls in enumerate(sessions)}
    total_calls = sum(len(c) for c in plan.values())
    if max(sum(n for n, _ in c) + max(o for _, o in c) for c in plan.values()) + 2 * PAGE > pool // 2:
        return
    done_before = len(e.done)

    def next_call(uid: int) -> None:
        k = len(keys.setdefault(uid, []))
        if k == len(plan[uid]):
            return
        n, out = plan[uid][k]
        key = keys[uid] + [(uid * 1000 + k, n)]
        keys[uid] = key
        route = e.routes.setdefault(uid, Route(uid))
        route.take_key(key)
        e.seq += 1
        req = Request(uid, route, k, key, e.seq, e.loop.now, sum(p for _, p in key), n, out)
        req.prio = float(uid)
        e.inst.submit(req)

    def finished(req: Request) -> None:
        e.done.append(req)
        e.loop.at(e.loop.now + 0.01, CLIENT, next_call, req.session)

    e.inst.listener = Callbacks(e.first.append, finished)
    for uid in plan:
        next_call(uid)
    e.run()
    calls = e.done[done_before:]
    assert len(calls) == total_calls
    roomy = pool >= 2 * sum(sum(n for n, _ in c) + 2 * PAGE for c in plan.values())
    for req in calls:
        assert req.generated == req.output and req.cached % PAGE == 0
        if roomy and req.call_index > 0 and not req.retractions:
            previous = req.prompt - req.new
            assert req.cached >= min(previous - previous % PAGE, (req.prompt - 1) // PAGE * PAGE)
    assert e.inst.cache.lock_handles == 0 and e.inst.cache.inflight == 0


def _colocated_run(system: str, seed: int = 0):
    from basin.experiments.runner import run_scenario
    from basin.experiments.scenario import load_scenario

    scenario = load_scenario("trap-1p1d", ["deployment=1C-h100-nvl", "duration_min=30", "measure_end_min=20",
                                           f"seed={seed}"])
    return run_scenario(scenario, system)


@pytest.mark.parametrize("system", ["hicache", "basin", "continuum"])
def test_a_colocated_deployment_runs_every_kind_of_policy_reproducibly(system):
    """The simulator builds the colocated core for a ``NC-HW`` deployment;
    a run is a function of its seed; every call in the tables finished whole."""
    first, again = _colocated_run(system), _colocated_run(system)
    calls = first.result.calls
    assert len(calls["session_uid"]) > 100
    for name in ("first_token_s", "finished_s", "cached_tokens", "retractions"):
        assert list(calls[name]) == list(again.result.calls[name])
    assert first.summary.to_dict() == again.summary.to_dict()
    # Tokens conserved: a finished call has its prompt split into cached and computed.
    import numpy as np
    done = np.isfinite(np.asarray(calls["finished_s"], dtype=float))
    prompt = np.asarray(calls["prompt_tokens"])[done]
    split = (np.asarray(calls["cached_tokens"]) + np.asarray(calls["uncached_tokens"]))[done]
    assert done.any() and (prompt == split).all()
