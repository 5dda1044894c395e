"""The one driver of a control policy.

The simulator, the engine emulator and the gateway each host a
:class:`PolicyDriver`. The driver keeps what every host would otherwise keep
in its own way: which sessions are parked (in arrival order), admitted,
paused or holding a call; each admitted session's context and their sum (the
working set); the long-run arrival rate; the control cadence. It assembles
:class:`~basin.policy.base.Signals` from that and from the engine figures its
host reports, asks the policy, and applies the decisions by telling the host
what to do. So a decision means the same thing under every host, and a
conformance test can hold the hosts to it.

Everything is synchronous and single-threaded; time is handed in.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Final, NoReturn, Protocol

from basin.policy.base import (
    ENGINE_FIGURES,
    Admission,
    ControlDecision,
    EngineFigures,
    Policy,
    SessionInfo,
    Signals,
)

#: An :class:`EngineFigures`' values in field order: the leading fields of a :class:`Signals`.
_engine_values: Final = attrgetter(*ENGINE_FIGURES)

#: Horizon of the long-run arrival rate signal.
ARRIVAL_RATE_WINDOW_S: Final = 15 * 60.0

#: Shortest interval between two control ticks, whatever a policy asks.
MIN_TICK_S: Final = 0.1


class DriverHost(Protocol):
    """What a host does on its driver's word. Each call is one state change
    the driver has already recorded."""

    def engine_figures(self, now_s: float) -> EngineFigures: ...

    def admitted(self, uid: int) -> None:
        """The session may send its first call (at once, or when it is held)."""

    def shed(self, uid: int, reason: str) -> None:
        """The session is refused for good."""

    def resumed(self, uid: int) -> None:
        """A paused session's held call may go."""

    def ordering(self, on: bool) -> None:
        """Both engine queues ordered by the policy's priority key (called on change)."""

    def lending(self, on: bool) -> None:
        """Decode memory lent as cache or not (called at every tick)."""


class _NoHost:
    """The host of a detached driver: its engine is gone, so any word to it
    is a mistake."""

    def _gone(self) -> NoReturn:
        raise RuntimeError("the policy driver was detached from its engine")

    def engine_figures(self, now_s: float) -> EngineFigures:
        self._gone()

    def admitted(self, uid: int) -> None:
        self._gone()

    def shed(self, uid: int, reason: str) -> None:
        self._gone()

    def resumed(self, uid: int) -> None:
        self._gone()

    def ordering(self, on: bool) -> None:
        self._gone()

    def lending(self, on: bool) -> None:
        self._gone()


@dataclass(slots=True)
class ActionLog:
    """What the policy did to the engine and to admission, as its driver
    applied it: for the per-minute action columns of a run's time series
    (:func:`basin.metrics.actions.action_columns`). Observation only; nothing
    here feeds back into a decision.

    ``changes`` holds ``(time_s, lending, ordering, admission_limited)``
    whenever one of the three changes, starting with all off at time 0:
    *lending* and *ordering* are the last control decision's
    ``lend_decode_memory`` and ``order_by_priority``; *admission limited*
    holds while the policy's own admission gate is engaged
    (:meth:`~basin.policy.base.Policy.limiting_admission`) or any session is
    parked. ``shed_s`` is the time of each shed session (at arrival or from the
    parked queue)."""

    changes: list[tuple[float, bool, bool, bool]] = field(default_factory=lambda: [(0.0, False, False, False)])
    shed_s: list[float] = field(default_factory=list)

    def note(self, now_s: float, lending: bool, ordering: bool, limited: bool) -> None:
        last = self.changes[-1]
        if (last[1], last[2], last[3]) != (lending, ordering, limited):
            self.changes.append((now_s, lending, ordering, limited))


#: Drivers created while :func:`capture_drivers` is open are appended here.
_CAPTURE: ContextVar[list[PolicyDriver] | None] = ContextVar("basin_policy_drivers", default=None)


@contextmanager
def capture_drivers() -> Iterator[list[PolicyDriver]]:
    """Collect every :class:`PolicyDriver` created inside the block (in this
    thread or task), so that a caller of a whole run (``run_scenario``) can
    read the run's :class:`ActionLog` afterwards without the run returning it."""
    sink: list[PolicyDriver] = []
    token = _CAPTURE.set(sink)
    try:
        yield sink
    finally:
        _CAPTURE.reset(token)


class Standing(enum.Enum):
    PARKED = "parked"
    ADMITTED = "admitted"


@dataclass(slots=True)
class Tracked:
    standing: Standing
    context_tokens: int
    paused: bool = False
    held: bool = False


class PolicyDriver:
    def __init__(self, policy: Policy, host: DriverHost):
        self._take(policy)
        self.host: DriverHost = host
        self.sessions: dict[int, Tracked] = {}
        #: Parked sessions in arrival order (a dict keeps insertion order).
        self.parked: dict[int, None] = {}
        self.admitted_count = 0
        self.working_set_tokens = 0
        self.ordered = False
        self.last_signals: Signals | None = None
        self.last_decision: ControlDecision | None = None
        self._arrivals: deque[float] = deque()
        #: Kept only for a run whose caller asked (:func:`capture_drivers`): a gateway's
        #: driver runs for days and records nothing.
        self.actions: ActionLog | None = None
        sink = _CAPTURE.get()
        if sink is not None:
            self.actions = ActionLog()
            sink.append(self)

    @property
    def policy(self) -> Policy:
        """The policy in charge (changed only by :meth:`switch_policy`)."""
        return self._policy

    def _take(self, policy: Policy) -> None:
        """Put ``policy`` in charge and note which hooks it has of its own."""
        # The base class's per-call hooks do nothing, and a policy that keeps
        # them (hicache, crossflow) would still cost an interpreted call per
        # hook at every agent call; the driver skips those it does not override.
        self._policy = policy
        cls = type(policy)
        self._hears_issues = cls.on_call_issued is not Policy.on_call_issued
        self._orders = cls.priority_key is not Policy.priority_key
        self._hears_finishes = cls.on_call_finished is not Policy.on_call_finished
        # ... and a policy that admits every session (the base class's answer)
        # needs no signals assembled at each arrival.
        self._judges_arrivals = cls.on_session_arrival is not Policy.on_session_arrival
        self._refreshes = cls.between_steps is not Policy.between_steps

    # ------------------------------------------------------------ signals
    def arrival_rate_per_min(self, now_s: float) -> float:
        """Arrivals per minute over the last 15 minutes (over the run so far
        when it is shorter)."""
        horizon = now_s - ARRIVAL_RATE_WINDOW_S
        arrivals = self._arrivals
        while arrivals and arrivals[0] < horizon:
            arrivals.popleft()
        window_min = min(now_s, ARRIVAL_RATE_WINDOW_S) / 60.0
        return len(arrivals) / window_min if window_min > 0 else 0.0

    def signals(self, now_s: float) -> Signals:
        fig = self.host.engine_figures(now_s)
        n = self.admitted_count
        ws = self.working_set_tokens
        return Signals(
            *_engine_values(fig),
            now_s=now_s,
            active_sessions=n,
            parked_sessions=len(self.parked),
            working_set_tokens=ws,
            mean_context_tokens=ws / n if n else 0.0,
            arrival_rate_per_min=self.arrival_rate_per_min(now_s),
        )

    # ------------------------------------------------------------ sessions
    def arrive(self, info: SessionInfo, context_tokens: int = 0) -> Admission:
        """A new session's first call is ready: the policy admits, parks or sheds it."""
        self._arrivals.append(info.arrival_s)
        verdict = (self._policy.on_session_arrival(info, self.signals(info.arrival_s)) if self._judges_arrivals
                   else Admission.ADMIT)
        if verdict is Admission.ADMIT:
            self.sessions[info.uid] = Tracked(Standing.ADMITTED, 0)
            self._admit(info.uid, context_tokens)
        elif verdict is Admission.PARK:
            self.sessions[info.uid] = Tracked(Standing.PARKED, context_tokens)
            self.parked[info.uid] = None
        else:
            self._policy.on_session_finished(info.uid, info.arrival_s)
            self.host.shed(info.uid, "policy")
            if self.actions is not None:
                self.actions.shed_s.append(info.arrival_s)
        self._note_actions(info.arrival_s)
        return verdict

    def refresh(self, now_s: float) -> None:
        """Between control steps (a host that learns of a change: an arrival,
        a call's or a session's end): the policy brings its admission gate up
        to date (:meth:`~basin.policy.base.Policy.between_steps`) and the
        parked sessions it names are released. The simulator never calls it."""
        if not self._refreshes:
            return
        release = self._policy.between_steps(self.signals(now_s), self.parked.keys())
        if release:
            for uid in release:
                if uid in self.parked:
                    del self.parked[uid]
                    self._admit(uid, self.sessions[uid].context_tokens)
            self._note_actions(now_s)

    def prompt_counted(self, info: SessionInfo) -> None:
        """The engine counted the session's first prompt (0: refused before counting)."""
        self._policy.on_prompt_counted(info)

    def _note_actions(self, now_s: float) -> None:
        if self.actions is None:
            return
        d = self.last_decision
        lending = d.lend_decode_memory if d is not None else False
        limited = bool(self.parked) or self._policy.limiting_admission()
        self.actions.note(now_s, lending, self.ordered, limited)

    def attach(self, sessions: Sequence[tuple[SessionInfo, int]], now_s: float) -> None:
        """Sessions already running when the driver starts (a warm start):
        admitted without a decision, with their contexts."""
        self._policy.attach([info for info, _ in sessions], now_s)
        for info, context in sessions:
            self.sessions[info.uid] = Tracked(Standing.ADMITTED, context)
            self.admitted_count += 1
            self.working_set_tokens += context

    def _admit(self, uid: int, context_tokens: int) -> None:
        t = self.sessions[uid]
        t.standing = Standing.ADMITTED
        t.context_tokens = context_tokens
        self.admitted_count += 1
        self.working_set_tokens += context_tokens
        self.host.admitted(uid)

    def is_admitted(self, uid: int) -> bool:
        """The session runs admitted (not parked, not gone): the ledger a host reads standing from."""
        t = self.sessions.get(uid)
        return t is not None and t.standing is Standing.ADMITTED

    def is_paused(self, uid: int) -> bool:
        t = self.sessions.get(uid)
        return t is not None and t.paused

    def is_held(self, uid: int) -> bool:
        """A paused session's ready call waits for its resume."""
        t = self.sessions.get(uid)
        return t is not None and t.held

    def call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> float | None:
        """A session's call goes to the engine; returns its priority key."""
        t = self.sessions.get(uid)
        if t is not None and t.standing is Standing.ADMITTED:
            self.working_set_tokens += prompt_tokens - t.context_tokens
            t.context_tokens = prompt_tokens
        if self._hears_issues:
            self._policy.on_call_issued(uid, prompt_tokens, now_s)
        return self._policy.priority_key(uid) if self._orders else None

    def call_held(self, uid: int, now_s: float) -> None:
        """A paused session's call is ready; it waits for :meth:`PolicyDriver.tick` to resume it."""
        t = self.sessions.get(uid)
        if t is not None:
            t.held = True
        self._policy.on_call_held(uid, now_s)

    def call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        """A call's answer is complete; returns seconds to pin the prefix."""
        t = self.sessions.get(uid)
        if t is None or t.standing is not Standing.ADMITTED:
            return 0.0
        self.working_set_tokens += context_tokens - t.context_tokens
        t.context_tokens = context_tokens
        if not self._hears_finishes:
            return 0.0
        return self._policy.on_call_finished(uid, context_tokens, last_call, now_s)

    def session_finished(self, uid: int, now_s: float) -> None:
        """The session ended (completed, terminated, expired, or left the parked queue)."""
        t = self.sessions.pop(uid, None)
        if t is not None:
            if t.standing is Standing.ADMITTED:
                self.admitted_count -= 1
                self.working_set_tokens -= t.context_tokens
            else:
                self.parked.pop(uid, None)
        self._policy.on_session_finished(uid, now_s)

    def priority_key(self, uid: int) -> float | None:
        return self._policy.priority_key(uid) if self._orders else None

    # ------------------------------------------------------------ control
    def tick(self, now_s: float) -> float:
        """One control step; returns seconds until the next one."""
        signals = self.signals(now_s)
        self.last_signals = signals
        decision = self._policy.control(signals, list(self.parked))
        self.last_decision = decision
        self.apply(decision, now_s)
        self._note_actions(now_s)
        return max(decision.next_tick_s, MIN_TICK_S)

    def apply(self, d: ControlDecision, now_s: float) -> None:
        """Sheds first, then releases in the decision's order, then pauses,
        resumes, lending and ordering."""
        sessions = self.sessions
        for uid in d.shed:
            if uid in self.parked:
                del self.parked[uid]
                del sessions[uid]
                self._policy.on_session_finished(uid, now_s)
                self.host.shed(uid, "persistent-overload")
                if self.actions is not None:
                    self.actions.shed_s.append(now_s)
        for uid in d.release:
            if uid in self.parked:
                del self.parked[uid]
                self._admit(uid, sessions[uid].context_tokens)
        for uid in d.pause:
            t = sessions.get(uid)
            if t is not None:
                t.paused = True
        for uid in d.resume:
            t = sessions.get(uid)
            if t is not None and t.paused:
                t.paused = False
                if t.held:
                    t.held = False
                    self.host.resumed(uid)
        self.host.lending(d.lend_decode_memory)
        if d.order_by_priority != self.ordered:
            self.ordered = d.order_by_priority
            self.host.ordering(self.ordered)

    def detach(self) -> None:
        """Let go of the host (its engine is done: the two refer to each
        other, which would keep both for the cyclic collector); any later
        word to the host raises."""
        self.host = _NoHost()

    def switch_policy(self, policy: Policy, active: Sequence[SessionInfo], now_s: float) -> None:
        """Hand the running sessions to another policy (an intervention). The
        host re-applies the new policy's engine needs."""
        self._take(policy)
        policy.attach(active, now_s)
