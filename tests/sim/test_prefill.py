"""Prefill instances: locks held by running (and, as an option, queued)
requests, and liveness (a request that could never start is refused, one
that can waits)."""

from __future__ import annotations

import pytest

from basin.sim.cache import RadixCache
from basin.sim.events import EventLoop
from basin.sim.invariants import InvariantViolation, RequestNeverFits
from basin.sim.prefill import PrefillInstance

from .helpers import HW, prefill, request


def _cached(cache, key) -> None:
    n = sum(k for _, k in key)
    assert cache.allocate(n)
    cache.insert(key, 0.0, n)


def test_the_front_ends_read_of_each_queued_prompt_goes_to_the_next_step():
    loop = EventLoop()
    done: list = []
    pre = HW.prefill.model_copy(update={"frontend_s_per_prompt_token": 2e-6})
    inst = PrefillInstance(0, pre, RadixCache(1 << 20, page_tokens=64), loop, lambda r: done.append(loop.now))
    a, b = request(1, 300), request(2, 500)
    inst.enqueue(a)  # starts a step at once, which owes a's read
    inst.enqueue(b)  # arrives during it: the next step owes b's
    loop.run(10.0)
    cost = inst.costs.tokens_cost_s
    first = HW.prefill.step_overhead_s + cost(300, 0) + 300 * 2e-6
    second = HW.prefill.step_overhead_s + cost(500, 0) + 500 * 2e-6
    assert done == [pytest.approx(first, rel=1e-12), pytest.approx(first + second, rel=1e-12)]
    assert len(done) == 2 and inst.frontend_owed_s == 0.0


def test_a_prompt_larger_than_the_pool_is_refused_at_once():
    inst = prefill(0, cache_tokens=4096)
    with pytest.raises(RequestNeverFits) as err:
        inst.enqueue(request(1, 5000))
    assert err.value.invariant == "LIVE-PREFILL-FITS"
    assert "5000" in str(err.value) and "4096" in str(err.value)
    assert not inst.queue and inst.cache.lock_handles == 0


def test_a_fully_cached_prompt_as_large_as_the_pool_can_never_start():
    """Its cached prefix stays locked and its last token still needs a slot:
    1024 + 1 tokens in a 1024-token pool. It used to wait forever."""
    inst = prefill(0, cache_tokens=1024)
    _cached(inst.cache, [("c", 1024)])
    with pytest.raises(RequestNeverFits, match="1025"):
        inst.enqueue(request(1, 1024, key=[("c", 1024)]))


def test_a_request_blocked_by_a_pin_waits_and_starts_when_it_goes():
    loop = EventLoop()
    done = []
    inst = prefill(0, cache_tokens=2048, loop=loop, on_done=done.append)
    _cached(inst.cache, [("p", 1536)])
    pin = inst.cache.match([("p", 1536)], 0.0)
    inst.cache.lock(pin)
    req = request(1, 1024)
    inst.enqueue(req)  # 512 free: it waits (no error: it fits once the pin goes)
    loop.run(10.0)
    assert not done and inst.queue and not inst.busy
    assert inst.blocked_tokens == 1024
    inst.cache.check(lock_handles=2)
    inst.cache.unlock(pin)
    inst.kick()
    loop.run(20.0)
    assert done == [req] and req.uncached == 1024
    inst.release(req, loop.now)
    inst.cache.check(lock_handles=0)
    assert inst.cache.peek(req.key) == 1024


def test_queued_requests_hold_one_lock_each_until_they_give_way():
    loop = EventLoop()
    inst = prefill(0, cache_tokens=4096, loop=loop)
    _cached(inst.cache, [("p", 2304)])
    pin = inst.cache.match([("p", 2304)], 0.0)
    inst.cache.lock(pin)
    for uid in range(1, 4):
        _cached(inst.cache, [(("ctx", uid), 256)])
    # Each queued request locks its cached 256 tokens; the head needs more
    # room than the pool can give while the pin holds 2304.
    reqs = [request(uid, 2048, key=[(("ctx", uid), 256), (("new", uid), 1792)]) for uid in range(1, 4)]
    for r in reqs:
        inst.enqueue(r)
    # Nothing runs and the head cannot start: the other queued requests let
    # their prefixes go (they re-match when they start).
    assert [r.match is not None for r in reqs] == [True, False, False]
    inst.cache.check(lock_handles=2)
    inst.cache.unlock(pin)
    inst.kick()
    finished = []
    inst.on_done = finished.append
    while len(finished) < 3:
        loop.run(loop.now + 1.0)
        for r in finished:
            if r.match is not None:
                inst.release(r, loop.now)
    assert finished == reqs
    inst.cache.check(lock_handles=0)


def _host_prefill(loop, done, device=2048, host=8192, lock_queued: bool = False):
    """An instance whose prefix ("p", 1024) sits on the host tier only."""
    profile = HW.prefill.model_copy(update={"lock_queued_prefix": lock_queued})
    inst = PrefillInstance(0, profile, RadixCache(device, host_tokens=host, page_tokens=64), loop, done.append)
    _cached(inst.cache, [("p", 1024)])
    _cached(inst.cache, [("q", device)])  # pushes p off the device
    m = inst.cache.match([("p", 1024)], 0.0)
    assert (m.device_tokens, m.host_tokens) == (0, 1024)
    return inst


def test_a_retry_after_a_failed_allocation_loads_its_host_hit_once():
    """The first attempt cannot get the pool (a pin holds part of it). It used
    to load the host part back anyway, and the retry then computed those
    tokens again beside the loaded copy: 1024 locked + 2048 in a 2048-token
    pool, refused as never fitting. Nothing loads before the allocation now."""
    loop, done = EventLoop(), []
    inst = _host_prefill(loop, done)
    _cached(inst.cache, [("x", 512)])
    pin = inst.cache.match([("x", 512)], 0.0)
    inst.cache.lock(pin)
    req = request(1, 2048, key=[("p", 1024), ("new", 1024)])
    inst.enqueue(req)
    loop.run(1.0)
    assert not done and inst.blocked_tokens == 2048
    assert inst.cache.stats.loaded_tokens == 0
    inst.cache.unlock(pin)
    inst.kick()
    loop.run(20.0)
    assert done == [req]
    assert (req.cached, req.loaded, req.uncached) == (0, 1024, 1024)
    assert inst.cache.stats.loaded_tokens == 1024
    inst.release(req, loop.now)
    inst.cache.check(lock_handles=0)


def test_a_host_hit_loaded_by_another_request_since_the_match_is_a_device_hit():
    """Both requests matched p on the host tier when queued (queued requests
    lock their match here); the first loads it back, so the second's match is
    stale when it starts: it is taken again (p is on the device now) instead
    of recomputing p."""
    loop, done = EventLoop(), []
    inst = _host_prefill(loop, done, device=8192, host=16384, lock_queued=True)
    a = request(1, 1536, key=[("p", 1024), ("a", 512)])
    b = request(2, 1536, key=[("p", 1024), ("b", 512)])
    inst.busy = True  # queue both before either starts
    inst.enqueue(a)
    inst.enqueue(b)
    assert a.match is not None and b.match is not None and b.match.host_tokens == 1024
    inst.busy = False
    inst.kick()
    loop.run(20.0)
    assert done == [a, b]
    assert (a.cached, a.loaded, a.uncached) == (0, 1024, 512)
    assert (b.cached, b.loaded, b.uncached) == (1024, 0, 512)
    assert inst.cache.stats.loaded_tokens == 1024
    for r in (a, b):
        inst.release(r, loop.now)
    inst.cache.check(lock_handles=0)


def _queued_behind_a_long_prefill(lock_queued: bool):
    """``b`` is queued behind ``a`` while ``c`` needs the pool: whether b's
    cached prefix survives the wait depends on the queue lock."""
    loop, done = EventLoop(), []
    profile = HW.prefill.model_copy(update={"lock_queued_prefix": lock_queued})
    inst = PrefillInstance(0, profile, RadixCache(4096, page_tokens=64), loop, done.append)
    _cached(inst.cache, [("p", 2048)])
    assert inst.cache.allocate(1024)
    inst.cache.insert([("q", 1024)], 1.0, 1024)  # used after p: LRU takes p first
    inst.busy = True  # hold the queue while both enqueue
    b = request(2, 2560, key=[("p", 2048), ("b", 512)])
    inst.enqueue(b)
    # An older prefix-less request takes 2048 of the pool first: 1024 are free,
    # the rest is evicted from what no lock holds.
    a = request(1, 2048, seq=0)
    inst.enqueue(a)
    inst.busy = False
    inst.kick()
    loop.run(30.0)
    inst.release(a, loop.now)
    loop.run(60.0)
    return inst, a, b, done


def test_a_queued_request_holds_no_prefix_as_in_sglang():
    """By default a waiting request is matched only when it starts, so the
    pool taken by the request ahead of it evicts its cached prefix."""
    inst, a, b, done = _queued_behind_a_long_prefill(lock_queued=False)
    assert done == [a, b]
    assert (b.cached, b.uncached) == (0, 2560)
    inst.release(b, b.prefill_end_s)
    inst.cache.check(lock_handles=0)


def test_a_queued_request_keeps_its_prefix_when_the_queue_locks():
    """With ``lock_queued_prefix`` the match is locked at enqueue: the request
    ahead cannot evict it, and it starts from its cached prefix."""
    inst, a, b, done = _queued_behind_a_long_prefill(lock_queued=True)
    assert done == [a, b]
    assert (b.cached, b.uncached) == (2048, 512)
    assert inst.cache.peek([("q", 1024)]) == 0  # evicted in p's place
    inst.release(b, b.prefill_end_s)
    inst.cache.check(lock_handles=0)


def test_the_load_the_router_reads_follows_the_queue_and_the_running_list():
    """ROUTER-LOAD: queued, started, finished, removed, and a request taken
    back from a borrower all move the count as they move the lists."""
    loop = EventLoop()
    done = []
    inst = prefill(0, cache_tokens=8192, loop=loop, on_done=done.append)
    a, b, c = request(1, 3000), request(2, 3000), request(3, 500)
    for r in (a, b, c):
        inst.enqueue(r)
        inst.check()
    assert inst.load_requests == 3 and len(inst.running) == 1
    assert inst.remove(c) and inst.load_requests == 2
    inst.check()
    loop.run(60.0)
    assert done == [a, b] and inst.load_requests == 0
    inst.check()
    inst.resume(c)  # as a borrower hands back a request it started
    assert inst.load_requests == 1
    inst.check()
    assert inst.loads == [1]  # what the router reads
    inst.loads[0] += 1
    with pytest.raises(InvariantViolation) as err:
        inst.check()
    assert err.value.invariant == "ROUTER-LOAD"
