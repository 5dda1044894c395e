"""The engine as the gateway's scrapes see it: one poller per metrics URL,
merged into one snapshot.

A PD deployment has two kinds of servers worth scraping: the prefill servers
(or a single engine) hold the prefix cache, so the hit rate, the queue and
the cache capacity come from them; the decode servers hold decode memory, so
the requests waiting for it and its usage come from them. Each URL gets its
own adapter because an adapter keeps the previous counters of its server.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from basin.gateway.adapters import make_adapter
from basin.gateway.poller import MetricsPoller
from basin.gateway.snapshot import EngineSnapshot


def _mean(values: Sequence[float]) -> float:
    known = [v for v in values if not math.isnan(v)]
    return sum(known) / len(known) if known else math.nan


def _summed(groups: Sequence[Sequence[int | None]]) -> int | None:
    """The sum over the first group that reports the figure at all (None: none does)."""
    for group in groups:
        known = [v for v in group if v is not None]
        if known:
            return sum(known)
    return None


@dataclass
class EngineMetrics:
    """Merged view over the pollers; the gate reads ``latest``, ``stale_s``
    and ``capacity_tokens``."""

    engine_pollers: list[MetricsPoller]
    decode_pollers: list[MetricsPoller]
    #: Last cache capacity any scrape reported: it is a property of the
    #: deployment, so a stale scrape does not make it unknown.
    capacity_tokens: int | None = None

    @classmethod
    def build(cls, engine: str, session: aiohttp.ClientSession, metrics_urls: Sequence[str],
              decode_metrics_urls: Sequence[str], interval_s: float, clock: Callable[[], float],
              max_bytes: int = 8 * 1024 * 1024) -> EngineMetrics:
        def poller(url: str) -> MetricsPoller:
            return MetricsPoller(make_adapter(engine), session, url, interval_s=interval_s, clock=clock,
                                 max_bytes=max_bytes)

        return cls([poller(u) for u in metrics_urls], [poller(u) for u in decode_metrics_urls])

    @property
    def pollers(self) -> list[MetricsPoller]:
        return self.engine_pollers + self.decode_pollers

    @property
    def latest(self) -> EngineSnapshot | None:
        engine = [p.latest for p in self.engine_pollers if p.latest is not None]
        decode = [p.latest for p in self.decode_pollers if p.latest is not None]
        if not engine and not decode:
            return None
        capacities = [s.cache_capacity_tokens for s in engine if s.cache_capacity_tokens]
        if capacities:
            self.capacity_tokens = sum(capacities)
        memory = decode or engine
        # Decode memory's own figures: the decode servers', else the engine's (one view of each instance).
        lent = _summed([[s.lent_cache_tokens for s in decode], [s.lent_cache_tokens for s in engine]])
        kv = _summed([[s.decode_kv_tokens for s in decode], [s.decode_kv_tokens for s in engine]])
        return EngineSnapshot(
            at_s=min(s.at_s for s in engine + decode),
            hit_rate=_mean([s.hit_rate for s in engine]),
            queue_requests=sum(s.queue_requests for s in engine),
            running_requests=sum(s.running_requests for s in engine + decode),
            kv_used_fraction=_mean([s.kv_used_fraction for s in memory]),
            decode_wait_requests=sum(s.decode_wait_requests for s in engine + decode),
            cache_capacity_tokens=self.capacity_tokens,
            found=tuple(sorted({name for s in engine + decode for name in s.found})),
            lent_cache_tokens=lent,
            decode_kv_tokens=kv,
        )

    def stale_s(self, now_s: float) -> float:
        """Age of the oldest source: the merged figures are only as fresh as it."""
        return max((p.stale_s(now_s) for p in self.pollers), default=math.inf)

    @property
    def failures(self) -> int:
        return max((p.failures for p in self.pollers), default=0)

    @property
    def last_error(self) -> str | None:
        return next((p.last_error for p in self.pollers if p.last_error), None)

    async def scrape_once(self) -> EngineSnapshot | None:
        await asyncio.gather(*(p.scrape_once() for p in self.pollers))
        return self.latest

    async def run(self) -> None:
        await asyncio.gather(*(p.run() for p in self.pollers))
