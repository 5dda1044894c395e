"""Polling an engine's /metrics off the request path.

A failing or stale scrape shows up in the poller's state (``failures``,
``last_error``, :meth:`MetricsPoller.stale_s`) and never raises into the
gateway; the previous good snapshot is kept meanwhile. A scrape is read up to
``max_bytes`` and parsed in a thread: the parser is Python, so the event loop
gets its turns while a large text is read, and a huge one is refused.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import aiohttp

from basin.gateway.adapters.base import EngineAdapter, log
from basin.gateway.adapters.probe import describe_failure
from basin.gateway.exposition import MetricsError
from basin.gateway.netio import TooLarge, read_capped
from basin.gateway.snapshot import EngineSnapshot


class MetricsPoller:
    """Polls /metrics off the request path; a failing or stale scrape is visible, never fatal."""

    def __init__(
        self,
        adapter: EngineAdapter,
        session: aiohttp.ClientSession,
        metrics_url: str | None,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        if not interval_s > 0 or not timeout_s > 0:
            raise ValueError(f"interval_s and timeout_s must be > 0, got {interval_s!r} and {timeout_s!r}")
        self.adapter = adapter
        self.session = session
        self.metrics_url = metrics_url
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.clock = clock
        self.max_bytes = max_bytes
        self.latest: EngineSnapshot | None = None
        self.failures = 0
        self.last_error: str | None = None
        self.scrapes = 0

    def stale_s(self, now_s: float) -> float:
        """Age of the latest good snapshot; infinite before the first one."""
        if self.latest is None:
            return math.inf
        return max(0.0, now_s - self.latest.at_s)

    async def scrape_once(self) -> EngineSnapshot | None:
        """One scrape; on failure keep the previous snapshot and record why (never raises)."""
        if self.metrics_url is None:
            return None
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self.session.get(self.metrics_url, timeout=timeout, allow_redirects=False) as resp:
                try:
                    data = await read_capped(resp, self.max_bytes)
                except TooLarge:
                    raise MetricsError(f"the /metrics text is longer than {self.max_bytes} bytes "
                                       "(max_metrics_bytes); point the metrics URL at the engine's own "
                                       "/metrics or raise the limit") from None
                if resp.status != 200:
                    raise MetricsError(f"HTTP {resp.status}: {data[:200].decode('utf-8', 'replace').strip()!r}")
            at_s = self.clock()
            text = data.decode("utf-8", "replace")
            snapshot = await asyncio.to_thread(self.adapter.parse_metrics, text, at_s)
        except Exception as exc:  # CancelledError is not an Exception: cancelling still stops us
            self.failures += 1
            self.last_error = (
                f"scrape of {self.metrics_url} {describe_failure(exc, self.timeout_s)}"
                if isinstance(exc, asyncio.TimeoutError)
                else f"scrape of {self.metrics_url} failed: {describe_failure(exc, self.timeout_s)}"
            )
            if self.failures == 1:
                log.warning("%s (engine signals go stale until a scrape succeeds)", self.last_error)
            return None
        if self.failures:
            log.warning("scrape of %s recovered after %d failures", self.metrics_url, self.failures)
        self.latest = snapshot
        self.failures = 0
        self.last_error = None
        self.scrapes += 1
        return snapshot

    async def run(self) -> None:
        """Scrape every ``interval_s`` until cancelled; returns at once when there is no metrics URL."""
        if self.metrics_url is None:
            return
        while True:
            started = self.clock()
            await self.scrape_once()
            elapsed = self.clock() - started
            await asyncio.sleep(min(self.interval_s, max(0.0, self.interval_s - elapsed)))
