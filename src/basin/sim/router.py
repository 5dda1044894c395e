"""Routing a call to a prefill instance and a decode instance.

Prefill routers: ``cache-aware`` (the instance holding the longest prefix,
unless load is badly out of balance or the best match is poor, in the manner
of SGLang's router), ``affinity`` (a session sticks to one instance) and
``least-loaded`` (fewest queued tokens). Decode: the instance with the most
free KV memory.
"""

from __future__ import annotations

from typing import Final

from basin.sim.decode import DecodeInstance, DecodeRoom
from basin.sim.prefill import PrefillInstance
from basin.sim.requests import Request, shared_pieces

#: Cache-aware routing falls back to the shortest queue when queues differ by
#: more than this many requests and by more than this ratio.
BALANCE_ABS_REQUESTS: Final = 32
BALANCE_REL: Final = 1.5
#: ... and uses the longest match only when it covers this share of the prompt.
MATCH_THRESHOLD: Final = 0.5


def choose_prefill(router: str, instances: list[PrefillInstance], loads: list[int],
                   req: Request) -> PrefillInstance:
    """``loads`` is what the instances post of their load
    (:attr:`PrefillInstance.load_requests`), slot ``i`` for ``instances[i]``,
    whose ``index`` is ``i``: the router reads an instance itself only where
    it walks its cache."""
    if len(instances) == 1:
        return instances[0]
    route = req.route
    if router == "affinity":
        if route.last_prefill < 0:
            route.last_prefill = route.uid % len(instances)
        return instances[route.last_prefill]
    # Each choice below is a minimum or maximum written out as a loop (no key
    # function to call per instance); a tie goes to the lowest index.
    if router == "least-loaded":
        return _lowest(instances, [i.backlog_tokens for i in instances])
    lo = hi = loads[0]
    for load in loads:  # min() and max() are generic lookups and calls, compiled
        if load < lo:
            lo = load
        elif load > hi:
            hi = load
    if hi - lo > BALANCE_ABS_REQUESTS and hi > lo * BALANCE_REL:
        return _lowest(instances, loads)
    # The longest match wins, then the shortest queue, then the first
    # instance; where even the longest covers less than MATCH_THRESHOLD of the
    # prompt, the instance whose cache holds the least.
    #
    # A session's own chunks are only where it was placed; elsewhere the walk
    # would stop at the first of them, so it is cut there (a trace of block
    # hashes has none: its whole key is walked everywhere). The instances it
    # was placed on are walked first: elsewhere at most the shared pieces can
    # match, and where they are shorter than the best match so far the
    # instance can neither win nor tie, so it is not walked. The choice is
    # kept as the walks go (no list of matches): ``best`` is the first of the
    # best so far, by match, then load, then position.
    key = req.key
    placed = route.placed_on
    best = -1
    best_tokens = 0
    for j in range(len(instances)):
        if placed >> j & 1:
            cache = instances[j].cache
            tokens = cache.peek(key, route.cursor_for(key, cache))
            if best < 0 or _beats(tokens, loads[j], best_tokens, loads[best]):
                best, best_tokens = j, tokens
    placed_tokens = best_tokens
    shared = shared_pieces(key)
    walk_shared = False
    if shared:
        reach = 0
        for j in range(shared):
            reach += key[j][1]
        walk_shared = reach >= placed_tokens
    if walk_shared or best_tokens == 0:
        # Unplaced instances can win (or tie, by load) only here; elsewhere
        # their match, 0 or the shared pieces', is below the best.
        for j in range(len(instances)):
            if placed >> j & 1:
                continue
            tokens = instances[j].cache.peek(key, None, shared) if walk_shared else 0
            if best < 0 or (_beats(tokens, loads[j], best_tokens, loads[best]) if j > best
                            else not _beats(best_tokens, loads[best], tokens, loads[j])):
                best, best_tokens = j, tokens
    if best_tokens >= MATCH_THRESHOLD * req.prompt:
        return instances[best]
    return _lowest(instances, [i.cache.device_used for i in instances])


def _beats(tokens: int, load: int, other_tokens: int, other_load: int) -> bool:
    """Whether an instance coming after another takes its place as the
    cache-aware choice: a longer match, or as long with a shorter queue."""
    return tokens > other_tokens or (tokens == other_tokens and load < other_load)


def _lowest(instances: list[PrefillInstance], scores: list[int]) -> PrefillInstance:
    """The instance of the lowest score; of the lowest ``index`` on a tie."""
    best = 0
    for j in range(1, len(instances)):
        if scores[j] < scores[best] or (scores[j] == scores[best] and instances[j].index < instances[best].index):
            best = j
    return instances[best]


def choose_decode(room: DecodeRoom, instances: list[DecodeInstance]) -> DecodeInstance:
    """The instance with the most free memory beyond what waits for it, the
    lowest index on a tie. ``room`` is the instances' view of it, entrant
    ``i`` for ``instances[i]``."""
    return instances[room.best()]
