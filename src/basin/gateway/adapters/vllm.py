"""The vLLM (V1 engine) adapter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from basin.gateway.adapters.base import EngineAdapter, check_rank, count, fraction, ratio
from basin.gateway.adapters.probe import get_or_warn, server_root
from basin.gateway.exposition import Deltas, Reader, counter_names
from basin.gateway.snapshot import EngineSnapshot

if TYPE_CHECKING:
    import aiohttp


class VLLMAdapter(EngineAdapter):
    """vLLM V1: lower ``priority`` first under ``--scheduling-policy priority``."""

    name = "vllm"
    priority_field_supported = True
    gauges = (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:cache_config_info",
    )
    counters = (
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits",
        "vllm:gpu_prefix_cache_queries",
    )
    metrics_hint = "vLLM serves /metrics on its API port."
    reports_cache_capacity = True

    def priority_fields(self, rank: int) -> dict[str, object]:
        check_rank(rank)
        if self.priority_enabled is False:
            return {}
        return {"priority": rank}

    def affinity_body(self, session_id: str) -> dict[str, object]:
        return {"session_id": session_id}

    def _hits_queries(self, r: Reader, deltas: Deltas) -> tuple[float | None, float | None]:
        """Current counter names first, then the deprecated ``gpu_`` pair (never mixed)."""
        for hits_name, queries_name in (
            ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
            ("vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"),
        ):
            if any(n in r.index for n in counter_names(queries_name)):
                return (
                    r.counter_delta("hits", deltas, hits_name),
                    r.counter_delta("queries", deltas, queries_name),
                )
        return None, None

    @staticmethod
    def _capacity(r: Reader) -> int | None:
        """KV tokens across engines: num_gpu_blocks x block_size per ``engine`` label of cache_config_info."""
        hit = r.series("vllm:cache_config_info")
        if hit is None:
            return None
        per_engine: dict[str, int] = {}
        for labels, _ in hit[1]:
            try:
                tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                continue  # num_gpu_blocks is "None" until the profiler has run
            per_engine[labels.get("engine", "")] = tokens
        return sum(per_engine.values()) if per_engine else None

    def _snapshot(self, r: Reader, deltas: Deltas, at_s: float) -> EngineSnapshot:
        hits, queries = self._hits_queries(r, deltas)
        return EngineSnapshot(
            at_s=at_s,
            hit_rate=ratio(hits, queries),
            queue_requests=count(r.total("vllm:num_requests_waiting")),
            running_requests=count(r.total("vllm:num_requests_running")),
            kv_used_fraction=fraction(r.mean("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
            decode_wait_requests=0,
            cache_capacity_tokens=self._capacity(r),
            found=tuple(r.found),
        )

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        warnings = [
            "vllm: vLLM exposes no endpoint that shows its scheduling policy, so the gateway cannot "
            "verify it: the `priority` field it sends only orders requests under "
            "`vllm serve --scheduling-policy priority` (the default fcfs policy rejects non-zero "
            "priorities); if the engine rejects the field, the gateway drops it and logs why."
        ]
        url = server_root(base_url) + "/metrics"
        got = await get_or_warn(session, url, "vllm", warnings)
        if got is None:
            return warnings
        status, text = got
        if status != 200:
            warnings.append(f"vllm: {url} answered HTTP {status}; engine signals unknown.")
            return warnings
        index = self._probe_index(text)
        names = counter_names("vllm:prefix_cache_queries") + counter_names("vllm:gpu_prefix_cache_queries")
        if not any(n in index for n in names):
            warnings.append(
                f"vllm: {url} has no vllm:prefix_cache_queries: prefix caching may be off "
                "(--enable-prefix-caching) or this is not vLLM; the engine hit rate will be unknown."
            )
        return warnings
