"""A timer (one pending engine event per owner, moved in place) runs in the
order that pushing a new event per move and skipping the superseded ones
gives, the way a decode instance's wakes were scheduled before timers."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from basin.sim.events import CLIENT, CONTROL, ENGINE, EventLoop, Timer

T = TypeVar("T")

TIMERS = 6
#: Few distinct delays, so that same-time ties (class, then sequence) are common.
DELAYS = st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0])
OPS = st.lists(st.one_of(
    st.tuples(st.just("at"), DELAYS, st.sampled_from([ENGINE, CLIENT, CONTROL])),
    st.tuples(st.just("set"), DELAYS, st.integers(0, TIMERS - 1)),
    st.tuples(st.just("clear"), st.just(0.0), st.integers(0, TIMERS - 1)),
), max_size=80)


def _calling(handler: Callable[[T], object], arg: T) -> Callable[[], None]:
    def call() -> None:
        handler(arg)
    return call


def _trace(ops: list[tuple[str, float, int]], timers: bool) -> list[tuple[str, float]]:
    """Run a script: each event or timer that fires records itself and
    performs the script's next two operations. ``timers``: timers are the
    loop's; otherwise each move pushes an event and a generation count
    skips the superseded ones."""
    loop = EventLoop()
    trace: list[tuple[str, float]] = []
    script: Iterator[tuple[str, float, int]] = iter(ops)
    made: dict[int, Timer] = {}  # made on first use, so that the tree grows mid-run
    generation = [0] * TIMERS

    def fire(label: str) -> None:
        trace.append((label, loop.now))
        for _ in range(2):
            op = next(script, None)
            if op is None:
                return
            kind, delay, which = op
            if kind == "at":
                loop.at(loop.now + delay, which, fire, f"e{len(trace)}")
            elif timers:
                if which not in made:
                    made[which] = loop.add_timer(_calling(fire, f"t{which}"))
                if kind == "set":
                    made[which].set(loop.now + delay)
                else:
                    made[which].clear()
            else:
                generation[which] += 1
                if kind == "set":
                    loop.at(loop.now + delay, ENGINE, wake, (which, generation[which]))

    def wake(arg: tuple[int, int]) -> None:
        which, gen = arg
        if gen == generation[which]:
            generation[which] += 1  # fired: a later clear or set finds it gone
            fire(f"t{which}")

    for j in range(3):
        loop.at(0.0, CONTROL, fire, f"start{j}")
    loop.run(50.0)
    return trace


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_timers_run_as_events_pushed_per_move_with_the_superseded_skipped(ops):
    assert _trace(ops, timers=True) == _trace(ops, timers=False)


def test_a_timer_moves_in_place_and_orders_by_when_it_was_set():
    loop = EventLoop()
    seen: list[str] = []
    first = loop.add_timer(lambda: seen.append("first"))
    second = loop.add_timer(lambda: seen.append("second"))
    first.set(5.0)
    loop.at(2.0, CLIENT, seen.append, "client")
    second.set(2.0)
    loop.at(2.0, ENGINE, seen.append, "engine")  # same time, class ENGINE, set after the timer
    first.set(1.0)  # moved earlier: nothing left behind at 5.0
    assert loop.pending == 4
    assert loop.next_event_s == 1.0
    assert first.time_s == 1.0
    loop.run(10.0)
    assert seen == ["first", "second", "engine", "client"]
    assert loop.events_run == 4
    assert first.time_s == math.inf
    assert loop.pending == 0


def test_a_cleared_timer_does_not_fire_and_clearing_an_unset_one_is_harmless():
    loop = EventLoop()
    seen: list[int] = []
    timers = [loop.add_timer(_calling(seen.append, i)) for i in range(5)]  # 5: the tree grows to 8 leaves
    timers[3].clear()
    for i, t in enumerate(timers):
        t.set(1.0 + (i % 2))
    timers[2].clear()
    loop.run(0.5)
    assert seen == [] and loop.now == 0.5
    loop.run(10.0)
    assert seen == [0, 4, 1, 3]
    assert loop.next_event_s is None


def test_discarding_pending_work_drops_timers_and_their_handlers():
    loop = EventLoop()
    loop.add_timer(lambda: None).set(1.0)
    loop.discard_pending()
    assert loop.pending == 0 and loop.next_event_s is None
    loop.run(2.0)
    assert loop.events_run == 0
