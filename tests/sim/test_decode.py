"""Decode instances: retraction under memory pressure, ITL-SLO violation
counting in closed form, the memory accounting check and liveness."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from basin.sim.decode import DecodeInstance
from basin.sim.events import EventLoop
from basin.sim.invariants import InvariantViolation, RequestNeverFits
from basin.sim.lending import LendingConfig
from basin.sim.requests import Callbacks

from .helpers import HW, request


class Bench:
    """One decode instance; a reserved request joins at once (no prefill)."""

    def __init__(self, kv_tokens: int = 2000, reserve: int = 8, slo: float | None = None, **profile):
        self.loop = EventLoop()
        self.finished: list = []
        prof = HW.decode.model_copy(update={"kv_tokens": kv_tokens, "reserve_output_tokens": reserve, **profile})
        self.dec = DecodeInstance(0, prof, HW.itl_slo_s if slo is None else slo, self.loop,
                                  self._reserved, Callbacks(on_finished=self._finished))

    def _reserved(self, req) -> None:
        self.loop.at(self.loop.now, 0, self.dec.join, req)

    def _finished(self, req) -> None:
        self.finished.append(req)

    def submit(self, *reqs) -> None:
        for r in reqs:
            self.dec.request_memory(r)
        self.loop.run(self.loop.now)


def _two_growing(prio_a=None, prio_b=None):
    bench = Bench()
    a, b = request(1, 500, output=700), request(2, 500, output=700)
    a.prio, b.prio = prio_a, prio_b
    return bench, a, b


def test_memory_pressure_retracts_the_youngest_request():
    bench, a, b = _two_growing()
    bench.submit(a, b)  # both join at step 0; b is younger (later sequence)
    assert bench.dec.used == 2 * 508
    # Both grow past their 8 reserved tokens from step 8: 984 free tokens last
    # 492 steps, so at step 500 the pool cannot hold another step.
    bench.loop.run(1e6)
    assert (a.retractions, b.retractions) == (0, 1)
    assert b.generated == 500
    assert bench.finished == [a, b]
    assert a.finished_s < b.finished_s
    assert b.itl_violations == 0 and bench.dec.used == 0
    bench.dec.check()


def test_retracted_request_resumes_only_when_memory_is_back():
    bench, a, b = _two_growing()
    bench.submit(a, b)
    t500 = None
    # Stop right after the retraction (b waits, a alone in the batch).
    while not b.retractions:
        bench.loop.run(bench.loop.now + 0.05)
        t500 = bench.loop.now
    assert t500 is not None
    dec = bench.dec
    assert b not in dec.batch and [e.req for e in dec.wait] == [b]
    assert dec.waiting == 1 and b.reserved == 0
    dec.check()
    bench.loop.run(1e6)
    # Readmitted with its prompt, what it generated and a fresh reservation.
    assert b.retractions == 1 and b in bench.finished


def test_with_ordering_on_the_largest_priority_key_is_retracted():
    bench, a, b = _two_growing(prio_a=5.0, prio_b=1.0)
    bench.dec.set_ordered(True)
    bench.submit(a, b)
    bench.loop.run(1e6)
    # a is older, but its session's key is the largest: it goes.
    assert (a.retractions, b.retractions) == (1, 0)
    assert a.generated == 500
    assert bench.finished == [b, a]
    bench.dec.check()


def naive_violations(a: float, k: float, m: int, slo: float) -> int:
    return sum(1 for i in range(1, m + 1) if a + k * (i - 1) > slo)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(1, 200), st.integers(0, 40), st.integers(0, 400), st.integers(1, 300))
def test_closed_form_violation_count_matches_a_step_by_step_count(ai, ki, m, si):
    # Binary-exact values (multiples of 1/1024): ties with the SLO are exact too.
    a, k, slo = ai / 1024, ki / 1024, si / 1024
    dec = Bench(slo=slo).dec
    dec._count_violations(a, k, m)
    assert dec.cum_viol == naive_violations(a, k, m, slo)


def test_violation_boundaries():
    dec = Bench(slo=0.05).dec
    dec._count_violations(0.05, 0.0, 10)  # at the SLO is not above it
    assert dec.cum_viol == 0
    dec._count_violations(0.0625, 0.0, 7)
    assert dec.cum_viol == 7
    dec.cum_viol = 0
    # a = 1/32, k = 1/128, SLO 1/16 (exact): steps cost 4/128, 5/128, ... ;
    # step i is above 8/128 from i = 6.
    dec.itl_slo_s = 1 / 16
    dec._count_violations(1 / 32, 1 / 128, 10)
    assert dec.cum_viol == 5


def naive_decode_violations(prompts, outputs, profile, slo) -> list[int]:
    """Step-by-step reference: every request decodes from t=0 together; a step
    above the SLO counts once for every request in it."""
    remaining = [max(o - 1, 0) for o in outputs]
    ctx = [p + 1 for p in prompts]
    viol = [0] * len(prompts)
    while any(r > 0 for r in remaining):
        live = [i for i, r in enumerate(remaining) if r > 0]
        step = profile.step_s(len(live), sum(ctx[i] for i in live))
        for i in live:
            remaining[i] -= 1
            ctx[i] += 1
            viol[i] += step > slo
    return viol


def test_per_request_violations_match_the_step_by_step_reference():
    prompts = [200_000, 30_000, 5000, 400_000, 1000]
    outputs = [300, 900, 50, 200, 1500]
    prof = HW.decode
    # The SLO sits half a token's cost above the four-request step at step 120:
    # every five-request step violates it, four-request steps from 121 on,
    # none once the 400k-token request has left.
    four = [p for i, p in enumerate(prompts) if i != 2]
    slo = prof.step_s(4, sum(p + 1 for p in four) + 4 * 119) + 2 * prof.step_per_context_token_s
    bench = Bench(kv_tokens=10**7, reserve=512, slo=slo)
    reqs = [request(i, p, output=o) for i, (p, o) in enumerate(zip(prompts, outputs))]
    bench.submit(*reqs)
    bench.loop.run(1e6)
    expected = naive_decode_violations(prompts, outputs, bench.dec.profile, slo)
    assert [r.itl_violations for r in reqs] == expected
    assert expected == [49 + 79, 49 + 79, 49, 49 + 79, 49 + 79]


def test_memory_accounting_check_catches_drift():
    bench, a, b = _two_growing()
    bench.submit(a, b)
    bench.loop.run(bench.loop.now + 0.5)
    bench.dec.check(reserved_idle=0)
    bench.dec.used += 1
    with pytest.raises(InvariantViolation) as err:
        bench.dec.check()
    assert err.value.invariant == "RESERVE-BALANCE"
    bench.dec.used -= 1
    with pytest.raises(InvariantViolation, match="RESERVE-BALANCE"):
        bench.dec.check(reserved_idle=100)


def test_the_waiting_count_the_router_reads_follows_the_wait_heap():
    """ROUTER-LOAD: a request that waits for memory, a retracted one back in
    the heap and both reserved from it move the count as they move the heap."""
    bench, a, b = _two_growing()
    bench.submit(a, b)
    c = request(3, 1200, output=10)  # 1208 tokens, 984 free: it waits
    bench.dec.request_memory(c)
    assert bench.dec.waiting == 1
    bench.dec.check()
    while not b.retractions:
        bench.loop.run(bench.loop.now + 0.05)
    assert bench.dec.waiting == 2
    bench.dec.check()
    bench.loop.run(1e6)
    assert bench.dec.waiting == 0 and sorted(r.session for r in bench.finished) == [1, 2, 3]
    bench.dec.check(reserved_idle=0)
    bench.dec.waiting = 1
    with pytest.raises(InvariantViolation) as err:
        bench.dec.check()
    assert err.value.invariant == "ROUTER-LOAD"


def test_the_room_the_router_reads_is_current_whenever_it_reads():
    """ROUTER-ROOM: through reservations, waiting, growth, retraction, finishes
    and lent memory coming and going, the router's view of the instance
    (refreshed as it reads) is its free memory less its waiting requests
    whenever the engine hears from it (a finish may route the next call at
    once), and an instance whose figures changed is listed as stale."""
    bench, a, b = _two_growing()
    dec = bench.dec
    seen: list[int] = []

    def current(req) -> None:
        dec.check()
        room = dec.room.current()[dec.index]
        assert room == dec.free_tokens - dec.waiting and not dec.room_stale
        seen.append(room)

    reserved, finished = bench._reserved, bench._finished
    dec.on_reserved = lambda r: (current(r), reserved(r))
    dec.listener = Callbacks(on_finished=lambda r: (current(r), finished(r)))
    units = dec.lend(LendingConfig(cap_fraction=0.5))
    assert units.adopt(99, 300, dec.free_beyond_demand())
    assert dec.room_stale and dec.room.current() == [2000 - 300]
    bench.submit(a, b)
    c = request(3, 1200, output=10)  # waits, then reclaims the unit when it fits
    dec.request_memory(c)
    assert dec.room.current() == [dec.free_tokens - 1]
    bench.loop.run(1e6)
    assert sorted(r.session for r in bench.finished) == [1, 2, 3] and b.retractions == 1
    assert len(seen) >= 6 and dec.room.current() == [2000] and units.lent == 0
    dec.check(reserved_idle=0)
    entrant = dec.room.entrants[0]
    entrant.key += 1  # one token less posted, the tournament replayed
    dec.room.tournament.moved(entrant)
    with pytest.raises(InvariantViolation) as err:
        dec.check()
    assert err.value.invariant == "ROUTER-ROOM"
    entrant.key -= 1
    dec.room.tournament.moved(entrant)
    dec.check()
    dec.room_stale = True  # flagged but not listed
    with pytest.raises(InvariantViolation, match="ROUTER-ROOM"):
        dec.check()


def test_idle_reservations_are_accounted_until_the_join():
    loop = EventLoop()
    dec = DecodeInstance(0, HW.decode, HW.itl_slo_s, loop, lambda r: None, Callbacks())
    r = request(1, 1000, output=20)
    dec.request_memory(r)
    assert dec.used == dec.reserved_idle == 1000 + HW.decode.reserve_output_tokens
    dec.check(reserved_idle=r.reserved)
    dec.join(r)
    dec.check(reserved_idle=0)
    assert dec.decoding_tokens == dec.used
    loop.run(1e6)
    dec.check(reserved_idle=0)
    assert dec.used == 0 and not math.isnan(r.finished_s)


def test_a_reservation_larger_than_the_instance_is_refused():
    bench = Bench(kv_tokens=2000, reserve=8)
    with pytest.raises(RequestNeverFits) as err:
        bench.dec.request_memory(request(1, 1993))
    assert err.value.invariant == "LIVE-DECODE-FITS"
    assert "2001" in str(err.value) and "2000" in str(err.value)


def test_a_reservation_that_fits_later_waits_without_error():
    bench = Bench(kv_tokens=2000, reserve=8)
    big = request(1, 1500, output=3)
    bench.submit(big)
    late = request(2, 1992, output=3)  # exactly the whole instance
    bench.dec.request_memory(late)
    assert late.reserved == 0 and bench.dec.waiting == 1
    bench.loop.run(1e6)
    assert bench.finished == [big, late]


def test_a_retracted_request_decodes_all_its_steps_after_rejoining():
    """STAY: the finish entry of b's first stay (step 1000) must not end its
    second stay, which joins at step 599 with 500 of 999 steps done."""
    bench = Bench()
    a, b = request(1, 500, output=600), request(2, 500, output=1000)
    ran_after_join = {}
    finished = bench._finished

    def on_finished(req):
        ran_after_join[req.seq] = bench.dec.step - req.join_step
        finished(req)

    bench.dec.listener = Callbacks(on_finished=on_finished)
    bench.submit(a, b)
    while not (b.retractions and b in bench.dec.batch):
        bench.loop.run(bench.loop.now + 0.05)
        bench.dec.check()
    assert b.join_step == 599
    bench.loop.run(1e6)
    # b is retracted at step 500 and rejoins when a finishes (step 599).
    assert b.retractions == 1 and b.generated == 500
    assert b.generated + ran_after_join[b.seq] == b.decode_steps
    bench.dec.check()


def test_the_stay_check_catches_a_missing_finish_entry():
    bench, a, b = _two_growing()
    bench.submit(a, b)
    bench.dec.check()
    bench.dec.finish_heap.pop()
    with pytest.raises(InvariantViolation, match="STAY"):
        bench.dec.check()

