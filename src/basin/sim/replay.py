"""Replaying a request trace through one prefix cache, alone.

Requests are taken in trace order; each matches its prompt (the device tier,
then the host tier, loaded back) and then inserts it. This sizes a cache for
a real trace and checks our cache against other implementations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from basin.sim.cache import RadixCache
from basin.sim.requests import block_key


@dataclass(frozen=True, slots=True)
class ReplayResult:
    requests: int
    prompt_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    evicted_device_tokens: int
    evicted_host_tokens: int

    @property
    def hit_rate(self) -> float:
        return (self.device_hit_tokens + self.host_hit_tokens) / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, float | int]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_rate": self.hit_rate,
            "device_hit_rate": self.device_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "host_hit_rate": self.host_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "device_hit_tokens": self.device_hit_tokens,
            "host_hit_tokens": self.host_hit_tokens,
            "evicted_device_tokens": self.evicted_device_tokens,
            "evicted_host_tokens": self.evicted_host_tokens,
        }


def replay_trace(prompts: Sequence[tuple[Sequence[int], int]], capacity_tokens: int, block_tokens: int,
                 page_tokens: int = 64, host_tokens: int = 0) -> ReplayResult:
    """Replay ``(block_hashes, prompt_tokens)`` requests in order."""
    cache = RadixCache(capacity_tokens, host_tokens, page_tokens)
    prompt_total = device = host = 0
    for i, (hashes, prompt) in enumerate(prompts):
        now = float(i)
        key = block_key(hashes, prompt, block_tokens, i)
        m = cache.match(key, now)
        cache.lock(m)
        loaded = cache.load_back(m) if m.host_tokens else 0
        uncached = prompt - m.device_tokens - loaded
        if cache.allocate(uncached):
            cache.insert(key, now, uncached)
        cache.unlock(m)
        prompt_total += prompt
        device += m.device_tokens
        host += loaded
    st = cache.stats
    return ReplayResult(len(prompts), prompt_total, device, host, st.evicted_device_tokens, st.evicted_host_tokens)
