"""Live sessions and their calls in flight, and the cache keys of their prompts.

A session's prompt is keyed by chunks (see :mod:`basin.sim.cache`): a shared
system prompt per prefix group, then one chunk per call holding the previous
call's output and this call's new suffix. When a call reuses less than the
whole previous context (compaction, or a trace that diverges) the key is cut
at the reused length and a fresh chunk follows, so reuse is exactly what the
trajectory says. Traces that carry block hashes are keyed by the hashes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Final

from basin.sim.cache import KeyCursor, MatchResult, RadixCache
from basin.workload.records import Call, Session

if TYPE_CHECKING:
    from basin.sim.decode import DecodeInstance
    from basin.sim.prefill import PrefillInstance

Piece = tuple[Hashable, int]

_OUT: Final = 1  # chunk id kinds, packed into one int per chunk
_NEW: Final = 2
_MERGED: Final = 3


def _chunk_id(uid: int, call_index: int, kind: int) -> int:
    return (uid << 24) | (call_index << 2) | kind


def shared_pieces(key: list[Piece]) -> int:
    """How many of ``key``'s leading pieces other sessions may hold too: a
    session's own chunks are the ints of ``_chunk_id``; a shared prefix and
    block hashes are tuples."""
    for j in range(len(key)):
        if isinstance(key[j][0], int):
            return j
    return len(key)


class SessionState:
    """A session as the simulator tracks it from arrival to departure."""

    __slots__ = (
        "uid", "record", "tag", "arrival_s", "warm", "next_call", "key", "context_tokens",
        "admitted_s", "finished_s", "shed", "terminated",
        "pin", "pin_expiry_s", "pin_instance", "inflight", "calls_done", "decode_steps",
        "itl_violations", "reference_s", "block_tokens", "last_prefill", "placed_on", "cursors", "calls",
    )

    def __init__(self, uid: int, record: Session, tag: str, arrival_s: float, start_call: int,
                 block_tokens: int | None):
        self.uid = uid
        self.record = record
        #: The record's calls, held here: compiled, every read of a field of
        #: the (interpreted) record is a generic attribute lookup.
        self.calls: tuple[Call, ...] = record.calls
        self.tag = tag
        self.arrival_s = arrival_s
        self.warm = start_call > 0 or tag == "warm"
        self.next_call = start_call
        self.block_tokens = block_tokens
        self.key: list[Piece] = []
        self.context_tokens = 0
        self.admitted_s = math.nan
        self.finished_s = math.nan
        self.shed = False
        self.terminated = False
        self.pin: MatchResult | None = None
        self.pin_expiry_s = 0.0
        self.pin_instance: PrefillInstance | None = None
        self.inflight: Request | None = None
        self.calls_done = 0
        self.decode_steps = 0
        self.itl_violations = 0
        self.reference_s = 0.0
        self.last_prefill = -1
        #: Bit ``i`` set: the session's own chunks may be in prefill ``i``'s
        #: cache (it was placed there). Elsewhere only its shared pieces can hit.
        self.placed_on = 0
        #: Where the walk of the key ended in each cache it was inserted into
        #: (at most one per cache; emptied when the key is rebuilt). One per
        #: cache, not only the last: a session placed on two instances would
        #: otherwise walk its whole conversation in the other at every call.
        self.cursors: list[KeyCursor] = []
        if start_call > 0:
            # Joined mid-trajectory: its context exists (uncached) up to here.
            for k in range(start_call):
                self.key = self.prompt_key(k)
                self.context_tokens = self.calls[k].context_tokens

    @property
    def done(self) -> bool:
        return self.next_call >= len(self.calls)

    def advance_key(self, k: int) -> list[Piece]:
        """Make call ``k``'s key the session's own. The usual agent turn
        extends the key in place and keeps the cache cursors: the previous
        call, done by now, held the same list, and a copy would touch every
        piece of the conversation at every call. Any other turn rebuilds the
        key and drops the cursors."""
        grown = self._turn_growth(k)
        if grown < 0:
            self.key = self._rebuilt_key(k)
            self.cursors = []
        elif grown:
            self.key.append((_chunk_id(self.uid, k, _MERGED), grown))
        return self.key

    def cursor_on(self, cache: RadixCache) -> KeyCursor | None:
        """Where the session's key was last walked in ``cache``, if anywhere."""
        for cursor in self.cursors:
            if cursor.cache is cache:
                return cursor
        return None

    def cursor_for(self, key: list[Piece], cache: RadixCache) -> KeyCursor | None:
        """Where a walk of ``key`` in ``cache`` may start: the session's cursor
        there when ``key`` is the session's current key (only that key is
        known to extend the walks its cursors come from)."""
        return self.cursor_on(cache) if key is self.key else None

    def keep_cursor(self, cache: RadixCache, cursor: KeyCursor | None) -> None:
        """Hold ``cursor`` as the session's cursor in ``cache`` (None: none is known there)."""
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

    def prompt_key(self, k: int) -> list[Piece]:
        """Cache key of call ``k``'s prompt, given the key of call ``k-1``
        (a new list: the session's key is left as it is)."""
        grown = self._turn_growth(k)
        if grown >= 0:
            return self.key + [(_chunk_id(self.uid, k, _MERGED), grown)] if grown else list(self.key)
        return self._rebuilt_key(k)

    def _rebuilt_key(self, k: int) -> list[Piece]:
        """Call ``k``'s key when its turn is not the usual one (see
        :meth:`_turn_growth`): keyed by its block hashes, fresh, or the
        current key cut where the reuse ends and a new chunk after it."""
        call = self.calls[k]
        if call.block_hashes is not None and self.block_tokens:
            return self._block_key(k)
        if k == 0 or not self.key:
            rec = self.record
            key: list[Piece] = []
            shared = rec.shared_prefix_tokens if k == 0 else 0
            if shared:
                key.append((("group", rec.prefix_group), shared))
            rest = call.prompt_tokens - shared
            if rest:
                key.append((_chunk_id(self.uid, k, _NEW), rest))
            return key
        prev = self.calls[k - 1]
        pieces = self.key + [(_chunk_id(self.uid, k - 1, _OUT), prev.output_tokens)]
        key = _truncate(pieces, call.prompt_tokens - call.new_tokens)
        if call.new_tokens:
            key.append((_chunk_id(self.uid, k, _NEW), call.new_tokens))
        return key

    def _turn_growth(self, k: int) -> int:
        """Tokens call ``k`` appends to the current key when it is the usual
        agent turn (the previous call's whole context reused, its output and
        the new suffix appended; 0 for neither), else -1: a first call, a
        trace of block hashes, or a reuse of less than the whole context."""
        call = self.calls[k]
        if k == 0 or not self.key or (call.block_hashes is not None and self.block_tokens):
            return -1
        prev = self.calls[k - 1]
        # Call.reused_tokens and Call.context_tokens, read as fields: the
        # properties are interpreted code, called twice for every call.
        if call.prompt_tokens - call.new_tokens != prev.prompt_tokens + prev.output_tokens:
            return -1
        return prev.output_tokens + call.new_tokens

    def _block_key(self, k: int) -> list[Piece]:
        call = self.calls[k]
        return block_key(call.block_hashes or (), call.prompt_tokens, self.block_tokens or 1,
                         _chunk_id(self.uid, k, _NEW))


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


def _truncate(pieces: list[Piece], n_tokens: int) -> list[Piece]:
    out: list[Piece] = []
    left = n_tokens
    for chunk, n in pieces:
        if left <= 0:
            break
        if n <= 0:
            continue  # an empty piece (a call without output) holds no tokens
        if n <= left:
            out.append((chunk, n))
            left -= n
        else:
            out.append((chunk, left))
            left = 0
    return out


class Request:
    """One call in flight through router, decode reservation, prefill, transfer
    and decode."""

    __slots__ = (
        "session", "call_index", "key", "prompt", "new", "output", "prefill", "decode",
        "issued_s", "admitted_s", "prefill_start_s", "prefill_end_s", "first_token_s",
        "finished_s", "cached", "loaded", "uncached", "match", "alloc", "remaining",
        "position", "reserved", "decode_steps", "join_step", "viol_at_join", "retractions",
        "seq", "prio", "load_s", "generated", "growing", "cancelled", "itl_violations",
    )

    def __init__(self, session: SessionState, call_index: int, key: list[Piece], seq: int, now: float):
        call = session.calls[call_index]
        self.session = session
        self.call_index = call_index
        self.key = key
        self.prompt = call.prompt_tokens
        self.new = call.new_tokens
        self.output = call.output_tokens
        self.prefill: PrefillInstance | None = None
        self.decode: DecodeInstance | None = None
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
