"""What every engine adapter does: the gateway's side of one serving engine.

The gateway keeps one internal priority scale and one set of signals; every
engine spells them differently. An adapter maps the scale onto the engine's
request field, puts session-affinity hints where the engine's router reads
them, turns a scrape of the engine's ``/metrics`` into an
:class:`~basin.gateway.snapshot.EngineSnapshot`, and checks at start-up that
the engine has the features the gateway relies on (engines silently ignore a
priority field when the server flag is off, so the flag is verified, not
trusted).

Metrics are read by name, never by position, with fallbacks for the names
engines have renamed (see docs/gateway.md for the table).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, ClassVar, Self

from basin.gateway.exposition import Deltas, MetricsError, Reader, Series, counter_names, diagnose, index_series
from basin.gateway.snapshot import EngineSnapshot

if TYPE_CHECKING:
    import aiohttp

# One logger for the adapters and the poller: the name operators filter on.
log = logging.getLogger("basin.gateway.engines")

#: ``basin emulate``'s own gauges (decode memory lent as cache, decode KV), read under any engine's
#: names when present; no stock engine exports them, so they are not among an adapter's expected series.
EMULATOR_LENT_CACHE_TOKENS = "basin_emulator_lent_cache_tokens"
EMULATOR_DECODE_KV_TOKENS = "basin_emulator_decode_kv_tokens"
EMULATOR_GAUGES = frozenset((EMULATOR_LENT_CACHE_TOKENS, EMULATOR_DECODE_KV_TOKENS))


def count(x: float | None) -> int:
    """A request count from a (summed) gauge: 0 when unknown, never negative."""
    return 0 if x is None else max(0, int(round(x)))


def fraction(x: float | None) -> float:
    """A gauge in [0, 1] as read; NaN when unknown."""
    return math.nan if x is None else x


def ratio(num: float | None, den: float | None) -> float:
    """A hit rate in [0, 1]; NaN when unknown or when no tokens arrived since the last scrape."""
    if num is None or den is None or den <= 0:
        return math.nan
    return min(1.0, max(0.0, num / den))


def check_rank(rank: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"priority rank must be an int >= 0 (lower = more urgent), got {rank!r}")


class EngineAdapter:
    """One engine's spelling of priority, affinity and signals.

    Subclasses declare the series they read (``gauges``/``counters``, with
    aliases) and build the snapshot in :meth:`_snapshot`. The adapter keeps
    the previous scrape's counters, so one adapter serves one metrics source.
    """

    name: ClassVar[str] = "base"
    priority_field_supported: ClassVar[bool] = False
    #: Plain names of gauges and counter bases read (for lookups and error messages).
    gauges: ClassVar[tuple[str, ...]] = ()
    counters: ClassVar[tuple[str, ...]] = ()
    #: What to tell the operator when the metrics are missing.
    metrics_hint: ClassVar[str] = ""
    #: The engine's /metrics report its prefix-cache capacity (``cache_capacity_tokens``).
    reports_cache_capacity: ClassVar[bool] = False

    def __init__(self) -> None:
        self._previous: dict[tuple, float] = {}
        self._wanted = frozenset(
            list(self.gauges) + [n for base in self.counters for n in counter_names(base)]
        ) | EMULATOR_GAUGES
        #: None until a probe or an engine answer says otherwise;
        #: False = the engine ignores or rejects the field, so it is no longer sent.
        self.priority_enabled: bool | None = None
        self.priority_disabled_reason: str | None = None

    @classmethod
    def create(cls, *, low_priority_first: bool | None = None) -> Self:
        """An adapter from the gateway's engine settings; settings this engine has no use for are ignored."""
        return cls()

    # -- requests ----------------------------------------------------------

    def priority_fields(self, rank: int) -> dict[str, object]:
        """Body fields carrying the session's priority (``rank``: lower = more urgent)."""
        check_rank(rank)
        return {}

    def affinity_headers(self, session_id: str) -> dict[str, str]:
        """Headers a router in front of the engine reads to keep a session on one worker."""
        return {}

    def affinity_body(self, session_id: str) -> dict[str, object]:
        """Body fields the engine or its tooling reads as the session's identity."""
        return {}

    def disable_priority(self, reason: str) -> None:
        """Stop sending the priority field (the engine rejected it or has the feature off)."""
        if self.priority_enabled is not False:
            log.warning("%s: priority field dropped from now on: %s", self.name, reason)
        self.priority_enabled = False
        self.priority_disabled_reason = reason

    # -- metrics -----------------------------------------------------------

    @property
    def expected_series(self) -> tuple[str, ...]:
        """Names this adapter looks for, as an operator would grep for them."""
        return self.gauges + tuple(base + "_total" for base in self.counters)

    def parse_metrics(self, text: str, at_s: float) -> EngineSnapshot:
        """Turn one /metrics text into a snapshot; hit rates are over the tokens since the previous call.

        Raises :class:`MetricsError` for text that is not exposition or lacks
        every expected series; the counter state is then left untouched.
        """
        index = index_series(self.name, text, self._wanted)
        if not index.keys() - EMULATOR_GAUGES:
            raise diagnose(self.name, text, self.expected_series, self.metrics_hint)
        reader = Reader(index)
        deltas = Deltas(self._previous)
        snapshot = self._snapshot(reader, deltas, at_s)
        self._previous = deltas.current
        lent, kv = reader.total(EMULATOR_LENT_CACHE_TOKENS), reader.total(EMULATOR_DECODE_KV_TOKENS)
        if lent is None and kv is None:
            return snapshot
        return dataclasses.replace(snapshot, lent_cache_tokens=None if lent is None else count(lent),
                                   decode_kv_tokens=None if kv is None else count(kv),
                                   found=snapshot.found + tuple(n for n in reader.found if n in EMULATOR_GAUGES))

    def _snapshot(self, r: Reader, deltas: Deltas, at_s: float) -> EngineSnapshot:
        raise MetricsError(f"{self.name}: no /metrics mapping for this engine")

    def _probe_index(self, text: str) -> dict[str, Series]:
        """Index a probe's /metrics text without touching the counter state."""
        try:
            return index_series(self.name, text, self._wanted)
        except MetricsError:
            return {}

    # -- start-up ----------------------------------------------------------

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        """Warnings about engine features the gateway relies on but the engine lacks; never raises."""
        return []
