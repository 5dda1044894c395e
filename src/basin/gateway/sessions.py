"""The gateway's own account of the sessions it serves.

It is what makes decisions independent of scrapes: the working set is the sum
of the admitted sessions' contexts as the responses report them, the prefill
backlog is the prompt tokens forwarded and not yet answered, the hit rate is
read from the responses of recent calls. Times are handed in; nothing here
reads a clock.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

from basin.gateway.usage import CallUsage


class SessionState(enum.Enum):
    PARKED = "parked"
    ADMITTED = "admitted"
    SHED = "shed"
    FINISHED = "finished"


@dataclass(slots=True)
class GatewaySession:
    uid: int
    session_id: str
    arrival_s: float
    first_prompt_tokens: int
    task_text: str | None
    state: SessionState = SessionState.PARKED
    last_seen_s: float = 0.0
    context_tokens: int = 0
    calls: int = 0
    in_flight: int = 0
    #: Prompt tokens of this session's calls forwarded and not yet at their first byte.
    unanswered_prompt_tokens: int = 0
    #: The end marker was seen: the session ends when its last call is answered.
    ending: bool = False
    shed_reason: str | None = None


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

    def get(self, session_id: str) -> GatewaySession | None:
        return self.sessions.get(session_id)

    def add(self, session_id: str, now_s: float, first_prompt_tokens: int,
            task_text: str | None) -> GatewaySession:
        sess = GatewaySession(self._next_uid, session_id, now_s, first_prompt_tokens, task_text,
                              last_seen_s=now_s, context_tokens=first_prompt_tokens)
        self._next_uid += 1
        self.sessions[session_id] = sess
        self.by_uid[sess.uid] = sess
        return sess

    def remove(self, sess: GatewaySession, state: SessionState) -> None:
        sess.state = state
        self.sessions.pop(sess.session_id, None)
        self.by_uid.pop(sess.uid, None)

    # ------------------------------------------------------------ calls
    def call_forwarded(self, sess: GatewaySession, prompt_tokens: int, now_s: float) -> None:
        sess.calls += 1
        sess.in_flight += 1
        sess.unanswered_prompt_tokens += prompt_tokens
        sess.context_tokens = max(sess.context_tokens, prompt_tokens)
        sess.last_seen_s = now_s

    def call_answering(self, sess: GatewaySession, prompt_tokens: int) -> None:
        """The first byte of the answer arrived: its prompt is no longer backlog."""
        sess.unanswered_prompt_tokens = max(sess.unanswered_prompt_tokens - prompt_tokens, 0)

    def call_done(self, sess: GatewaySession, usage: CallUsage | None, now_s: float) -> None:
        sess.in_flight = max(sess.in_flight - 1, 0)
        if sess.in_flight == 0:
            sess.unanswered_prompt_tokens = 0
        sess.last_seen_s = now_s
        if usage is None:
            return
        sess.context_tokens = usage.context_tokens
        if usage.cached_tokens is not None and usage.prompt_tokens > 0:
            cached = min(usage.cached_tokens, usage.prompt_tokens)
            self._hits.append((now_s, cached, usage.prompt_tokens))
            self._hit_cached += cached
            self._hit_prompt += usage.prompt_tokens

    # ------------------------------------------------------------ views
    def of_state(self, state: SessionState) -> list[GatewaySession]:
        return [s for s in self.sessions.values() if s.state is state]

    def admitted(self) -> list[GatewaySession]:
        return self.of_state(SessionState.ADMITTED)

    def working_set_tokens(self) -> int:
        return sum(s.context_tokens for s in self.sessions.values() if s.state is SessionState.ADMITTED)

    def unanswered_prompt_tokens(self) -> int:
        return sum(s.unanswered_prompt_tokens for s in self.sessions.values())

    def idle(self, now_s: float, timeout_s: float) -> list[GatewaySession]:
        """Admitted or parked sessions with no call in flight for ``timeout_s``."""
        return [s for s in self.sessions.values()
                if s.in_flight == 0 and now_s - s.last_seen_s >= timeout_s]

    def hit_rate(self, now_s: float, window_s: float) -> float:
        """Cached share of the prompt tokens of calls answered in the window (NaN: none)."""
        while self._hits and self._hits[0][0] < now_s - window_s:
            _, cached, prompt = self._hits.popleft()
            self._hit_cached -= cached
            self._hit_prompt -= prompt
        return self._hit_cached / self._hit_prompt if self._hit_prompt else math.nan
