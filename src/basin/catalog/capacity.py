"""The effective cache capacity: the one definition every part reads."""

from __future__ import annotations


def effective_cache_tokens(gpu_tokens: int, host_tokens: int, lent_tokens: int = 0) -> int:
    """Tokens of prefix the deployment can keep for reuse.

    The host tier is written through (it holds a copy of everything on the
    GPU), so the two tiers together hold ``max(gpu, host)``, not their sum;
    decode memory lent as cache adds to the GPU tier only
    (``C_eff = max(C_gpu + lent, C_host)``, Algorithm 1 of the paper).
    """
    return max(gpu_tokens + lent_tokens, host_tokens)
