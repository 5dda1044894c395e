"""Routing a call to a prefill instance and a decode instance.

Prefill routers: ``cache-aware`` (the instance holding the longest prefix,
unless load is badly out of balance or the best match is poor, in the manner
of SGLang's router), ``affinity`` (a session sticks to one instance) and
``least-loaded`` (fewest queued tokens). Decode: the instance with the most
free KV memory.
"""

from __future__ import annotations

from typing import Final

from basin.sim.decode import DecodeInstance
from basin.sim.prefill import PrefillInstance
from basin.sim.sessions import Request, shared_pieces

#: Cache-aware routing falls back to the shortest queue when queues differ by
#: more than this many requests and by more than this ratio.
BALANCE_ABS_REQUESTS: Final = 32
BALANCE_REL: Final = 1.5
#: ... and uses the longest match only when it covers this share of the prompt.
MATCH_THRESHOLD: Final = 0.5


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
    lo = hi = instances[0].load_requests
    for j in range(1, len(instances)):  # min() and max() are generic lookups and calls, compiled
        load = instances[j].load_requests
        if load < lo:
            lo = load
        elif load > hi:
            hi = load
    if hi - lo > BALANCE_ABS_REQUESTS and hi > lo * BALANCE_REL:
        return _lowest(instances, [i.load_requests for i in instances])
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
    placed = session.placed_on
    best = -1
    best_tokens = 0
    for j in range(len(instances)):
        inst = instances[j]
        if placed >> inst.index & 1:
            tokens = inst.cache.peek(key, session.cursor_for(key, inst.cache))
            if best < 0 or _beats(inst, tokens, instances[best], best_tokens):
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
            inst = instances[j]
            if placed >> inst.index & 1:
                continue
            tokens = inst.cache.peek(key, None, shared) if walk_shared else 0
            if best < 0 or (_beats(inst, tokens, instances[best], best_tokens) if j > best
                            else not _beats(instances[best], best_tokens, inst, tokens)):
                best, best_tokens = j, tokens
    if best_tokens >= MATCH_THRESHOLD * req.prompt:
        return instances[best]
    return _lowest(instances, [i.cache.device_used for i in instances])


def _beats(inst: PrefillInstance, tokens: int, other: PrefillInstance, other_tokens: int) -> bool:
    """Whether ``inst``, coming after ``other``, takes its place as the
    cache-aware choice: a longer match, or as long with a shorter queue."""
    return tokens > other_tokens or (tokens == other_tokens and inst.load_requests < other.load_requests)


def _lowest(instances: list[PrefillInstance], scores: list[int]) -> PrefillInstance:
    """The instance of the lowest score; of the lowest ``index`` on a tie."""
    best = 0
    for j in range(1, len(instances)):
        if scores[j] < scores[best] or (scores[j] == scores[best] and instances[j].index < instances[best].index):
            best = j
    return instances[best]


def choose_decode(room: list[int], instances: list[DecodeInstance]) -> DecodeInstance:
    """The instance with the most free memory beyond what waits for it, the
    lowest index on a tie. ``room`` is what the instances post of it
    (:meth:`DecodeInstance.post_room`), slot ``i`` for ``instances[i]``."""
    best = 0
    best_room = room[0]
    j = 0
    for free in room:
        if free > best_room:
            best = j
            best_room = free
        j += 1
    return instances[best]
