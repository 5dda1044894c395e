"""The heaps' entries order as the tuples they replaced.

Every heap of the simulator (events, eviction candidates, engine queues, the
decode batch's finish and crossing steps) holds entries that compare by their
own ``__lt__`` (cheaper than a tuple's comparison once compiled). A run's
order is the heaps' order, so each entry must compare exactly as its tuple
did, ties and all: these tests push the same keys as entries and as tuples
and require the same pops.
"""

from __future__ import annotations

import heapq

from hypothesis import given
from hypothesis import strategies as st

from basin.sim.cache import RadixCache, _Candidate
from basin.sim.decode import _Due
from basin.sim.events import _Event
from basin.sim.requests import Queued

from .helpers import request

#: Few distinct values, so that ties on the leading fields are common.
TIMES = st.sampled_from([0.0, 0.5, 1.0, 1.0 + 1e-12, 2.0, float("inf")])
SMALL = st.integers(0, 3)


def _pops(items: list, make) -> list[int]:
    """Push ``make(item)`` for each item (interleaving pops), return the
    positions of the popped items in ``items``."""
    heap: list = []
    out = []
    for i, item in enumerate(items):
        heapq.heappush(heap, (make(item, i), i))
        if i % 3 == 2:
            out.append(heapq.heappop(heap)[1])
    while heap:
        out.append(heapq.heappop(heap)[1])
    return out


def _entry_pops(entries: list, label) -> list:
    """The same pushes and pops as :func:`_pops` on heap entries; ``label``
    of each popped entry."""
    heap: list = []
    out = []
    for i, entry in enumerate(entries):
        heapq.heappush(heap, entry)
        if i % 3 == 2:
            out.append(label(heapq.heappop(heap)))
    while heap:
        out.append(label(heapq.heappop(heap)))
    return out


@given(st.lists(st.tuples(TIMES, SMALL), max_size=60))
def test_events_pop_in_time_class_sequence_order(items: list[tuple[float, int]]) -> None:
    want = _pops(items, lambda item, i: (item[0], item[1], i))
    events = [_Event(time_s, klass, i, print, None) for i, (time_s, klass) in enumerate(items)]
    assert _entry_pops(events, lambda e: e.seq) == want


@given(st.lists(TIMES, max_size=60))
def test_eviction_candidates_pop_in_stamp_sequence_order(stamps: list[float]) -> None:
    node = RadixCache(1024).root
    want = _pops(stamps, lambda stamp, i: (stamp, i))
    candidates = [_Candidate(stamp, i, node) for i, stamp in enumerate(stamps)]
    assert _entry_pops(candidates, lambda c: c.seq) == want


@given(st.lists(TIMES, max_size=40))
def test_queue_entries_pop_in_key_sequence_order(keys: list[float]) -> None:
    want = _pops(keys, lambda key, i: (key, i))
    entries = [Queued(key, request(i, 64, seq=i)) for i, key in enumerate(keys)]
    assert _entry_pops(entries, lambda e: e.seq) == want


@given(st.lists(st.tuples(SMALL, SMALL, SMALL), max_size=40))
def test_batch_entries_pop_in_step_sequence_stay_order(items: list[tuple[int, int, int]]) -> None:
    # (step, request, stay): one request may hold entries of several stays,
    # even for one step, as a retracted and rejoined request does.
    reqs = [request(i, 64, seq=i) for i in range(4)]
    want = [items[i] for i in _pops(items, lambda item, i: item)]
    entries = [_Due(step, stay, reqs[r]) for step, r, stay in items]
    assert _entry_pops(entries, lambda d: (d.step, d.seq, d.stay)) == want
