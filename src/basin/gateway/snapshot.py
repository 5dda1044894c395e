"""The engine as one scrape of its /metrics saw it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from basin.jsonvalues import json_values


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What one scrape of the engine's /metrics says (NaN: the engine does not report it)."""

    at_s: float
    hit_rate: float
    queue_requests: int
    running_requests: int
    kv_used_fraction: float
    decode_wait_requests: int
    cache_capacity_tokens: int | None
    found: tuple[str, ...]
    #: Decode memory lent as prefix cache and the decode KV it comes from, in tokens: only
    #: ``basin emulate`` exports them (``basin_emulator_*``); None elsewhere.
    lent_cache_tokens: int | None = None
    decode_kv_tokens: int | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready view (NaN becomes None) for the gateway's state endpoint."""
        return json_values(asdict(self))
