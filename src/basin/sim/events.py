"""The event loop: a heap of events ordered by (time, class, sequence).

Same-time events run in a stated order: engine progress (completions) first,
then client actions (calls issued, arrivals), then control ticks, then
sampling. Cancellation is lazy: an owner bumps its generation counter and
stale events are skipped where they are handled.

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
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any, Final

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


class EventLoop:
    __slots__ = ("now", "_heap", "_client", "_seq", "events_run")

    def __init__(self) -> None:
        self.now = 0.0
        #: Pending events of every class but CLIENT, and of CLIENT.
        self._heap: list[_Event] = []
        self._client: list[_Event] = []
        self._seq = 0
        self.events_run = 0

    def at(self, time_s: float, klass: int, handler: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        self._push(_Event(time_s, klass, self._seq, handler, arg))

    def _push(self, event: _Event) -> None:
        heappush(self._client if event.klass == CLIENT else self._heap, event)

    @property
    def pending(self) -> int:
        """Events in the heaps (lazily cancelled ones included)."""
        return len(self._heap) + len(self._client)

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
        """Drop every pending event (a finished run's owner giving its state back)."""
        self._heap = []
        self._client = []

    @property
    def next_event_s(self) -> float | None:
        """Time of the earliest pending event (lazily cancelled ones included),
        for a wall-clock driver that sleeps until then (the emulator)."""
        times = [h[0].time_s for h in (self._heap, self._client) if h]
        return min(times) if times else None

    def run(self, until_s: float, progress: Callable[[float], None] | None = None) -> None:
        heap = self._heap
        client = self._client
        pop = heappop
        next_report = 0.0
        while True:
            # The heap whose head is earlier (heads never tie: sequences differ).
            if client and (not heap or client[0] < heap[0]):
                source = client
            elif heap:
                source = heap
            else:
                break
            event = source[0]
            time_s = event.time_s
            if time_s > until_s:
                break
            pop(source)
            self.now = time_s
            event.handler(event.arg)
            self.events_run += 1
            if progress is not None and time_s >= next_report:
                progress(time_s)
                next_report = time_s + 60.0
        self.now = until_s
