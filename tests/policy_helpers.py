"""Fabricated signals and sessions for the policy rule tests."""

from __future__ import annotations

from basin.catalog import effective_cache_tokens
from basin.policy.base import SessionInfo, Signals


def signals(now_s: float = 0.0, **kw) -> Signals:
    base = dict(
        now_s=now_s, active_sessions=0, parked_sessions=0, working_set_tokens=0, mean_context_tokens=0.0,
        hit_rate=0.9, prefill_queue_requests=0, prefill_backlog_tokens=0, decode_wait_requests=0,
        decode_used_fraction=0.3, arrival_rate_per_min=5.0, gpu_cache_tokens=100_000,
        host_cache_tokens=200_000, lent_cache_tokens=0, decode_kv_tokens=300_000,
    )
    base.update(kw)
    if "effective_cache_tokens" not in base:
        base["effective_cache_tokens"] = effective_cache_tokens(base["gpu_cache_tokens"], base["host_cache_tokens"])
    return Signals(**base)


def info(uid: int, arrival_s: float = 0.0, prompt: int = 10_000) -> SessionInfo:
    return SessionInfo(uid=uid, session_id=f"s{uid}", tag="base", arrival_s=arrival_s, first_prompt_tokens=prompt)
