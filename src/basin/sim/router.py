"""Routing a call to a prefill instance and a decode instance.

Prefill routers: ``cache-aware`` (the instance holding the longest prefix,
unless load is badly out of balance or the best match is poor, in the manner
of SGLang's router), ``affinity`` (a session sticks to one instance) and
``least-loaded`` (fewest queued tokens). Decode: the instance with the most
free KV memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from basin.sim.decode import DecodeInstance
from basin.sim.prefill import PrefillInstance
from basin.sim.sessions import Request

#: Cache-aware routing falls back to the shortest queue when queues differ by
#: more than this many requests and by more than this ratio.
BALANCE_ABS_REQUESTS = 32
BALANCE_REL = 1.5
#: ... and uses the longest match only when it covers this share of the prompt.
MATCH_THRESHOLD = 0.5


def _load(inst: PrefillInstance) -> int:
    return len(inst.queue) + len(inst.running)


def choose_prefill(router: str, instances: Sequence[PrefillInstance], req: Request) -> PrefillInstance:
    if len(instances) == 1:
        return instances[0]
    session = req.session
    if router == "affinity":
        if session.last_prefill < 0:
            session.last_prefill = session.uid % len(instances)
        return instances[session.last_prefill]
    if router == "least-loaded":
        return min(instances, key=lambda i: (i.backlog_tokens, i.index))
    loads = [_load(i) for i in instances]
    lo, hi = min(loads), max(loads)
    if hi - lo > BALANCE_ABS_REQUESTS and hi > lo * BALANCE_REL:
        return min(instances, key=lambda i: (_load(i), i.index))
    cursor = session.cursor if session.key is req.key else None
    matches = [i.cache.peek(req.key, cursor) for i in instances]
    best = max(range(len(instances)), key=lambda j: (matches[j], -loads[j], -j))
    if matches[best] >= MATCH_THRESHOLD * req.prompt:
        return instances[best]
    # Poor reuse everywhere: place it where the cache holds the least.
    return min(instances, key=lambda i: (i.cache.device_used, i.index))


def choose_decode(instances: Sequence[DecodeInstance]) -> DecodeInstance:
    if len(instances) == 1:
        return instances[0]
    return max(instances, key=lambda d: (d.free_tokens - d.waiting, -d.index))
