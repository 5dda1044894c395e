"""The radix prefix cache: invariants, tiers, and agreement with a reference model."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from basin.sim.cache import RadixCache

PAGE = 4


def run_request(cache: RadixCache, key, now: float) -> tuple[int, int, int]:
    """Drive one request as the engine does: match, lock, load, allocate, insert."""
    m = cache.match(key, now)
    cache.lock(m)
    loaded = cache.load_back(m, now)
    prompt = sum(n for _, n in key)
    uncached = prompt - m.device_tokens - loaded
    ok = cache.allocate(uncached, now)
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
    assert cache.allocate(640, 3.0)
    assert not cache.allocate(64, 3.0)  # the only other block is locked
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
        assert cache.allocate(uncached, float(t))
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
    for t, (sid, calls, n) in enumerate(ops, start=1):
        chain = chains.setdefault(sid, [("sys", 32)])
        chain.append(((sid, len(chain)), n))
        key = list(chain)
        if sum(k for _, k in key) > device_tokens:
            chains[sid] = [("sys", 32)]
            continue
        m = cache.match(key, float(t))
        cache.lock(m)
        loaded = cache.load_back(m, float(t))
        uncached = sum(k for _, k in key) - m.device_tokens - loaded
        if cache.allocate(uncached, float(t)):
            cache.insert(key, float(t), uncached)
        cache.unlock(m)
        cache.check()
        assert cache.match(key, float(t) + 0.5).total_tokens <= sum(k for _, k in key)
