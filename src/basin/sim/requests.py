"""A call in flight through the engine, and what the engine keeps of its session.

A :class:`Request` names its session by an int key and its instances by
their indices: it refers to no session record and no instance, so nothing
an instance queues refers back to the instance, the engine or the client
that issued it. What the engine keeps of a session between its calls (the
key of its latest prompt, where it was placed, where walks of its key ended
in each cache) is a :class:`Route`, owned by whoever keeps the session (the
simulator's client) or made afresh per call (the emulator, which sees calls,
not sessions). What hears of a call's first token and finish is a
:class:`CallListener`.

Prompt keys are lists of pieces ``(chunk_id, n_tokens)`` (see
:mod:`basin.sim.cache`); a session's own chunks have int ids
(:mod:`basin.sim.sessions` makes them), shared ones (a system prompt, trace
block hashes) tuples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

from basin.sim.cache import KeyCursor, MatchResult, RadixCache

Piece = tuple[Hashable, int]


def shared_pieces(key: list[Piece]) -> int:
    """How many of ``key``'s leading pieces other sessions may hold too: a
    session's own chunks are ints; a shared prefix and block hashes are
    tuples."""
    for j in range(len(key)):
        if isinstance(key[j][0], int):
            return j
    return len(key)


def block_key(block_hashes: Sequence[int], prompt_tokens: int, block_tokens: int,
              tail_id: Hashable) -> list[Piece]:
    """Cache key of a prompt given by block hashes (equal hash, equal content);
    tokens beyond the hashed blocks are private to the request."""
    key: list[Piece] = []
    remaining = prompt_tokens
    for h in block_hashes:
        if remaining <= 0:
            break
        n = min(block_tokens, remaining)
        key.append((("block", h), n))
        remaining -= n
    if remaining > 0:
        key.append((("tail", tail_id), remaining))
    return key


class Route:
    """What the engine keeps of one session across its calls: the key of
    its latest prompt, the prefill instances it was placed on, the last one,
    and where walks of its key ended in each cache."""

    __slots__ = ("uid", "key", "placed_on", "last_prefill", "cursors")

    def __init__(self, uid: int) -> None:
        self.uid = uid
        #: The latest prompt's key. A call whose key is a new list (not this
        #: one grown in place) drops the cursors: only a key grown in place
        #: is known to extend the walks they come from.
        self.key: list[Piece] = []
        #: Bit ``i`` set: the session's own chunks may be in prefill ``i``'s
        #: cache (it was placed there). Elsewhere only its shared pieces can hit.
        self.placed_on = 0
        self.last_prefill = -1
        #: Where the walk of the key ended in each cache it was inserted into
        #: (at most one per cache). One per cache, not only the last: a
        #: session placed on two instances would otherwise walk its whole
        #: conversation in the other at every call.
        self.cursors: list[KeyCursor] = []

    def take_key(self, key: list[Piece]) -> None:
        """Make ``key`` the latest prompt's (the cursors go unless it is the same list)."""
        if key is not self.key:
            self.key = key
            self.cursors = []

    def cursor_on(self, cache: RadixCache) -> KeyCursor | None:
        """Where the session's key was last walked in ``cache``, if anywhere."""
        for cursor in self.cursors:
            if cursor.cache is cache:
                return cursor
        return None

    def cursor_for(self, key: list[Piece], cache: RadixCache) -> KeyCursor | None:
        """Where a walk of ``key`` in ``cache`` may start: the cursor there
        when ``key`` is the latest prompt's (only that key is known to extend
        the walks the cursors come from)."""
        return self.cursor_on(cache) if key is self.key else None

    def keep_cursor(self, cache: RadixCache, cursor: KeyCursor | None) -> None:
        """Hold ``cursor`` as the cursor in ``cache`` (None: none is known there)."""
        cursors = self.cursors
        for j in range(len(cursors)):
            if cursors[j].cache is cache:
                if cursor is None:
                    del cursors[j]
                else:
                    cursors[j] = cursor
                return
        if cursor is not None:
            cursors.append(cursor)


def queue_key(req: Request, ordered: bool) -> float:
    """Sort key of a request in an engine queue: first-come by default; when
    the queue is ordered, the session's fixed priority (sessions without one
    keep their arrival order behind the prioritised ones)."""
    if ordered:
        return req.prio if req.prio is not None else 1e18 + req.seq
    return float(req.seq)


class Queued:
    """A request's entry in an engine queue's heap (prefill, decode
    reservation, borrowing candidates). It compares as the tuple
    ``(key, seq)`` would, by its own method (see
    :class:`basin.sim.events._Event` for why not a tuple)."""

    __slots__ = ("key", "seq", "req")

    def __init__(self, key: float, req: Request) -> None:
        self.key = key
        self.seq = req.seq
        self.req = req

    def __lt__(self, other: Queued) -> bool:
        if self.key != other.key:
            return self.key < other.key
        return self.seq < other.seq


class Request:
    """One call in flight through router, decode reservation, prefill, transfer
    and decode. ``session`` is its session's key, ``prefill`` and ``decode``
    the indices of its instances (-1 until routed)."""

    __slots__ = (
        "session", "route", "call_index", "key", "prompt", "new", "output", "prefill", "decode",
        "issued_s", "admitted_s", "prefill_start_s", "prefill_end_s", "first_token_s",
        "finished_s", "cached", "loaded", "uncached", "match", "alloc", "remaining",
        "position", "reserved", "decode_steps", "join_step", "viol_at_join", "retractions",
        "seq", "prio", "load_s", "generated", "growing", "cancelled", "itl_violations", "last",
    )

    def __init__(self, session: int, route: Route, call_index: int, key: list[Piece], seq: int, now: float,
                 prompt_tokens: int, new_tokens: int, output_tokens: int) -> None:
        self.session = session
        self.route = route
        self.call_index = call_index
        self.key = key
        self.prompt = prompt_tokens
        self.new = new_tokens
        self.output = output_tokens
        self.prefill = -1
        self.decode = -1
        self.issued_s = now
        self.admitted_s = now
        self.prefill_start_s = math.nan
        self.prefill_end_s = math.nan
        self.first_token_s = math.nan
        self.finished_s = math.nan
        self.cached = 0
        self.loaded = 0
        self.uncached = 0
        self.match: MatchResult | None = None
        self.alloc = 0
        self.remaining = 0
        self.position = 0
        self.reserved = 0
        self.decode_steps = max(self.output - 1, 0)
        self.join_step = 0
        self.viol_at_join = 0
        self.retractions = 0
        self.seq = seq
        self.prio: float | None = None
        self.load_s = 0.0
        self.generated = 0
        self.growing = False
        self.cancelled = False
        self.itl_violations = 0
        #: No call of its session follows (its last, or the session ended
        #: while it ran): its prompt is not kept in lent decode memory.
        self.last = False


class CallListener:
    """What hears of calls: each one's first token and its finish (an
    engine core's owner; a decode instance's owner, or its core while the
    core lends).

    A native class, so that the reports are direct calls where the listener
    is compiled too (the simulator); a function held as an attribute is a
    generic call, about 75 instructions more each. Interpreted code (the
    emulator, tests) gives its functions to :class:`Callbacks`."""

    def first_token(self, req: Request) -> None:
        raise NotImplementedError

    def finished(self, req: Request) -> None:
        raise NotImplementedError


def _unheard(req: Request) -> None:
    """A report that no one listens to."""


class Callbacks(CallListener):
    """A listener made of two functions (a report left out is not heard)."""

    def __init__(self, on_first_token: Callable[[Request], None] = _unheard,
                 on_finished: Callable[[Request], None] = _unheard) -> None:
        self.on_first_token = on_first_token
        self.on_finished = on_finished

    def first_token(self, req: Request) -> None:
        self.on_first_token(req)

    def finished(self, req: Request) -> None:
        self.on_finished(req)
