"""Routers: which prefill and decode instance a call goes to."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.sim.decode import DecodeInstance, DecodeRoom
from basin.sim.events import EventLoop
from basin.sim.prefill import PrefillInstance
from basin.sim.requests import Callbacks
from basin.sim.router import BALANCE_ABS_REQUESTS, choose_decode, choose_prefill

from .helpers import HW, prefills, request


def _cached(inst, key) -> None:
    n = sum(k for _, k in key)
    assert inst.cache.allocate(n)
    inst.cache.insert(key, 0.0, n)


def _queue(inst, n: int) -> None:
    """Make ``inst`` look busy with ``n`` queued requests (routers read only
    the load the instance counts and the backlog)."""
    inst.queue = [(0.0, i, None) for i in range(n)]
    inst.loads[inst.index] = n + len(inst.running)
    inst.check()


SYS = [("sys", 4096)]


def test_a_single_instance_takes_everything():
    only = prefills(1)
    for router in ("cache-aware", "affinity", "least-loaded"):
        assert choose_prefill(router, only, only[0].loads, request(1, 100)) is only[0]


def test_cache_aware_prefers_the_longest_cached_prefix():
    insts = prefills(3)
    _cached(insts[0], SYS)
    _cached(insts[2], SYS + [("u1", 1024)])
    req = request(1, 6144, key=SYS + [("u1", 1024), ("new", 1024)])
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[2]


def test_cache_aware_breaks_match_ties_by_load_then_index():
    insts = prefills(3)
    for inst in insts:
        _cached(inst, SYS)
    req = request(1, 5000, key=SYS + [("new", 904)])
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[0]
    _queue(insts[0], 3)
    _queue(insts[1], 1)
    _queue(insts[2], 1)
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[1]


def test_cache_aware_with_poor_reuse_goes_where_the_cache_holds_least():
    insts = prefills(3)
    _cached(insts[0], [("other", 8192)])
    _cached(insts[1], SYS)  # holds 4096 of a 10000-token prompt: below half
    _cached(insts[2], [("x", 2048)])
    req = request(1, 10_000, key=SYS + [("new", 5904)])
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[2]


def test_cache_aware_falls_back_to_the_shortest_queue_when_badly_unbalanced():
    insts = prefills(2)
    _cached(insts[0], SYS + [("u1", 1024)])
    req = request(1, 5200, key=SYS + [("u1", 1024), ("new", 80)])
    _queue(insts[0], BALANCE_ABS_REQUESTS + 1)
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[1]
    # Exactly the absolute margin is not imbalance: the cache decides.
    _queue(insts[0], BALANCE_ABS_REQUESTS)
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[0]
    # A large absolute gap below the ratio (1.5x) is not imbalance either.
    _queue(insts[0], 120)
    _queue(insts[1], 81)
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[0]
    _queue(insts[1], 79)
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[1]


def test_affinity_sticks_a_session_to_one_instance():
    insts = prefills(3)
    req = request(4, 100)
    assert choose_prefill("affinity", insts, insts[0].loads, req) is insts[1]  # uid 4 mod 3
    assert req.route.last_prefill == 1
    _queue(insts[1], 100)
    _cached(insts[0], req.key)
    assert choose_prefill("affinity", insts, insts[0].loads, req) is insts[1]
    req.route.last_prefill = 2  # the engine records where the session went
    assert choose_prefill("affinity", insts, insts[0].loads, req) is insts[2]


def test_least_loaded_picks_the_smallest_token_backlog():
    insts = prefills(3)
    insts[0].queued_tokens = 5000
    insts[1].queued_tokens = 3000
    insts[2].queued_tokens = 1000
    running = request(9, 4000)
    running.remaining = 2500
    insts[2].running = [running]  # backlog 3500: more than instance 1
    req = request(1, 100)
    assert choose_prefill("least-loaded", insts, insts[0].loads, req) is insts[1]
    insts[0].queued_tokens = 3000
    assert choose_prefill("least-loaded", insts, insts[0].loads, req) is insts[0]  # tie: lower index


def _decode(index: int, room: DecodeRoom) -> DecodeInstance:
    return DecodeInstance(index, HW.decode.model_copy(update={"kv_tokens": 10_000}), HW.itl_slo_s, EventLoop(),
                          lambda r: None, Callbacks(), room)


def test_decode_goes_to_the_most_free_memory_net_of_waiting_requests():
    room = DecodeRoom(3)
    decs = [_decode(i, room) for i in range(3)]
    assert room.current() == [10_000] * 3  # each instance is listed as it is made
    assert choose_decode(room, decs) is decs[0]  # all equal: lowest index
    for d, used in zip(decs, (4000, 1000, 999), strict=True):
        d.used = used
        d.room_changed()
    assert choose_decode(room, decs) is decs[2]
    decs[2].wait = [(0.0, i, request(i, 10)) for i in range(2)]  # 10000-999-2 < 10000-1000
    decs[2].waiting = 2
    decs[2].room_changed()
    assert choose_decode(room, decs) is decs[1]
    assert room.current() == [6000, 9000, 8999] and not room.stale
    one = DecodeRoom(1)
    assert choose_decode(one, [_decode(0, one)]).index == 0


@pytest.mark.parametrize("router", ["cache-aware", "affinity", "least-loaded"])
def test_routing_has_no_side_effects_on_the_caches(router):
    insts = prefills(2)
    _cached(insts[0], SYS)
    before = [(i.cache.device_used, len(list(i.cache.nodes())), i.cache.stats.queried_tokens) for i in insts]
    choose_prefill(router, insts, insts[0].loads, request(1, 5000, key=SYS + [("new", 904)]))
    assert [(i.cache.device_used, len(list(i.cache.nodes())), i.cache.stats.queried_tokens) for i in insts] == before


def _every_instance_walked(instances, req) -> PrefillInstance:
    """Cache-aware routing as first written: every instance's cache is walked
    (the session's own chunks where it was placed, its shared pieces elsewhere),
    then the router's own choice from the matches."""
    from basin.sim.requests import shared_pieces
    from basin.sim.router import MATCH_THRESHOLD

    key, placed, shared = req.key, req.route.placed_on, shared_pieces(req.key)
    matches = [i.cache.peek(key) if placed >> i.index & 1 else (i.cache.peek(key, None, shared) if shared else 0)
               for i in instances]
    loads = [len(i.queue) + len(i.running) for i in instances]
    # The longest match, then the shortest queue, then the first.
    best = min(range(len(instances)), key=lambda j: (-matches[j], loads[j], j))
    if matches[best] >= MATCH_THRESHOLD * req.prompt:
        return instances[best]
    return min(instances, key=lambda i: (i.cache.device_used, i.index))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_cache_aware_walks_fewer_caches_and_chooses_as_if_it_walked_them_all(data):
    n = data.draw(st.integers(2, 5), label="instances")
    insts = prefills(n, page_tokens=64)
    own = data.draw(st.lists(st.integers(64, 4096), min_size=1, max_size=4), label="own pieces")
    shared_tokens = data.draw(st.sampled_from([0, 64, 1000, 4096, 20_000]), label="shared tokens")
    shared = [(("group", "g"), shared_tokens)] if shared_tokens else []
    key = shared + [(7 << 24 | k << 2 | 3, size) for k, size in enumerate(own)]
    for inst in insts:
        if shared and data.draw(st.booleans(), label=f"shared cached on {inst.index}"):
            _cached(inst, shared[:1] if data.draw(st.booleans()) else [(("group", "g"), shared_tokens // 2 + 1)])
        depth = data.draw(st.integers(0, len(own)), label=f"own pieces cached on {inst.index}")
        if depth:
            _cached(inst, key[:len(shared) + depth])
        _queue(inst, data.draw(st.integers(0, 3), label=f"queue of {inst.index}"))
    req = request(7, sum(size for _, size in key), key=key)
    req.route.placed_on = data.draw(st.integers(0, (1 << n) - 1), label="placed on")
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is _every_instance_walked(insts, req)


def test_an_instance_the_session_never_used_still_wins_a_tie_on_load():
    # Placed on 0, which holds only the shared prefix; 1 holds it too with a
    # shorter queue. The shared pieces can match as much as the best placed
    # match, so 1 is walked and the tie goes to the shorter queue.
    insts = prefills(2)
    shared = [(("group", "g"), 8192)]
    key = shared + [(7 << 24 | 3, 1024)]
    for inst in insts:
        _cached(inst, shared)
    _queue(insts[0], 2)
    req = request(7, 9216, key=key)
    req.route.placed_on = 0b01
    assert choose_prefill("cache-aware", insts, insts[0].loads, req) is insts[1]
