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
from typing import Final

from basin.sim.cache import MatchResult
from basin.sim.requests import Piece, Request, Route, block_key
from basin.workload.records import Call, Session

_OUT: Final = 1  # chunk id kinds, packed into one int per chunk
_NEW: Final = 2
_MERGED: Final = 3


def _chunk_id(uid: int, call_index: int, kind: int) -> int:
    return (uid << 24) | (call_index << 2) | kind



class SessionState:
    """A session as the simulator's client tracks it from arrival to
    departure; what the engine keeps of it between calls is its :attr:`route`."""

    __slots__ = (
        "uid", "record", "tag", "arrival_s", "warm", "next_call", "key", "context_tokens",
        "admitted_s", "finished_s", "shed", "terminated",
        "pin", "pin_expiry_s", "pin_instance", "inflight", "calls_done", "decode_steps",
        "itl_violations", "reference_s", "block_tokens", "calls", "route",
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
        #: A TTL pin: the locked match and the prefill instance (index) it holds.
        self.pin: MatchResult | None = None
        self.pin_expiry_s = 0.0
        self.pin_instance = -1
        self.inflight: Request | None = None
        self.calls_done = 0
        #: Of its finished calls (a call in flight adds its own, :meth:`itl_violations_total`).
        self.decode_steps = 0
        self.itl_violations = 0
        self.reference_s = 0.0
        self.route = Route(uid)
        if start_call > 0:
            # Joined mid-trajectory: its context exists (uncached) up to here.
            for k in range(start_call):
                self.key = self.prompt_key(k)
                self.context_tokens = self.calls[k].context_tokens

    @property
    def done(self) -> bool:
        return self.next_call >= len(self.calls)

    def itl_violations_total(self) -> int:
        """ITL-SLO violations of its calls so far, the call in flight's included."""
        inflight = self.inflight
        return self.itl_violations + (inflight.itl_violations if inflight is not None else 0)

    def request(self, k: int, key: list[Piece], seq: int, now: float) -> Request:
        """The engine's request for call ``k`` under ``key``."""
        call = self.calls[k]
        return Request(self.uid, self.route, k, key, seq, now, call.prompt_tokens, call.new_tokens,
                       call.output_tokens)

    def advance_key(self, k: int) -> list[Piece]:
        """Make call ``k``'s key the session's own. The usual agent turn
        extends the key in place (the engine then keeps its cache cursors,
        :meth:`Route.take_key`): the previous call, done by now, held the
        same list, and a copy would touch every piece of the conversation at
        every call. Any other turn rebuilds the key."""
        grown = self._turn_growth(k)
        if grown < 0:
            self.key = self._rebuilt_key(k)
        elif grown:
            self.key.append((_chunk_id(self.uid, k, _MERGED), grown))
        return self.key

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


