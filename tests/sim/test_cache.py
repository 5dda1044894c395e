"""The radix prefix cache: invariants, tiers, and agreement with a reference model."""

from __future__ import annotations

import pickle

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from basin.sim.cache import RadixCache
from basin.sim.invariants import InvariantViolation, require

PAGE = 4


def run_request(cache: RadixCache, key, now: float) -> tuple[int, int, int]:
    """Drive one request as the engine does: match, lock, load, allocate, insert."""
    m = cache.match(key, now)
    cache.lock(m)
    loaded = cache.load_back(m)
    prompt = sum(n for _, n in key)
    uncached = prompt - m.device_tokens - loaded
    ok = cache.allocate(uncached)
    assert ok
    cache.insert(key, now, uncached)
    cache.unlock(m)
    cache.check()
    return m.device_tokens, loaded, uncached


def test_session_chain_hits_previous_prompt():
    cache = RadixCache(device_tokens=10_000, page_tokens=64)
    k0 = [("sys", 1000), (("s", 0), 1000)]
    assert run_request(cache, k0, 1.0) == (0, 0, 2000)
    k1 = k0 + [(("s", "o0"), 100), (("s", 1), 300)]
    dev, loaded, uncached = run_request(cache, k1, 2.0)
    assert dev == 1984  # page-aligned part of the previous prompt
    assert uncached == 2400 - 1984
    # Another session shares the system prompt only.
    dev, _, _ = run_request(cache, [("sys", 1000), (("t", 0), 500)], 3.0)
    assert dev == 960


def test_lru_evicts_least_recent_session_first():
    cache = RadixCache(device_tokens=3 * 640, page_tokens=64)
    for i, t in enumerate([1.0, 2.0, 3.0]):
        run_request(cache, [(("s", i), 640)], t)
    run_request(cache, [(("s", 0), 640)], 4.0)  # touch session 0
    run_request(cache, [(("s", 3), 640)], 5.0)  # needs room: session 1 is LRU
    assert cache.match([(("s", 1), 640)], 6.0).device_tokens == 0
    assert cache.match([(("s", 0), 640)], 7.0).device_tokens == 640
    assert cache.match([(("s", 2), 640)], 8.0).device_tokens == 640


def test_locked_blocks_survive_pressure():
    cache = RadixCache(device_tokens=1280, page_tokens=64)
    run_request(cache, [(("a", 0), 640)], 1.0)
    m = cache.match([(("a", 0), 640)], 2.0)
    cache.lock(m)
    assert cache.allocate(640)
    assert not cache.allocate(64)  # the only other block is locked
    cache.check()
    assert cache.match([(("a", 0), 640)], 4.0).device_tokens == 640
    cache.release(640)
    cache.unlock(m)
    cache.check()


def test_host_tier_keeps_evicted_prefix_and_loads_it_back():
    cache = RadixCache(device_tokens=1280, host_tokens=4 * 1280, page_tokens=64)
    run_request(cache, [(("a", 0), 640)], 1.0)
    run_request(cache, [(("b", 0), 1280)], 2.0)  # pushes a to host
    m = cache.match([(("a", 0), 640), (("a", 1), 64)], 3.0)
    assert (m.device_tokens, m.host_tokens) == (0, 640)
    dev, loaded, uncached = run_request(cache, [(("a", 0), 640), (("a", 1), 64)], 3.0)
    assert (dev, loaded, uncached) == (0, 640, 64)
    assert cache.stats.loaded_tokens == 640


def test_state_slots_limit_reusable_prefixes():
    cache = RadixCache(device_tokens=100_000, page_tokens=64, state_slots=1)
    run_request(cache, [(("a", 0), 640)], 1.0)
    run_request(cache, [(("b", 0), 640)], 2.0)  # takes the only state slot
    assert cache.match([(("a", 0), 640), (("a", 1), 64)], 3.0).total_tokens == 0
    assert cache.match([(("b", 0), 640), (("b", 1), 64)], 4.0).total_tokens == 640


# --------------------------------------------------------------------------
# Reference model: page-granular keys, every page its own chunk, so that tree
# nodes and pages coincide; eviction removes the least-recently-used leaf page.

class ReferenceCache:
    def __init__(self, capacity_pages: int):
        self.capacity = capacity_pages
        self.stamp: dict[tuple, float] = {}  # page-prefix -> last access

    def match(self, pages: tuple, now: float) -> int:
        n = 0
        while n < len(pages) and pages[: n + 1] in self.stamp:
            n += 1
        for i in range(1, n + 1):
            self.stamp[pages[:i]] = now
        return n

    def insert(self, pages: tuple, now: float, locked: int) -> None:
        new = [pages[:i] for i in range(1, len(pages) + 1) if pages[:i] not in self.stamp]
        while len(self.stamp) + len(new) > self.capacity:
            leaves = [p for p in self.stamp if not any(len(q) == len(p) + 1 and q[:-1] == p
                                                       for q in self.stamp)
                      and not (len(p) <= locked and pages[: len(p)] == p)]
            victim = min(leaves, key=lambda p: self.stamp[p])
            del self.stamp[victim]
        for p in new:
            self.stamp[p] = now
        for i in range(1, len(pages) + 1):
            self.stamp[pages[:i]] = now


page_keys = st.lists(st.integers(0, 5), min_size=1, max_size=8).map(tuple)


@settings(max_examples=300, deadline=None)
@given(st.lists(page_keys, min_size=1, max_size=40), st.integers(2, 16))
def test_radix_cache_matches_reference_model(requests, capacity_pages):
    cache = RadixCache(device_tokens=capacity_pages * PAGE, page_tokens=PAGE)
    ref = ReferenceCache(capacity_pages)
    for t, pages in enumerate(requests, start=1):
        if len(pages) > capacity_pages:
            pages = pages[:capacity_pages]
        # every page is a chunk identified by its whole prefix
        key = [(pages[: i + 1], PAGE) for i in range(len(pages))]
        m = cache.match(key, float(t))
        expected = ref.match(pages, float(t))
        assert m.device_tokens == expected * PAGE, (t, pages)
        cache.lock(m)
        uncached = len(pages) * PAGE - m.device_tokens
        assert cache.allocate(uncached)
        cache.insert(key, float(t), uncached)
        cache.unlock(m)
        ref.insert(pages, float(t), expected)
        cache.check()
        assert cache.device_used == len(ref.stamp) * PAGE


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 6), st.integers(1, 300)), min_size=1, max_size=60),
    st.integers(200, 3000),
    st.integers(0, 4),
)
def test_invariants_hold_under_random_sessions(ops, device_tokens, host_ratio):
    """Random sessions growing their chains: capacity is never exceeded and
    accounting stays exact in both tiers."""
    cache = RadixCache(device_tokens=device_tokens, host_tokens=host_ratio * device_tokens, page_tokens=16)
    chains: dict[int, list] = {}
    for t, (sid, _calls, n) in enumerate(ops, start=1):
        chain = chains.setdefault(sid, [("sys", 32)])
        chain.append(((sid, len(chain)), n))
        key = list(chain)
        if sum(k for _, k in key) > device_tokens:
            chains[sid] = [("sys", 32)]
            continue
        m = cache.match(key, float(t))
        cache.lock(m)
        loaded = cache.load_back(m)
        uncached = sum(k for _, k in key) - m.device_tokens - loaded
        if cache.allocate(uncached):
            cache.insert(key, float(t), uncached)
        cache.unlock(m)
        cache.check()
        assert cache.match(key, float(t) + 0.5).total_tokens <= sum(k for _, k in key)


# --------------------------------------------------------------------------
# Locks across splits (the phantom-lock leak) and the lock-balance invariant.

def _fill(cache: RadixCache, key) -> None:
    n = sum(k for _, k in key)
    assert cache.allocate(n)
    cache.insert(key, 0.0, n)


def test_splitting_a_locked_node_leaves_no_phantom_lock():
    """Reproduction: a locked node split by an insert used to hand a copy of
    its lock count to the new head, which no unlock ever released."""
    cache = RadixCache(device_tokens=2048, page_tokens=64)
    _fill(cache, [(1, 1024)])
    whole = cache.match([(1, 1024)], 1.0)
    cache.lock(whole)
    half = cache.match([(1, 512), (2, 512)], 2.0)  # ends inside the locked node: splits it
    cache.lock(half)
    assert cache.allocate(512)
    cache.insert([(1, 512), (2, 512)], 2.0, 512)
    cache.check(lock_handles=2)
    cache.unlock(whole)
    cache.unlock(half)
    cache.check(lock_handles=0)
    assert all(n.lock_ref == 0 for n in cache.nodes())
    # Every block can be reclaimed: the pool empties completely.
    assert cache.allocate(2048)
    assert cache.device_used == 0 and not list(cache.nodes())
    cache.release(2048)
    cache.check()


def test_a_lock_still_protects_its_whole_prefix_after_a_split():
    cache = RadixCache(device_tokens=2048, page_tokens=64)
    _fill(cache, [(1, 1024)])
    m = cache.match([(1, 1024)], 1.0)
    cache.lock(m)
    cache.match([(1, 256)], 2.0)  # splits the locked node at 256
    assert len(list(cache.nodes())) == 2
    # Fill the rest of the pool and then demand all of it: nothing locked goes.
    _fill(cache, [(3, 1024)])
    assert not cache.allocate(2048)
    assert cache.allocate(1024)  # only the unlocked (3, ...) block could go
    assert cache.peek([(1, 1024)]) == 1024
    cache.release(1024)
    cache.unlock(m)
    assert cache.allocate(2048) and cache.device_used == 0
    cache.release(2048)
    cache.check(lock_handles=0)


def test_split_of_a_locked_host_path_keeps_the_handle_valid():
    """The locked match ends in the host tier; a split of its host node in
    between still leaves load-back and unlock exact."""
    cache = RadixCache(device_tokens=1024, host_tokens=4096, page_tokens=64)
    _fill(cache, [(1, 1024)])
    _fill(cache, [(2, 1024)])  # pushes (1, ...) to the host tier
    m = cache.match([(1, 1024)], 1.0)
    assert (m.device_tokens, m.host_tokens) == (0, 1024)
    cache.lock(m)
    cache.match([(1, 512)], 2.0)  # splits the locked host node
    cache.check(lock_handles=1)
    assert cache.load_back(m) == 1024
    assert cache.peek([(1, 1024)]) == 1024
    cache.unlock(m)
    cache.check(lock_handles=0)
    assert cache.allocate(1024) and cache.device_used == 0
    cache.release(1024)
    assert cache._evict_host(10**9) == 2048
    assert cache.host_used == 0 and not list(cache.nodes())


def test_a_chunk_repeated_in_the_next_piece_is_not_its_own_continuation():
    # [c: 0..128) and [c: 0..64) + [c: 0..64) share only the first 64 tokens:
    # the second piece begins chunk c again, it does not continue it.
    cache = RadixCache(device_tokens=10_000, page_tokens=64)
    _fill(cache, [("c", 128)])
    assert cache.peek([("c", 64), ("c", 64)]) == 64
    assert cache.peek([("c", 128)]) == 128
    _fill(cache, [("c", 64), ("c", 64)])
    assert cache.peek([("c", 64), ("c", 64)]) == 128
    assert cache.peek([("c", 128)]) == 128
    head = cache.root.children["c"]
    assert (head.length, head.next.start, head.children["c"].start) == (64, 64, 0)
    cache.check()


def test_child_kind_is_checked():
    cache = RadixCache(device_tokens=10_000, page_tokens=64)
    _fill(cache, [("c", 128)])
    cache.match([("c", 64), ("d", 64)], 1.0)  # splits c at 64: its tail continues the head
    cache.check()
    head = cache.root.children["c"]
    tail = head.next
    assert tail is not None and tail.start == 64
    head.next, head.children = None, {"c": tail}  # the tail held as if it began the chunk
    with pytest.raises(InvariantViolation) as err:
        cache.check()
    assert err.value.invariant == "CHILD-KIND"


def test_the_shared_empty_children_are_never_written():
    # Nodes without chunk children share one empty dictionary; a write into it
    # would hand a child to every such node, so the check looks for one.
    cache = RadixCache(device_tokens=10_000, page_tokens=64)
    _fill(cache, [("c", 128)])
    leaf = cache.root.children["c"]
    leaf.children["x"] = leaf
    try:
        with pytest.raises(InvariantViolation, match="shared empty children"):
            cache.check()
    finally:
        leaf.children.clear()
    cache.check()


def test_lock_balance_is_checked_against_the_live_handles():
    cache = RadixCache(device_tokens=4096, page_tokens=64)
    _fill(cache, [(1, 640)])
    m = cache.match([(1, 640)], 1.0)
    cache.lock(m)
    assert cache.lock_handles == 1
    cache.check(lock_handles=1)
    with pytest.raises(InvariantViolation) as err:
        cache.check(lock_handles=0)  # a caller that lost track of a handle
    assert err.value.invariant == "LOCK-BALANCE"
    next(cache.nodes()).lock_ref += 1  # a reference no handle owns (the old leak)
    with pytest.raises(InvariantViolation, match="LOCK-BALANCE"):
        cache.check()
    next(cache.nodes()).lock_ref -= 1
    cache.unlock(m)
    with pytest.raises(InvariantViolation, match="LOCK-BALANCE") as err:
        cache.unlock(m)  # a second unlock of the same lock
    assert err.value.invariant == "LOCK-BALANCE"


def test_accounting_errors_are_named_and_survive_python_O():
    cache = RadixCache(device_tokens=1024, page_tokens=64)
    with pytest.raises(InvariantViolation) as err:
        cache.release(64)
    assert err.value.invariant == "INFLIGHT" and isinstance(err.value, RuntimeError)
    cache.inflight = 0
    cache.device_used = 64  # accounting that no node backs
    with pytest.raises(InvariantViolation, match="ACCOUNTING"):
        cache.check()


def test_invariant_violation_pickles_with_its_name():
    err = pickle.loads(pickle.dumps(InvariantViolation("CAP-DEVICE", "2 > 1")))
    assert (err.invariant, err.detail, str(err)) == ("CAP-DEVICE", "2 > 1", "CAP-DEVICE: 2 > 1")
    with pytest.raises(InvariantViolation, match="^TREE$"):
        require(False, "TREE")
    require(True, "TREE")


def test_locked_device_tokens_is_the_floor_a_lock_keeps():
    cache = RadixCache(device_tokens=1024, host_tokens=4096, page_tokens=64)
    _fill(cache, [(1, 512)])
    _fill(cache, [(1, 512), (2, 512)])
    _fill(cache, [(3, 1024)])  # (1, 2) to host
    m = cache.match([(1, 512), (2, 512), (4, 64)], 1.0)
    assert (m.device_tokens, m.host_tokens) == (0, 1024)
    cache.lock(m)
    assert cache.locked_device_tokens(m) == 0
    assert cache.load_back(m) == 1024
    assert cache.locked_device_tokens(m) == 1024
    cache.unlock(m)


# Keys that share chunks at varying lengths, so inserts and matches split
# nodes that other handles hold locked.
CHAINS = (
    (("sys", 40), ("a0", 36), ("a1", 50), ("a2", 30)),
    (("sys", 40), ("b0", 24), ("b1", 70)),
    (("c0", 90), ("c1", 45)),
)


def _chain_key(chain: int, tokens: int) -> list:
    key, left = [], tokens
    for chunk, n in CHAINS[chain]:
        if left <= 0:
            break
        key.append((chunk, min(n, left)))
        left -= n
    return key


_chain_pos = st.tuples(st.integers(0, 2), st.integers(1, 160))
cache_ops = st.lists(
    st.one_of(
        # A request: match, lock, load back, allocate, insert; it keeps its
        # lock (still running, or pinned) or lets it go.
        st.tuples(st.just("request"), _chain_pos, st.booleans()),
        st.tuples(st.just("request"), _chain_pos, st.booleans()),
        # A queued request: match and lock only.
        st.tuples(st.just("lock"), _chain_pos, st.just(False)),
        st.tuples(st.just("unlock"), st.tuples(st.integers(0, 99), st.just(0)), st.just(False)),
        # Pool pressure: allocate and give back (evicts LRU blocks).
        st.tuples(st.just("pressure"), st.tuples(st.integers(1, 400), st.just(0)), st.just(False)),
    ),
    min_size=4, max_size=40,
)


@settings(max_examples=250, deadline=None, derandomize=True)
@given(cache_ops, st.integers(160, 600), st.sampled_from([0, 1, 3]), st.sampled_from([None, 2]))
def test_random_interleavings_keep_locks_balanced_and_the_pool_reclaimable(ops, device_tokens, host_ratio, slots):
    cache = RadixCache(device_tokens=device_tokens, host_tokens=host_ratio * device_tokens, page_tokens=8,
                       state_slots=slots)
    held: list[tuple[list, object]] = []
    for t, (op, (a, b), keep) in enumerate(ops, start=1):
        now = float(t)
        if op in ("request", "lock"):
            key = _chain_key(a, b)
            m = cache.match(key, now)
            cache.lock(m)
            if op == "request":
                loaded = cache.load_back(m) if m.host_tokens else 0
                uncached = max(sum(n for _, n in key) - m.device_tokens - loaded, 0)
                if cache.allocate(uncached):
                    cache.insert(key, now, uncached)
                cache.unlock(m)
                if keep:  # a pin on what was just cached
                    m = cache.match(key, now)
                    cache.lock(m)
            if op == "lock" or keep:
                held.append((key, m))
        elif op == "unlock" and held:
            _, m = held.pop(a % len(held))
            cache.unlock(m)
        elif op == "pressure":
            if cache.allocate(a):
                cache.release(a)
        cache.check(lock_handles=len(held))
        for key, m in held:
            # LOCKED-KEPT: a held match is still cached, in the tier it was in or higher.
            assert cache.peek(key) >= m.total_tokens
            node = m.last_node
            while node is not cache.root:
                assert node.parent is not None and node in node.parent.all_children()
                node = node.parent
            assert m.device_node.on_device
    for _, m in held:
        cache.unlock(m)
    cache.check(lock_handles=0)
    assert all(n.lock_ref == 0 for n in cache.nodes())
    # Everything unlocked: the device pool and then the host tier empty completely.
    assert cache.inflight == 0
    assert cache.allocate(device_tokens)
    assert cache.device_used == 0
    cache.release(device_tokens)
    cache._evict_host(10**9)
    assert cache.host_used == 0 and not list(cache.nodes())
    cache.check(lock_handles=0)


def test_with_host_room_to_spare_every_device_node_is_backed_up():
    """INCLUSIVE: under write-through, a device node is on the host tier too
    when the host has room, through evictions, load-backs and splits."""
    import random

    cache = RadixCache(4096, host_tokens=1 << 20, page_tokens=64)
    rng = random.Random(1)
    for i in range(200):
        key = [(("g", i % 3), 256), (i % 17, rng.randrange(64, 1500))]
        m = cache.match(key, float(i))
        cache.lock(m)
        loaded = cache.load_back(m) if m.host_tokens else 0
        uncached = sum(n for _, n in key) - m.device_tokens - loaded
        if cache.allocate(uncached):
            cache.insert(key, float(i), uncached, m)
        cache.unlock(m)
        cache.check()
    on_device = [n for n in cache.nodes() if n.on_device]
    assert len(on_device) > 5 and cache.stats.evicted_device_tokens > 0 and cache.stats.loaded_tokens > 0
    assert all(n.on_host for n in on_device)


def test_keys_diverging_inside_the_first_page_match_nothing():
    """A shared prefix shorter than a page, then two sessions' own chunks:
    the second session's walk stops inside the first page and keeps no
    tokens (the walk back to a page boundary ends at the root)."""
    cache = RadixCache(device_tokens=10_000, page_tokens=128)
    first = [(("system",), 79), (1, 12), (2, 200)]
    assert cache.allocate(291)
    cache.insert(first, 0.0, 291)
    other = [(("system",), 79), (3, 12), (4, 100)]
    m = cache.match(other, 1.0)
    assert (m.device_tokens, m.host_tokens) == (0, 0)
    assert m.last_node is cache.root
    same_start = [(("system",), 79), (1, 12), (5, 100)]
    assert cache.match(same_start, 2.0).device_tokens == 0  # 91 tokens in common: less than a page
    cache.check()
