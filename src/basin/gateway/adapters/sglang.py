"""The SGLang adapter (a single server, its router, or PD disaggregation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from basin.gateway.adapters.base import EngineAdapter, check_rank, count, fraction, ratio
from basin.gateway.adapters.probe import as_bool, get_json, server_root
from basin.gateway.exposition import Deltas, Reader
from basin.gateway.snapshot import EngineSnapshot

if TYPE_CHECKING:
    import aiohttp


class SGLangAdapter(EngineAdapter):
    """SGLang (incl. PD disaggregation): higher ``priority`` first unless the server flips it."""

    name = "sglang"
    priority_field_supported = True
    gauges = (
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:max_total_num_tokens",
        "sglang:num_decode_prealloc_queue_reqs",
        "sglang:num_decode_transfer_queue_reqs",
    )
    counters = ("sglang:cached_tokens", "sglang:prompt_tokens")
    metrics_hint = "SGLang serves /metrics only when started with --enable-metrics."
    reports_cache_capacity = True

    def __init__(self, low_priority_first: bool | None = None) -> None:
        super().__init__()
        self._configured_low_first = low_priority_first
        #: True when the server runs --schedule-low-priority-values-first (lower value = served first).
        self.low_priority_first: bool = bool(low_priority_first)

    @classmethod
    def create(cls, *, low_priority_first: bool | None = None) -> SGLangAdapter:
        return cls(low_priority_first=low_priority_first)

    def priority_fields(self, rank: int) -> dict[str, object]:
        check_rank(rank)
        if self.priority_enabled is False:
            return {}
        return {"priority": rank if self.low_priority_first else -rank}

    def affinity_headers(self, session_id: str) -> dict[str, str]:
        # The SGLang router forwards only an allow-list of headers; this one is on it.
        return {"X-SMG-Routing-Key": session_id}

    def _snapshot(self, r: Reader, deltas: Deltas, at_s: float) -> EngineSnapshot:
        cached = r.counter_delta("cached", deltas, "sglang:cached_tokens")
        prompt = r.counter_delta("prompt", deltas, "sglang:prompt_tokens")
        if cached is not None and prompt is not None:
            hit_rate = ratio(cached, prompt)
        else:
            hit_rate = fraction(r.mean("sglang:cache_hit_rate"))
        prealloc = r.total("sglang:num_decode_prealloc_queue_reqs")
        transfer = r.total("sglang:num_decode_transfer_queue_reqs")
        capacity = r.total("sglang:max_total_num_tokens")
        return EngineSnapshot(
            at_s=at_s,
            hit_rate=hit_rate,
            queue_requests=count(r.total("sglang:num_queue_reqs")),
            running_requests=count(r.total("sglang:num_running_reqs")),
            kv_used_fraction=fraction(r.mean("sglang:token_usage")),
            decode_wait_requests=count(prealloc) + count(transfer),
            cache_capacity_tokens=None if capacity is None else count(capacity),
            found=tuple(r.found),
        )

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        root = server_root(base_url)
        info: dict | None = None
        failures: list[str] = []
        for path in ("/get_server_info", "/server_info"):
            info, why = await get_json(session, root + path)
            if info is not None:
                break
            failures.append(str(why))
        direction = "lower first" if self.low_priority_first else "higher first"
        if info is None:
            return [
                f"sglang: cannot verify priority scheduling ({'; '.join(failures)}); sending priorities "
                f"{direction} on trust. Start SGLang with --enable-priority-scheduling"
                + (" --schedule-low-priority-values-first" if self.low_priority_first else "")
                + " or session priorities are ignored."
            ]

        def flag(key: str) -> bool | None:
            if key in info:
                return as_bool(info[key])
            nested = info.get("server_args")
            return as_bool(nested.get(key)) if isinstance(nested, dict) and key in nested else None

        warnings: list[str] = []
        enabled = flag("enable_priority_scheduling")
        if enabled is None:
            warnings.append(
                "sglang: the server info has no enable_priority_scheduling: this SGLang build may predate "
                "priority scheduling, and the priority field is then ignored."
            )
        elif not enabled:
            self.priority_enabled = False
            self.priority_disabled_reason = "SGLang runs without --enable-priority-scheduling"
            warnings.append(
                "sglang: priority scheduling is OFF, so the engine ignores session priorities and the "
                "gateway stops sending them: start SGLang with --enable-priority-scheduling."
            )
        else:
            self.priority_enabled = True
        low_first = flag("schedule_low_priority_values_first")
        if low_first is not None:
            if self._configured_low_first is not None and low_first != self._configured_low_first:
                warnings.append(
                    f"sglang: configured low_priority_first={self._configured_low_first} but the server "
                    f"reports schedule_low_priority_values_first={low_first}; following the server."
                )
            self.low_priority_first = low_first
        elif enabled:
            warnings.append(
                "sglang: the server info has no schedule_low_priority_values_first; assuming priorities "
                f"are served {direction}."
            )
        return warnings
