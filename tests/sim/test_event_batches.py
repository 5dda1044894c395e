"""Events scheduled as a batch run in the order that one ``at`` per event
gives (sequence numbers taken when the batch is scheduled), while the heap
holds only the batch's earliest waiting event."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.sim.events import CLIENT, CONTROL, ENGINE, EventLoop

#: Few distinct times, so that ties (broken by class, then sequence) are common.
TIMES = st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.5])
#: (time, class, follow-up delay or None): a handler may schedule one more event.
SINGLE = st.tuples(TIMES, st.sampled_from([ENGINE, CLIENT, CONTROL]),
                   st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0])))


def _trace(singles_before, batch, singles_after, klass: int, batched: bool) -> list[str]:
    loop = EventLoop()
    trace: list[str] = []

    def handler(label: str, follow_up: float | None = None, follow_klass: int = ENGINE) -> None:
        trace.append(f"{label}@{loop.now}")
        if follow_up is not None:
            loop.at(loop.now + follow_up, follow_klass, lambda _: trace.append(f"{label}+@{loop.now}"))

    def schedule_singles(singles, prefix: str) -> None:
        for j, (t, k, follow) in enumerate(singles):
            loop.at(t, k, lambda _, j=j, follow=follow, k=k: handler(f"{prefix}{j}", follow, k))

    schedule_singles(singles_before, "a")
    labels = [f"b{j}" for j in range(len(batch))]
    if batched:
        loop.at_each(list(batch), klass, lambda label: handler(label, 0.0), labels)
    else:
        for t, label in zip(batch, labels, strict=True):
            loop.at(t, klass, lambda _, label=label: handler(label, 0.0))
    schedule_singles(singles_after, "c")
    loop.run(10.0)
    return trace


@settings(max_examples=300, deadline=None)
@given(st.lists(SINGLE, max_size=8), st.lists(TIMES, max_size=12), st.lists(SINGLE, max_size=8),
       st.sampled_from([ENGINE, CLIENT, CONTROL]))
def test_a_batch_runs_as_its_events_scheduled_one_by_one(before, batch, after, klass):
    assert _trace(before, batch, after, klass, batched=True) == _trace(before, batch, after, klass, batched=False)


def test_only_the_earliest_event_of_a_batch_is_in_the_heap():
    loop = EventLoop()
    seen: list[int] = []
    loop.at_each([3.0, 1.0, 2.0, 1.0], CLIENT, seen.append, [0, 1, 2, 3])
    assert loop.next_event_s == 1.0
    assert loop.pending == 1
    loop.run(1.5)
    assert seen == [1, 3]  # same time: list order
    assert loop.pending == 1
    loop.run(5.0)
    assert seen == [1, 3, 2, 0]
    assert loop.events_run == 4
    assert loop.next_event_s is None


def test_a_batch_needs_one_argument_per_time():
    loop = EventLoop()
    with pytest.raises(ValueError, match="2 times for 1 arguments"):
        loop.at_each([1.0, 2.0], CLIENT, print, [None])
    loop.at_each([], CLIENT, print, [])
    assert loop.next_event_s is None
