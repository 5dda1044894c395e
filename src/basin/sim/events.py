"""The event loop: a heap of events ordered by (time, class, sequence).

Same-time events run in a stated order: engine progress (completions) first,
then client actions (calls issued, arrivals), then control ticks, then
sampling. Cancellation is lazy: an owner bumps its generation counter and
stale events are skipped where they are handled.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

#: Same-time priority classes (lower runs first).
ENGINE = 0
CLIENT = 1
CONTROL = 2
SAMPLE = 3


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


class EventLoop:
    __slots__ = ("now", "_heap", "_seq", "events_run")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[_Event] = []
        self._seq = 0
        self.events_run = 0

    def at(self, time_s: float, klass: int, handler: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heappush(self._heap, _Event(time_s, klass, self._seq, handler, arg))

    @property
    def next_event_s(self) -> float | None:
        """Time of the earliest pending event (lazily cancelled ones included),
        for a wall-clock driver that sleeps until then (the emulator)."""
        return self._heap[0].time_s if self._heap else None

    def run(self, until_s: float, progress: Callable[[float], None] | None = None) -> None:
        heap = self._heap
        pop = heappop
        next_report = 0.0
        while heap and heap[0].time_s <= until_s:
            event = pop(heap)
            time_s = event.time_s
            self.now = time_s
            event.handler(event.arg)
            self.events_run += 1
            if progress is not None and time_s >= next_report:
                progress(time_s)
                next_report = time_s + 60.0
        self.now = until_s
