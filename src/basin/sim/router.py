"""Routing a call to a prefill instance and a decode instance.

Prefill routers: ``cache-aware`` (the instance holding the longest prefix,
unless load is badly out of balance or the best match is poor, in the manner
of SGLang's router), ``affinity`` (a session sticks to one instance) and
``least-loaded`` (fewest queued tokens). Decode: the instance with the most
free KV memory.
"""

from __future__ import annotations

from basin.sim.decode import DecodeInstance
from basin.sim.prefill import PrefillInstance
from basin.sim.sessions import Request, shared_pieces

#: Cache-aware routing falls back to the shortest queue when queues differ by
#: more than this many requests and by more than this ratio.
BALANCE_ABS_REQUESTS = 32
BALANCE_REL = 1.5
#: ... and uses the longest match only when it covers this share of the prompt.
MATCH_THRESHOLD = 0.5


def _load(inst: PrefillInstance) -> int:
    return len(inst.queue) + len(inst.running)


def choose_prefill(router: str, instances: list[PrefillInstance], req: Request) -> PrefillInstance:
    if len(instances) == 1:
        return instances[0]
    session = req.session
    if router == "affinity":
        if session.last_prefill < 0:
            session.last_prefill = session.uid % len(instances)
        return instances[session.last_prefill]
    # Each choice below is a minimum or maximum written out as a loop (no key
    # function to call per instance); a tie goes to the lowest index.
    if router == "least-loaded":
        return _lowest(instances, [i.backlog_tokens for i in instances])
    lo = hi = _load(instances[0])
    for j in range(1, len(instances)):  # min() and max() are generic lookups and calls, compiled
        load = _load(instances[j])
        if load < lo:
            lo = load
        elif load > hi:
            hi = load
    if hi - lo > BALANCE_ABS_REQUESTS and hi > lo * BALANCE_REL:
        return _lowest(instances, [_load(i) for i in instances])
    # A session's own chunks are only where it was placed; elsewhere the walk
    # would stop at the first of them, so it is cut there (a trace of block
    # hashes has none: its whole key is walked everywhere). The instances it
    # was placed on are walked first: elsewhere at most the shared pieces can
    # match, and where they are shorter than the best match so far the
    # instance can neither win nor tie, so it is not walked (its entry stays
    # 0, below that best; only the best's value and its ties decide).
    key = req.key
    placed = session.placed_on
    matches: list[int] = []
    best_placed = 0
    for inst in instances:
        tokens = 0
        if placed >> inst.index & 1:
            tokens = inst.cache.peek(key, session.cursor_for(key, inst.cache))
        matches.append(tokens)
        if tokens > best_placed:
            best_placed = tokens
    shared = shared_pieces(key)
    if shared:
        reach = 0
        for j in range(shared):
            reach += key[j][1]
        if reach >= best_placed:
            for j in range(len(instances)):
                inst = instances[j]
                if not placed >> inst.index & 1:
                    matches[j] = inst.cache.peek(key, None, shared)
    return by_match(instances, matches, req.prompt)


def by_match(instances: list[PrefillInstance], matches: list[int], prompt_tokens: int) -> PrefillInstance:
    """Cache-aware choice from each instance's cached tokens of the prompt and
    its load: the longest match, then the shortest queue, then the first; where
    even the longest covers less than :data:`MATCH_THRESHOLD` of the prompt,
    the instance whose cache holds the least."""
    best = 0
    for j in range(1, len(instances)):
        if matches[j] > matches[best] or (
                matches[j] == matches[best] and _load(instances[j]) < _load(instances[best])):
            best = j
    if matches[best] >= MATCH_THRESHOLD * prompt_tokens:
        return instances[best]
    return _lowest(instances, [i.cache.device_used for i in instances])


def _lowest(instances: list[PrefillInstance], scores: list[int]) -> PrefillInstance:
    """The instance of the lowest score; of the lowest ``index`` on a tie."""
    best = 0
    for j in range(1, len(instances)):
        if scores[j] < scores[best] or (scores[j] == scores[best] and instances[j].index < instances[best].index):
            best = j
    return instances[best]


def choose_decode(instances: list[DecodeInstance]) -> DecodeInstance:
    # The most free memory beyond what waits for it; the lowest index on a tie.
    best = instances[0]
    best_free = best.free_tokens - best.waiting
    for j in range(1, len(instances)):
        d = instances[j]
        free = d.free_tokens - d.waiting
        if free > best_free or (free == best_free and d.index < best.index):
            best, best_free = d, free
    return best
