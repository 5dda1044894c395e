"""The event loop: a heap of events ordered by (time, class, sequence).

Same-time events run in a stated order: engine progress (completions) first,
then client actions (calls issued, arrivals), then control ticks, then
sampling. Nothing is taken out of a heap once pushed: an owner whose
pending time moves holds a timer (below), and a handler whose event may no
longer apply checks when it runs (a pin's expiry, a withdrawn request).

Events known in advance (a run's arrivals, its minute samples) are scheduled
as a batch: each takes its sequence number when the batch is scheduled, as if
pushed then, but only the batch's earliest waiting event sits in the heap.
The order of the run is the same; the heap holds the live events only, so it
stays shallow however many sessions a run will see.

Pending events sit in two heaps, merged at each pop by the same order: client
events (a session's next call, due when its tool gap ends) are most of what
is pending but about one of the six or so events a call runs, and the
engine's short-lived events are pushed and popped on a heap of their own,
a few levels shallower.

Timers: an owner that has at most one pending engine event and moves it
often (a decode instance's next wake, moved earlier by every join) holds a
:class:`Timer` instead of pushing events. Setting a timer takes a sequence
number as :meth:`EventLoop.at` would and replaces its pending time in
place, so no superseded event is left to pop; the earliest timer wins a
tournament over all timers (:mod:`basin.sim.tournament`), and each pop
takes the earliest of the three sources by the same order. On a
24-instance deployment the engine heap had held about 48 events: 23 wakes
and 22 superseded ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any, Final, cast

from basin.sim.tournament import Entrant, Tournament

_INF: Final = math.inf

#: Same-time priority classes (lower runs first).
ENGINE: Final = 0
CLIENT: Final = 1
CONTROL: Final = 2
SAMPLE: Final = 3


class _Event:
    """One pending event. It compares as the tuple ``(time_s, klass, seq)``
    would, by its own method rather than as a tuple: the heap compares entries
    about ten times a push or pop, and a tuple compares field by field through
    the generic protocol (compiled, this method is a few native comparisons;
    heap operations had been a third of a trapped run's loop)."""

    __slots__ = ("time_s", "klass", "seq", "handler", "arg")

    def __init__(self, time_s: float, klass: int, seq: int, handler: Callable[[Any], None], arg: Any) -> None:
        self.time_s = time_s
        self.klass = klass
        self.seq = seq
        self.handler = handler
        self.arg = arg

    def __lt__(self, other: _Event) -> bool:
        if self.time_s != other.time_s:
            return self.time_s < other.time_s
        if self.klass != other.klass:
            return self.klass < other.klass
        return self.seq < other.seq


class _Batch:
    """Events of one class known in advance, sorted by (time, sequence):
    each one fired pushes the next, so exactly one is in the heap."""

    __slots__ = ("loop", "klass", "handler", "times", "seqs", "args")

    def __init__(self, loop: EventLoop, klass: int, handler: Callable[[Any], None],
                 times: list[float], seqs: list[int], args: list[Any]) -> None:
        self.loop = loop
        self.klass = klass
        self.handler = handler
        self.times = times
        self.seqs = seqs
        self.args = args

    def push(self, i: int) -> None:
        self.loop._push(_Event(self.times[i], self.klass, self.seqs[i], self.fire, i))

    def fire(self, i: int) -> None:
        # The next one joins the heap before this one's handler runs: every
        # event the handler schedules comes after this one, and so does it.
        if i + 1 < len(self.times):
            self.push(i + 1)
        self.handler(self.args[i])


class Timer(Entrant):
    """One pending ENGINE-class event at most, which calls ``handler()``
    when due (see the module's docstring); made by :meth:`EventLoop.add_timer`.
    Its key is when it is due (infinite: not set), its tie its sequence
    number. A timer that fires stays set, at the time it fired, until its
    handler returns, and is unset then unless the handler set it again."""

    __slots__ = ("loop", "handler")

    def __init__(self, loop: EventLoop, handler: Callable[[], None]) -> None:
        super().__init__(_INF, 0)
        self.loop = loop
        self.handler = handler

    @property
    def time_s(self) -> float:
        """When it is due (infinite: not set)."""
        return self.key

    def set(self, time_s: float) -> None:
        """Due at ``time_s``, in place of any pending time: ordered as an
        event pushed by :meth:`EventLoop.at` now."""
        loop = self.loop
        loop._seq += 1
        self.tie = loop._seq
        self.key = time_s
        loop._timers.moved(self)

    def clear(self) -> None:
        """Unset (nothing happens if it is not set)."""
        if self.key != _INF:
            self.key = _INF
            self.loop._timers.moved(self)


def _never() -> None:
    raise RuntimeError("a timer fired after its loop discarded its pending work")


class EventLoop:
    __slots__ = ("now", "_heap", "_client", "_seq", "events_run", "_timers")

    def __init__(self) -> None:
        self.now = 0.0
        #: Pending events of every class but CLIENT, and of CLIENT.
        self._heap: list[_Event] = []
        self._client: list[_Event] = []
        self._seq = 0
        self.events_run = 0
        #: Timers: the earliest is the winner.
        self._timers = Tournament()

    def at(self, time_s: float, klass: int, handler: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        self._push(_Event(time_s, klass, self._seq, handler, arg))

    def _push(self, event: _Event) -> None:
        heappush(self._client if event.klass == CLIENT else self._heap, event)

    # ------------------------------------------------------------- timers
    def add_timer(self, handler: Callable[[], None]) -> Timer:
        """A new timer, unset, that calls ``handler()`` when it comes due."""
        timer = Timer(self, handler)
        self._timers.add(timer)
        return timer

    @property
    def pending(self) -> int:
        """Events in the heaps (lazily cancelled ones included) and timers set."""
        return len(self._heap) + len(self._client) + sum(1 for t in self._timers.entrants if t.key != _INF)

    def at_each(self, times_s: list[float], klass: int, handler: Callable[[Any], None], args: list[Any]) -> None:
        """Schedule ``handler(args[i])`` at ``times_s[i]`` for every i, in the
        order that as many calls of :meth:`at` would give (sequence numbers in
        list order), holding only the earliest waiting one in the heap."""
        if len(times_s) != len(args):
            raise ValueError(f"at_each: {len(times_s)} times for {len(args)} arguments")
        if not times_s:
            return
        first = self._seq + 1
        self._seq += len(times_s)
        order = sorted(range(len(times_s)), key=lambda i: (times_s[i], i))
        batch = _Batch(self, klass, handler, [times_s[i] for i in order], [first + i for i in order],
                       [args[i] for i in order])
        batch.push(0)

    def discard_pending(self) -> None:
        """Drop every pending event and timer (a finished run's owner giving
        its state back): timers are unset and let go of their handlers."""
        self._heap = []
        self._client = []
        for timer in self._timers.entrants:
            timer.key = _INF
            cast(Timer, timer).handler = _never

    @property
    def next_event_s(self) -> float | None:
        """Time of the earliest pending event (lazily cancelled ones included),
        for a wall-clock driver that sleeps until then (the emulator)."""
        times = [h[0].time_s for h in (self._heap, self._client) if h]
        timer_s = self._timers.root.winner.key
        if timer_s != _INF:
            times.append(timer_s)
        return min(times) if times else None

    def run(self, until_s: float, progress: Callable[[float], None] | None = None) -> None:
        heap = self._heap
        client = self._client
        pop = heappop
        next_report = 0.0
        while True:
            # The earliest of the heaps' heads and the earliest timer (no two
            # tie: sequences differ). Timers are of class ENGINE, the first.
            if client and (not heap or client[0] < heap[0]):
                source: list[_Event] | None = client
            elif heap:
                source = heap
            else:
                source = None
            earliest = self._timers.root.winner  # (the root changes when a timer is added)
            timer_s = earliest.key
            if source is not None:
                event = source[0]
                time_s = event.time_s
                if time_s < timer_s or (time_s == timer_s and event.klass == ENGINE and event.seq < earliest.tie):
                    if time_s > until_s:
                        break
                    pop(source)
                    self.now = time_s
                    event.handler(event.arg)
                    self.events_run += 1
                    if progress is not None and time_s >= next_report:
                        progress(time_s)
                        next_report = time_s + 60.0
                    continue
            if timer_s > until_s or timer_s == _INF:
                break
            self.now = timer_s
            timer = cast(Timer, earliest)
            seq = timer.tie
            timer.handler()
            if timer.tie == seq:  # not set again: unset now
                timer.clear()
            self.events_run += 1
            if progress is not None and timer_s >= next_report:
                progress(timer_s)
                next_report = timer_s + 60.0
        self.now = until_s
