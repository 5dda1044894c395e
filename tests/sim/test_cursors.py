"""A session keeps one cursor per cache it was inserted into, and a walk
resumed at any of them gives what a walk from the root gives.

Two worlds run the same requests on two caches each: in one every walk
starts at the session's cursor in that cache, in the other at the root.
Sessions hop between the caches, grow their keys, sometimes rebuild them
(which drops their cursors), and the caches evict to a host tier and beyond,
so cursors go stale, point at split nodes, or at nodes that left the tree.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from basin.sim.cache import RadixCache
from basin.sim.requests import Route

PAGE = 8


def _world(device_tokens: int, host_ratio: int) -> list[RadixCache]:
    return [RadixCache(device_tokens=device_tokens, host_tokens=host_ratio * device_tokens, page_tokens=PAGE)
            for _ in range(2)]


def _session(uid: int) -> Route:
    return Route(uid)


def _serve(cache: RadixCache, session: Route | None, key, now: float) -> tuple[int, int, int, int]:
    """One request as the engine drives it (match, lock, load back, allocate,
    insert, unlock); with ``session``, its cursor in ``cache`` starts the walks
    and the insert's cursor is kept. Returns the match's tokens by tier and
    the pieces its ends lie in (a walk resumed on the host tier leaves the
    device end's piece unknown, -1, and so the last end's when the host part
    is too short to load back; the insert then walks from the root)."""
    cursor = session.cursor_on(cache) if session is not None else None
    m = cache.match(key, now, cursor)
    seen = (m.device_tokens, m.host_tokens, m.device_piece, m.last_piece)
    cache.lock(m)
    loaded = cache.load_back(m)
    uncached = sum(n for _, n in key) - m.device_tokens - loaded
    if cache.allocate(uncached):
        kept = cache.insert(key, now, uncached, m)
        if session is not None:
            session.keep_cursor(cache, kept)
    cache.unlock(m)
    cache.check()
    return seen


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1), st.integers(1, 120), st.booleans()),
             min_size=1, max_size=80),
    st.integers(100, 1500),
    st.integers(0, 3),
)
def test_walks_from_per_cache_cursors_equal_walks_from_the_root(ops, device_tokens, host_ratio):
    resumed, rooted = _world(device_tokens, host_ratio), _world(device_tokens, host_ratio)
    sessions: dict[int, Route] = {}
    keys: dict[int, list] = {}
    for t, (sid, where, tokens, rebuild) in enumerate(ops, start=1):
        session = sessions.setdefault(sid, _session(sid))
        key = keys.setdefault(sid, [(("sys",), 16)])
        if rebuild and len(key) > 2:
            # A rebuilt key does not extend the old one: the cursors go.
            key = keys[sid] = [(("sys",), 16), ((sid, "rebuilt", t), tokens)]
            session.cursors = []
        else:
            key.append(((sid, t), tokens))
        if sum(n for _, n in key) > device_tokens:
            keys[sid] = [(("sys",), 16)]
            session.cursors = []
            continue
        session.key = key
        for a, b in zip(resumed, rooted, strict=True):
            assert a.peek(key, session.cursor_on(a)) == b.peek(key) == a.peek(key)
        now = float(t)
        got, want = _serve(resumed[where], session, key, now), _serve(rooted[where], None, key, now)
        assert got[:2] == want[:2]
        assert got[2] in (want[2], -1) and got[3] in (want[3], -1)
        assert len({id(c.cache) for c in session.cursors}) == len(session.cursors) <= 2


def test_a_session_keeps_a_cursor_in_each_cache_and_forgets_one_alone():
    a, b = _world(4096, 0)
    session = _session(1)
    key = [(("sys",), 16), ((1, 0), 64)]
    session.key = key
    _serve(a, session, key, 1.0)
    _serve(b, session, key, 2.0)
    cur_a, cur_b = session.cursor_on(a), session.cursor_on(b)
    assert cur_a is not None and cur_b is not None
    assert cur_a.cache is a and cur_b.cache is b
    key.append(((1, 1), 32))
    _serve(a, session, key, 3.0)
    assert session.cursor_on(a) is not cur_a and session.cursor_on(a).tokens == 112
    assert session.cursor_on(b) is cur_b  # untouched by the walk in a
    session.keep_cursor(a, None)
    assert session.cursor_on(a) is None and session.cursor_on(b) is cur_b
    session.keep_cursor(a, None)  # forgetting twice is harmless
    assert session.cursors == [cur_b]
