"""The llama.cpp (``llama-server``) adapter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from basin.gateway.adapters.base import EngineAdapter, count, fraction, ratio
from basin.gateway.adapters.probe import get_json, get_or_warn, server_root
from basin.gateway.exposition import Deltas, Reader, counter_names
from basin.gateway.snapshot import EngineSnapshot

if TYPE_CHECKING:
    import aiohttp


class LlamaCppAdapter(EngineAdapter):
    """llama.cpp ``llama-server``: no per-request priority; slots instead of a paged KV pool."""

    name = "llamacpp"
    priority_field_supported = False
    gauges = ("llamacpp:requests_deferred", "llamacpp:requests_processing", "llamacpp:kv_cache_usage_ratio")
    counters = ("llamacpp:prompt_tokens", "llamacpp:prompt_tokens_cached")
    metrics_hint = "llama-server serves /metrics only when started with --metrics."

    def __init__(self) -> None:
        super().__init__()
        #: From GET /props at start-up: ``total_slots`` and per-slot ``n_ctx`` when reported.
        self.props: dict[str, int] = {}

    def _snapshot(self, r: Reader, deltas: Deltas, at_s: float) -> EngineSnapshot:
        # llama.cpp's prompt counter excludes the tokens it reused, so the denominator adds them back.
        cached = r.counter_delta("cached", deltas, "llamacpp:prompt_tokens_cached")
        computed = r.counter_delta("prompt", deltas, "llamacpp:prompt_tokens")
        total = None if cached is None or computed is None else cached + computed
        return EngineSnapshot(
            at_s=at_s,
            hit_rate=ratio(cached, total),
            queue_requests=count(r.total("llamacpp:requests_deferred")),
            running_requests=count(r.total("llamacpp:requests_processing")),
            kv_used_fraction=fraction(r.mean("llamacpp:kv_cache_usage_ratio")),  # gone in current builds
            decode_wait_requests=0,
            cache_capacity_tokens=None,
            found=tuple(r.found),
        )

    async def read_props(self, session: aiohttp.ClientSession, base_url: str) -> str | None:
        """Read ``total_slots`` and the per-slot ``n_ctx`` from GET /props into :attr:`props`;
        returns why not (never raises), so a gateway started before its engine can ask again."""
        props, why = await get_json(session, server_root(base_url) + "/props")
        if props is None:
            return why
        found: dict[str, int] = {}
        slots = props.get("total_slots")
        if isinstance(slots, int) and not isinstance(slots, bool):
            found["total_slots"] = slots
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else props.get("n_ctx")
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool):
            found["n_ctx"] = n_ctx
        self.props = found
        return None

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        root = server_root(base_url)
        warnings = [
            "llamacpp: llama.cpp has no per-request priority: session priorities order only the gateway's "
            "parked queue; once forwarded, calls wait for a free slot in FIFO order."
        ]
        why = await self.read_props(session, base_url)
        if why is not None:
            warnings.append(f"llamacpp: cannot read the server properties ({why}); slot count unknown until "
                            "the server answers (the gateway asks again every scrape interval).")
        url = root + "/metrics"
        got = await get_or_warn(session, url, "llamacpp", warnings)
        if got is None:
            return warnings
        status, text = got
        if status == 501:
            warnings.append("llamacpp: /metrics answered 501: start llama-server with --metrics.")
        elif status != 200:
            warnings.append(f"llamacpp: {url} answered HTTP {status}; engine signals unknown.")
        elif not any(n in self._probe_index(text) for n in counter_names("llamacpp:prompt_tokens_cached")):
            warnings.append(
                "llamacpp: /metrics has no llamacpp:prompt_tokens_cached_total (older llama-server "
                "build): the engine hit rate is unknown; only the responses' cached-token counts remain."
            )
        return warnings
