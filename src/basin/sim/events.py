"""The event loop: a heap of plain tuples ordered by (time, class, sequence).

Same-time events run in a stated order: engine progress (completions) first,
then client actions (calls issued, arrivals), then control ticks, then
sampling. Cancellation is lazy: an owner bumps its generation counter and
stale events are skipped where they are handled.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

#: Same-time priority classes (lower runs first).
ENGINE = 0
CLIENT = 1
CONTROL = 2
SAMPLE = 3


class EventLoop:
    __slots__ = ("now", "_heap", "_seq", "events_run")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.events_run = 0

    def at(self, time_s: float, klass: int, handler: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, klass, self._seq, handler, arg))

    @property
    def next_event_s(self) -> float | None:
        """Time of the earliest pending event (lazily cancelled ones included),
        for a wall-clock driver that sleeps until then (the emulator)."""
        return self._heap[0][0] if self._heap else None

    def run(self, until_s: float, progress: Callable[[float], None] | None = None) -> None:
        heap = self._heap
        pop = heapq.heappop
        next_report = 0.0
        while heap and heap[0][0] <= until_s:
            time_s, _, _, handler, arg = pop(heap)
            self.now = time_s
            handler(arg)
            self.events_run += 1
            if progress is not None and time_s >= next_report:
                progress(time_s)
                next_report = time_s + 60.0
        self.now = until_s
