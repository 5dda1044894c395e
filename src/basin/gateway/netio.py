"""Reading bodies from the network with a ceiling, and logging limits that bite
without flooding the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import aiohttp


class TooLarge(Exception):
    """A body longer than the limit it was read with."""

    def __init__(self, limit: int):
        super().__init__(f"longer than {limit} bytes")
        self.limit = limit


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body of ``response``, or :class:`TooLarge` as soon as it passes ``limit``
    bytes (a declared length over the limit is refused before reading)."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise TooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise TooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class EveryFewSeconds:
    """Logs the first event at once and then at most one line per ``period_s``, with how many
    events it stood for (a limit hit by thousands of connections writes a handful of lines)."""

    def __init__(self, logger: logging.Logger, level: int, period_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.level, self.period_s, self.clock = logger, level, period_s, clock
        self.count = 0
        self._pending = 0
        self._last: float | None = None

    def __call__(self, message: str, *args: object) -> None:
        self.count += 1
        self._pending += 1
        now = self.clock()
        if self._last is None or now - self._last >= self.period_s:
            times = f" ({self._pending} times since the last such line)" if self._pending > 1 else ""
            self.logger.log(self.level, message + times, *args)
            self._last = now
            self._pending = 0
