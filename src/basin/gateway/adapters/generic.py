"""The adapter of engine ``openai``: any OpenAI-compatible upstream, with nothing engine-specific."""

from __future__ import annotations

from typing import TYPE_CHECKING

from basin.gateway.adapters.base import EngineAdapter
from basin.gateway.exposition import MetricsError
from basin.gateway.snapshot import EngineSnapshot

if TYPE_CHECKING:
    import aiohttp


class OpenAIAdapter(EngineAdapter):
    """A generic OpenAI-compatible upstream: no metrics, no priority, no affinity hints."""

    name = "openai"
    priority_field_supported = False
    metrics_hint = "A generic OpenAI-compatible upstream has no known metrics: leave the metrics URL unset."

    def parse_metrics(self, text: str, at_s: float) -> EngineSnapshot:
        raise MetricsError(f"openai: no /metrics mapping for a generic upstream. {self.metrics_hint}")

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        return [
            "openai: generic OpenAI-compatible upstream: no engine metrics and no priority field are "
            "available; admission runs on the gateway's own accounting only."
        ]
