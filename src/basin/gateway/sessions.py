"""The gateway's own account of the sessions it serves.

A session's standing (parked or admitted) is not kept here: the policy
driver's ledger is the one record of it (:meth:`basin.gateway.gate.Gate.session_state`
reads it); this table keeps what only the gateway sees of a session's calls.
It is what makes decisions independent of scrapes: the working set is the sum
of the admitted sessions' contexts as the responses report them, the prefill
backlog is the prompt tokens forwarded and not yet answered, the hit rate is
read from the responses of recent calls. Times are handed in; nothing here
reads a clock.

Every figure a call or an arrival reads is kept as a running total, and idle
sessions are kept in order of their last call, so the cost of a call does not
grow with the number of sessions in the table (a gateway may hold tens of
thousands that never said they ended).
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from basin.gateway.usage import CallUsage


class SessionState(enum.Enum):
    """A session as the gateway answers for it: its standing in the policy
    driver while it runs (parked, admitted), then how it ended."""

    PARKED = "parked"
    ADMITTED = "admitted"
    SHED = "shed"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class GatewaySession:
    uid: int
    session_id: str
    arrival_s: float
    first_prompt_tokens: int
    task_text: str | None
    #: How the session left the table (SHED or FINISHED); None while it runs.
    ended: SessionState | None = None
    last_seen_s: float = 0.0
    context_tokens: int = 0
    #: The context the engine last confirmed (0 before its first answer): a
    #: call the engine refuses falls back to it instead of keeping its estimate.
    confirmed_context_tokens: int = 0
    calls: int = 0
    in_flight: int = 0
    #: Prefill work of this session's calls forwarded and not yet at their
    #: first byte: each call's prompt beyond the context the engine last
    #: confirmed (the part it must compute if the session's prefix survived).
    unanswered_prompt_tokens: int = 0
    #: The engine has counted the session's prompt (its first usage): the policy's
    #: reservation no longer rests on the body-size estimate.
    counted: bool = False
    #: The end marker was seen: the session ends when its last call is answered.
    ending: bool = False
    shed_reason: str | None = None
    #: Keyed digest of the client credential that opened the session (binding on), else None.
    owner: bytes | None = None


@dataclass(slots=True)
class SessionTable:
    """Sessions by id and uid, with the aggregates the signals need."""

    sessions: dict[str, GatewaySession] = field(default_factory=dict)
    by_uid: dict[int, GatewaySession] = field(default_factory=dict)
    _next_uid: int = 0
    #: (time, cached tokens, prompt tokens) of recent calls that reported both,
    #: with running sums so reading the hit rate costs no walk of the window.
    _hits: deque[tuple[float, int, int]] = field(default_factory=deque)
    _hit_cached: int = 0
    _hit_prompt: int = 0
    #: Running totals over the table (kept by every change below).
    _unanswered_tokens: int = 0
    _unanswered_sessions: int = 0
    #: Sessions with nothing in flight, least recently seen first.
    _idle: OrderedDict[int, None] = field(default_factory=OrderedDict)
    #: With a state store: uids changed and ids removed since the last write (None: no store).
    changed: set[int] | None = None
    removed: set[str] | None = None

    def get(self, session_id: str) -> GatewaySession | None:
        return self.sessions.get(session_id)

    def add(self, session_id: str, now_s: float, first_prompt_tokens: int,
            task_text: str | None) -> GatewaySession:
        sess = GatewaySession(self._next_uid, session_id, now_s, first_prompt_tokens, task_text,
                              last_seen_s=now_s, context_tokens=first_prompt_tokens)
        self._next_uid += 1
        self.sessions[session_id] = sess
        self.by_uid[sess.uid] = sess
        self._idle[sess.uid] = None
        if self.changed is not None:
            self.changed.add(sess.uid)
        return sess

    def put(self, sess: GatewaySession) -> None:
        """A session read back from the state store (added in order of ``last_seen_s``)."""
        self.sessions[sess.session_id] = sess
        self.by_uid[sess.uid] = sess
        self._idle[sess.uid] = None
        self._next_uid = max(self._next_uid, sess.uid + 1)

    def mark_changed(self, sess: GatewaySession) -> None:
        """The session's standing changed (a state store writes it again)."""
        if self.changed is not None and sess.uid in self.by_uid:
            self.changed.add(sess.uid)

    def remove(self, sess: GatewaySession, ended: SessionState) -> None:
        """The session left (``ended``: SHED or FINISHED)."""
        if self.by_uid.pop(sess.uid, None) is not None:
            self._set_unanswered(sess, 0)
            self._idle.pop(sess.uid, None)
            if self.sessions.get(sess.session_id) is sess:
                del self.sessions[sess.session_id]
            if self.removed is not None:
                self.removed.add(sess.session_id)
        sess.ended = ended

    def touch(self, sess: GatewaySession, now_s: float) -> None:
        """A call of the session was seen now."""
        sess.last_seen_s = now_s
        if sess.uid in self._idle:
            self._idle.move_to_end(sess.uid)

    # ------------------------------------------------------------ calls
    def _set_unanswered(self, sess: GatewaySession, tokens: int) -> None:
        before = sess.unanswered_prompt_tokens
        self._unanswered_tokens += tokens - before
        self._unanswered_sessions += (tokens > 0) - (before > 0)
        sess.unanswered_prompt_tokens = tokens

    def call_forwarded(self, sess: GatewaySession, prompt_tokens: int, now_s: float) -> int:
        """A call went to the engine; returns the prefill work it adds to the
        backlog (hand it back to :meth:`call_answering`).

        A call's backlog is its prompt beyond the context the engine last
        confirmed for the session, not the whole prompt: the engine computes
        only what its cache does not hold, and a whole prompt (tens of
        thousands of tokens for an agent) would make a single call in flight
        look like a backlog. A prefix evicted since shows up in the hit rate."""
        sess.calls += 1
        sess.in_flight += 1
        self._idle.pop(sess.uid, None)
        work = max(prompt_tokens - sess.confirmed_context_tokens, 0)
        self._set_unanswered(sess, sess.unanswered_prompt_tokens + work)
        sess.context_tokens = max(sess.context_tokens, prompt_tokens)
        sess.last_seen_s = now_s
        if self.changed is not None:
            self.changed.add(sess.uid)
        return work

    def call_answering(self, sess: GatewaySession, work_tokens: int) -> None:
        """The first byte of the answer arrived: its prefill is no longer backlog."""
        self._set_unanswered(sess, max(sess.unanswered_prompt_tokens - work_tokens, 0))

    def call_done(self, sess: GatewaySession, usage: CallUsage | None, now_s: float,
                  refused: bool = False) -> None:
        """A forwarded call ended. ``refused``: the engine did not take it (an
        error status, or never reached), so its prompt is not in the engine's
        cache and the session's context falls back to what the engine last
        confirmed."""
        sess.in_flight = max(sess.in_flight - 1, 0)
        if self.changed is not None and sess.uid in self.by_uid:
            self.changed.add(sess.uid)
        if sess.in_flight == 0:
            self._set_unanswered(sess, 0)
            if sess.uid in self.by_uid:
                self._idle[sess.uid] = None
                self._idle.move_to_end(sess.uid)
        sess.last_seen_s = now_s
        if refused and usage is None:
            sess.context_tokens = sess.confirmed_context_tokens
            return
        if usage is None:
            return
        sess.context_tokens = sess.confirmed_context_tokens = usage.context_tokens
        if usage.cached_tokens is not None and usage.prompt_tokens > 0:
            cached = min(usage.cached_tokens, usage.prompt_tokens)
            self._hits.append((now_s, cached, usage.prompt_tokens))
            self._hit_cached += cached
            self._hit_prompt += usage.prompt_tokens

    # ------------------------------------------------------------ views
    def unanswered_prompt_tokens(self) -> int:
        return self._unanswered_tokens

    def unanswered_sessions(self) -> int:
        """Sessions with a call forwarded and not yet answered."""
        return self._unanswered_sessions

    def expire(self, now_s: float, timeout_s: float,
               keep: Callable[[GatewaySession], bool] = lambda s: False) -> list[GatewaySession]:
        """Sessions with no call in flight and none seen for ``timeout_s``,
        least recently seen first; costs one step per session returned. A
        session ``keep`` spares (a held call waiting) counts as seen now."""
        out: list[GatewaySession] = []
        idle = self._idle
        while idle:
            uid = next(iter(idle))
            sess = self.by_uid[uid]
            if now_s - sess.last_seen_s < timeout_s:
                break
            if keep(sess):
                self.touch(sess, now_s)
                continue
            idle.pop(uid)
            out.append(sess)
        return out

    def idle(self, now_s: float, timeout_s: float) -> list[GatewaySession]:
        """Admitted or parked sessions with no call in flight for ``timeout_s`` (a walk, for views)."""
        return [s for s in self.sessions.values()
                if s.in_flight == 0 and now_s - s.last_seen_s >= timeout_s]

    def hit_rate(self, now_s: float, window_s: float) -> float:
        """Cached share of the prompt tokens of calls answered in the window (NaN: none)."""
        while self._hits and self._hits[0][0] < now_s - window_s:
            _, cached, prompt = self._hits.popleft()
            self._hit_cached -= cached
            self._hit_prompt -= prompt
        return self._hit_cached / self._hit_prompt if self._hit_prompt else math.nan
