"""The gateway's host of the policy driver: the same
:class:`~basin.policy.driver.PolicyDriver` the simulator hosts, fed from the
gateway's session table and the engine's scraped metrics.

Everything here is synchronous and single-threaded: the proxy calls it from
one event loop, so each state change (admit, park, release, shed, pause,
resume, finish) happens in exactly one place and a waiting call is woken
exactly once. Waiters are futures the proxy creates; the gate only resolves
them. Time is handed in.

The policy is code the gateway hosts, not code it trusts to be perfect: a
control step that raises is logged with its traceback, counted and retried
with a growing delay; after ``control_failure_limit`` failures in a row the
gateway reports itself unhealthy and sheds what is parked (with a retryable
503) rather than hold calls that no tick will release.

Decode-memory lending is the engine's to do: with ``lending_url`` set, the
policy's decision goes to the engine through a
:class:`~basin.gateway.lending.LendingSwitch` and the lent memory the engine
reports comes back in its figures; without it, a gateway lends nothing.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from basin.catalog import effective_cache_tokens
from basin.gateway.config import GatewayConfig
from basin.gateway.monitor import Observation, VulnerabilityMonitor
from basin.gateway.record import TrafficRecorder
from basin.gateway.sessions import GatewaySession, SessionState, SessionTable
from basin.gateway.snapshot import EngineSnapshot
from basin.gateway.usage import CallUsage
from basin.jsonvalues import json_values
from basin.policy.base import Admission, EngineFigures, EngineNeeds, Policy, SessionInfo, Signals
from basin.policy.driver import PolicyDriver
from basin.policy.params import PolicyParamError
from basin.workload.records import Session

if TYPE_CHECKING:
    from basin.gateway.lending import LendingSwitch  # its HTTP client is the server's business

log = logging.getLogger("basin.gateway")

#: Capacity reported to the policy when neither the operator nor the engine
#: gives one: admission by working set then never engages (the gateway warns).
UNKNOWN_CAPACITY_TOKENS = 1 << 60
#: Parked session ids /admin/state lists, first to be released first.
PARKED_SHOWN = 1000
#: Longest wait before a failed control step is retried.
MAX_CONTROL_RETRY_S = 30.0


def control_retry_s(base_s: float, failures: int) -> float:
    """Delay before retrying after ``failures`` failed control steps in a row: doubling, capped."""
    return min(base_s * 2.0 ** max(failures - 1, 0), MAX_CONTROL_RETRY_S)


def unprovided(needs: EngineNeeds, config: GatewayConfig) -> tuple[str, ...]:
    """The mechanisms ``needs`` requires that this gateway cannot provide: every one, but
    decode-memory lending when the engine takes the switch (``lending_url``)."""
    if config.lending_url is not None:
        needs = dataclasses.replace(needs, decode_memory_lending=False)
    return needs.required()


def lending_hint(needs: EngineNeeds, config: GatewayConfig) -> str:
    """How lending could be provided, when ``needs`` asks for it and this gateway cannot send it."""
    if not needs.decode_memory_lending or config.lending_url is not None:
        return ""
    return " (lending only with an engine that takes the switch: lending_url, --lending-url)"


def slot_capacity_tokens(slots: int, slot_tokens: int, admitted: int, working_set: int) -> int:
    """A slot-based cache (llama.cpp) as tokens: it holds ``slots`` sessions
    whatever their size, so its capacity is ``slots`` times the admitted
    sessions' mean context (at most a slot's size). The working set ``N c``
    then crosses it exactly when the sessions outnumber the slots."""
    if admitted <= 0 or working_set <= 0:
        return slots * slot_tokens
    return max(1, int(slots * min(working_set / admitted, slot_tokens)))


class Waiter(Protocol):
    """What the gate resolves to wake a held call (an ``asyncio.Future``)."""

    def done(self) -> bool: ...

    def set_result(self, result: SessionState, /) -> None: ...


class EngineView(Protocol):
    """The latest engine scrape, its age, and the last cache capacity any
    scrape reported (the merged metrics pollers)."""

    @property
    def latest(self) -> EngineSnapshot | None: ...

    @property
    def capacity_tokens(self) -> int | None: ...

    def stale_s(self, now_s: float) -> float: ...


class ShedError(Exception):
    """The session was shed; ``reason`` is the machine-readable cause."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class NotOwner(Exception):
    """A call names a session another client credential opened (binding on)."""


class Gate:
    def __init__(self, policy: Policy, config: GatewayConfig, engine: EngineView | None = None,
                 capacity_tokens: int | None = None, origin_s: float = 0.0):
        self.config = config
        self.engine = engine
        self.capacity_tokens = capacity_tokens
        #: llama.cpp's slots and their size, from /props (the slot limit, see slot_capacity_tokens).
        self.slots: tuple[int, int] | None = None
        self.origin_s = origin_s
        self.table = SessionTable()
        self.waiters: dict[int, list[Waiter]] = {}
        self.draining = False
        self.driver = PolicyDriver(policy, self)
        self.counts = {"admitted": 0, "parked": 0, "shed": 0, "finished": 0, "abandoned": 0, "expired": 0}
        #: Control health: failures in a row, in all, the last one, and when the last step ran.
        self.control_failures = 0
        self.control_errors = 0
        self.last_control_error: str | None = None
        self.last_tick_s: float | None = None
        #: When the policy asked for its next control step (None before the first).
        self.next_step_s: float | None = None
        #: Called when something that may change a decision happened between steps (a call
        #: or a session ended while sessions are parked): the server's control loop wakes.
        self.wake: Callable[[], None] | None = None
        #: ``--record``: the sessions' calls, and where an ended session goes (set by the server).
        self.recorder: TrafficRecorder | None = None
        self.on_recorded: Callable[[Session, float], None] | None = None
        #: Sessions that have arrived (admitted, parked or shed at once), for the monitor's arrival rate.
        self.arrived = 0
        #: Told of each arrival (uid, time) when a state store keeps the arrival history.
        self.on_arrival: Callable[[int, float], None] | None = None
        #: The vulnerability monitor, handed an observation after each control step (set by the server).
        self.monitor: VulnerabilityMonitor | None = None
        self.monitor_errors = 0
        #: ``lending_url``: sends the policy's lending decision to the engine (set by the server).
        self.lender: LendingSwitch | None = None

    @property
    def policy(self) -> Policy:
        return self.driver.policy

    @property
    def ordered(self) -> bool:
        """Whether the policy orders the engine queues (its calls carry a priority)."""
        return self.driver.ordered

    # ------------------------------------------------------------ signals
    def _engine_snapshot(self, now_s: float) -> tuple[EngineSnapshot | None, float]:
        if self.engine is None or self.engine.latest is None:
            return None, math.inf
        stale = self.engine.stale_s(now_s)
        return (self.engine.latest if stale <= self.config.stale_after_s else None), stale

    @property
    def last_signals(self) -> Signals | None:
        return self.driver.last_signals

    def signals(self, now_s: float) -> Signals:
        return self.driver.signals(now_s)

    def engine_figures(self, now_s: float) -> EngineFigures:
        """The engine's side of the policy's view: the engine's figures only
        while the last scrape is fresh (a stale scrape counts as unknown,
        never as idle or as saturated), else the gateway's own accounting.
        Lent memory and decode KV come from the scrape only with ``lending_url``
        set (0 otherwise, and while unreported or stale)."""
        snap, stale = self._engine_snapshot(now_s)
        table = self.table
        hit = table.hit_rate(now_s, self.config.hit_window_s)
        if math.isnan(hit) and snap is not None:
            hit = snap.hit_rate
        capacity = self.known_capacity_tokens(snap)
        kv = snap.kv_used_fraction if snap is not None else math.nan
        # Without a fresh scrape the engine's queue is unknown: the calls the
        # gateway forwarded and has no answer for stand in for it.
        queue = snap.queue_requests if snap is not None else table.unanswered_sessions()
        gpu = int(capacity) if capacity else UNKNOWN_CAPACITY_TOKENS
        host = self.config.host_cache_tokens
        lent = decode_kv = 0
        if self.config.lending_url is not None and snap is not None:
            lent, decode_kv = snap.lent_cache_tokens or 0, snap.decode_kv_tokens or 0
        return EngineFigures(
            hit_rate=hit,
            prefill_queue_requests=queue,
            prefill_backlog_tokens=table.unanswered_prompt_tokens(),
            decode_wait_requests=snap.decode_wait_requests if snap is not None else 0,
            decode_used_fraction=0.0 if math.isnan(kv) else float(kv),
            gpu_cache_tokens=gpu,
            host_cache_tokens=host,
            effective_cache_tokens=effective_cache_tokens(gpu, host),
            lent_cache_tokens=lent,
            decode_kv_tokens=decode_kv,
            stale_s=stale,
        )

    def known_capacity_tokens(self, snap: EngineSnapshot | None = None) -> int | None:
        """The cache capacity in tokens, None while unknown: the operator's
        figure, else the last one any scrape reported (a deployment's capacity
        does not go stale with its scrape), else llama.cpp's slot limit."""
        capacity = self.capacity_tokens or (self.engine.capacity_tokens if self.engine is not None else None)
        if capacity is None and snap is not None:
            capacity = snap.cache_capacity_tokens
        if capacity is None and self.slots is not None:
            capacity = slot_capacity_tokens(*self.slots, self.driver.admitted_count, self.driver.working_set_tokens)
        return capacity or None

    # ------------------------------------------------------------ driver host
    def admitted(self, uid: int) -> None:
        sess = self.table.by_uid[uid]
        self.table.mark_changed(sess)
        self.counts["admitted"] += 1
        self._wake(sess)

    def shed(self, uid: int, reason: str) -> None:
        sess = self.table.by_uid.get(uid)
        if sess is not None:
            sess.shed_reason = reason
            self.counts["shed"] += 1
            self.table.remove(sess, SessionState.SHED)
            self._record_end(sess.session_id)
            self._wake(sess)

    def resumed(self, uid: int) -> None:
        sess = self.table.by_uid.get(uid)
        if sess is not None:
            self._wake(sess)

    def ordering(self, on: bool) -> None:
        """The engine reads the order from each call's priority field (see :meth:`priority_rank`)."""

    def lending(self, on: bool) -> None:
        """Called at every control step: the switch goes to the engine when it changes (``lending_url``);
        without one a gateway lends nothing (policies that need lending are refused at start)."""
        if self.lender is not None:
            self.lender.want(on, self.policy.needs.lend_cap_fraction)

    # ------------------------------------------------------------ calls
    def open_call(self, session_id: str, now_s: float, prompt_tokens: int, task_text: str | None,
                  end: bool, owner: bytes | None = None) -> GatewaySession:
        """The session a call belongs to; a new id is a session's arrival and
        gets the policy's admission decision. Raises :class:`ShedError`, and
        :class:`NotOwner` when the session is bound to another ``owner``."""
        sess = self.table.get(session_id)
        if sess is not None and sess.owner is not None and (
                owner is None or not hmac.compare_digest(sess.owner, owner)):
            raise NotOwner(session_id)
        if sess is None:
            if self.draining:
                raise ShedError("draining", "the gateway is draining and admits no new sessions")
            sess = self._arrive(session_id, now_s, prompt_tokens, task_text, owner)
        if sess.ended is SessionState.SHED:
            raise ShedError(sess.shed_reason or "policy", "the session was shed to protect the engine")
        sess.ending = sess.ending or end
        self.table.touch(sess, now_s)
        if self.recorder is not None:
            self.recorder.call_arrived(session_id, now_s, task_text)
        if self.driver.is_paused(sess.uid):
            self._guarded("the policy's held-call hook", self.driver.call_held, sess.uid, now_s)
        return sess

    def _arrive(self, session_id: str, now_s: float, prompt_tokens: int, task_text: str | None,
                owner: bytes | None) -> GatewaySession:
        sess = self.table.add(session_id, now_s, prompt_tokens, task_text)
        sess.owner = owner
        self.arrived += 1
        if self.on_arrival is not None:
            self.on_arrival(sess.uid, now_s)
        info = SessionInfo(sess.uid, session_id, "gateway", now_s, prompt_tokens, task_text)
        try:
            # Decided as it comes: the admission gate is brought up to date first (a burst
            # between two steps meets the budget), and the session's first prompt counts in
            # the working set from its admission, before its call is forwarded.
            self.driver.refresh(now_s)
            verdict = self.driver.arrive(info, prompt_tokens)
        except Exception as exc:
            self._control_error("the policy's arrival decision", exc, "the session gets a retryable 503")
            self.table.remove(sess, SessionState.SHED)
            self._guarded("the policy's session-end hook", self.driver.session_finished, sess.uid, now_s)
            raise ShedError("controller-error", "the gateway's controller failed on this session's arrival") from None
        if verdict is Admission.PARK:
            self.counts["parked"] += 1
            if self.control_failed:
                # No tick would release it: answer now (retryable) instead of holding the call.
                self._guarded("the policy's session-end hook", self.driver.session_finished, sess.uid, now_s)
                self.shed(sess.uid, "controller-failed")
        return sess

    def session_state(self, sess: GatewaySession) -> SessionState:
        """How the session stands: parked or admitted as the policy driver's
        ledger has it (the one record of a session's standing), or how it ended."""
        if sess.ended is not None:
            return sess.ended
        return SessionState.ADMITTED if self.driver.is_admitted(sess.uid) else SessionState.PARKED

    def must_wait(self, sess: GatewaySession) -> bool:
        return self.session_state(sess) is SessionState.PARKED or self.driver.is_paused(sess.uid)

    def session_counts(self) -> dict[str, int]:
        """Running sessions by standing, from the policy driver's ledger."""
        return {SessionState.ADMITTED.value: self.driver.admitted_count,
                SessionState.PARKED.value: len(self.driver.parked)}

    def paused_count(self) -> int:
        return sum(1 for t in self.driver.sessions.values() if t.paused)

    def wait(self, sess: GatewaySession, waiter: Waiter) -> None:
        """Hold a call until its session is released or resumed (or shed)."""
        self.waiters.setdefault(sess.uid, []).append(waiter)

    def forwarded(self, sess: GatewaySession, prompt_tokens: int, now_s: float) -> int:
        """A call went upstream; returns its prefill work, for :meth:`answering`."""
        work = self.table.call_forwarded(sess, prompt_tokens, now_s)
        self._guarded("the policy's call hook", self.driver.call_issued, sess.uid, prompt_tokens, now_s)
        return work

    def answering(self, sess: GatewaySession, work_tokens: int) -> None:
        self.table.call_answering(sess, work_tokens)

    def done(self, sess: GatewaySession, usage: CallUsage | None, now_s: float, refused: bool = False) -> None:
        """A forwarded call ended (answered, failed or abandoned); ``refused``:
        the engine did not take it, so its estimate leaves the context."""
        self.table.call_done(sess, usage, now_s, refused)
        if self.recorder is not None:
            self.recorder.call_done(sess.session_id, None if refused else usage, now_s)
        if not sess.counted and self.session_state(sess) is SessionState.ADMITTED:
            self._count_prompt(sess, usage, refused)
        last = sess.ending and sess.in_flight == 0
        if self.session_state(sess) is SessionState.ADMITTED:
            self._guarded("the policy's call hook", self.driver.call_finished, sess.uid, sess.context_tokens,
                          last, now_s)
        if last:
            self._finish(sess, now_s, "finished")
        elif self.driver.parked:
            self._changed()

    def _count_prompt(self, sess: GatewaySession, usage: CallUsage | None, refused: bool) -> None:
        """The engine's first count of the session's prompt replaces the estimate its
        admission was decided on; a refusal before any count releases the reservation."""
        if usage is not None and usage.prompt_tokens > 0:
            sess.counted = True
            count = usage.prompt_tokens
        elif refused:
            count = 0
        else:
            return
        info = SessionInfo(sess.uid, sess.session_id, "gateway", sess.arrival_s, count, sess.task_text)
        self._guarded("the policy's prompt-count hook", self.driver.prompt_counted, info)

    def _changed(self) -> None:
        if self.wake is not None:
            self.wake()

    def refresh(self, now_s: float) -> None:
        """Between steps: the policy's admission gate and parked releases brought up to date
        (the control loop runs it when woken); a failure is counted like a failed step's hook."""
        if not self.control_failed:
            self._guarded("the policy's between-steps update", self.driver.refresh, now_s)

    def abandon(self, sess: GatewaySession, waiter: Waiter, now_s: float) -> None:
        """A held call's client went away: forget the waiter; a parked session
        with nobody waiting leaves the queue."""
        held = self.waiters.get(sess.uid, [])
        if waiter in held:
            held.remove(waiter)
        if not held:
            self.waiters.pop(sess.uid, None)
            if self.session_state(sess) is SessionState.PARKED:
                self._finish(sess, now_s, "abandoned")

    def priority_rank(self, sess: GatewaySession) -> int | None:
        """The session's fixed priority on the gateway's one scale (whole
        seconds since the gateway started, lower first), or None while the
        policy does not order the engine queues."""
        if not self.ordered:
            return None
        key = self.driver.priority_key(sess.uid)
        if key is None or not math.isfinite(key):
            return None
        return max(int(round(key - self.origin_s)), 0)

    # ------------------------------------------------------------ control
    def tick(self, now_s: float) -> float:
        """One control step; returns seconds until the next one. Raises what the policy raises
        (:meth:`control_step` is the guarded form the control loop runs)."""
        # A held call is not idleness.
        for sess in self.table.expire(now_s, self.config.idle_timeout_s, keep=lambda s: s.uid in self.waiters):
            self._finish(sess, now_s, "expired")
        return self.driver.tick(now_s)

    @property
    def control_failed(self) -> bool:
        """The control step failed ``control_failure_limit`` times in a row (``/healthz`` says unhealthy)."""
        return self.control_failures >= self.config.control_failure_limit

    def control_step(self, now_s: float) -> float:
        """:meth:`tick`, never raising: a failure is logged with its traceback,
        counted, and retried after a growing delay (the returned one); from the
        ``control_failure_limit``-th failure in a row the parked sessions are shed."""
        try:
            delay = self.tick(now_s)
        except Exception as exc:
            self.control_failures += 1
            retry = control_retry_s(self.config.control_retry_s, self.control_failures)
            self._control_error("the control step", exc, f"{self.control_failures} in a row; retried in {retry:g} s; "
                                f"at {self.config.control_failure_limit} in a row /healthz reports unhealthy and "
                                "parked sessions are shed")
            if self.control_failed:
                self.shed_parked("controller-failed", now_s)
            self.next_step_s = now_s + retry
            return retry
        if self.control_failures:
            log.warning("the control step works again after %d failures in a row", self.control_failures)
        self.control_failures = 0
        self.last_tick_s = now_s
        self.next_step_s = now_s + delay
        self.observe(now_s)
        return delay

    def overdue_s(self, now_s: float) -> float:
        """How long the next control step is overdue (0: on time, or none was asked for yet)."""
        if self.next_step_s is None:
            return 0.0
        return max(now_s - self.next_step_s, 0.0)

    def observation(self, now_s: float) -> Observation:
        """What the monitor is handed: cumulative arrivals and departures, the admitted population, its
        working set and the hit rate over the gateway's hit window (as the policy's signals take it)."""
        hit = self.engine_figures(now_s).hit_rate
        return Observation(now_s, self.arrived, self.counts["finished"] + self.counts["expired"],
                           self.driver.admitted_count, self.driver.working_set_tokens, hit)

    def observe(self, now_s: float) -> None:
        """Hand the monitor this tick's observation; a failure is logged and counted, never a failed step."""
        if self.monitor is None:
            return
        try:
            self.monitor.observe(self.observation(now_s))
        except Exception as exc:
            self.monitor_errors += 1
            log.error("the vulnerability monitor failed (the control step goes on): %s: %s",
                      type(exc).__name__, exc, exc_info=exc)

    def shed_parked(self, reason: str, now_s: float) -> int:
        """Shed every parked session (their held calls get a retryable 503); returns how many."""
        parked = list(self.driver.parked)
        for uid in parked:
            self._guarded("the policy's session-end hook", self.driver.session_finished, uid, now_s)
            self.shed(uid, reason)
        if parked:
            log.warning("shed %d parked session(s): %s", len(parked), reason)
        return len(parked)

    def turn_away_parked(self, reason: str) -> int:
        """Answer every held call of a parked session with a retryable 503, keeping the
        sessions parked in their order (a stop with a state store: they come back to
        their place when their clients retry after the restart); returns how many."""
        turned = 0
        for uid in self.driver.parked:
            sess = self.table.by_uid.get(uid)
            if sess is None or uid not in self.waiters:
                continue
            sess.shed_reason = reason
            for waiter in self.waiters.pop(uid):
                if not waiter.done():
                    waiter.set_result(SessionState.SHED)
                    turned += 1
        return turned

    def _control_error(self, what: str, exc: BaseException, then: str = "the call goes on") -> None:
        self.control_errors += 1
        self.last_control_error = f"{what} failed: {type(exc).__name__}: {exc}"
        log.error("%s failed (%s)", what, then, exc_info=exc)

    def _guarded(self, what: str, hook: Callable[..., object], *args: object) -> None:
        """A policy hook on the request path: a failure is logged and counted, and the call goes on
        (the gateway's own accounting has already been updated)."""
        try:
            hook(*args)
        except Exception as exc:
            self._control_error(what, exc)

    def _wake(self, sess: GatewaySession) -> None:
        for waiter in self.waiters.pop(sess.uid, []):
            if not waiter.done():
                waiter.set_result(self.session_state(sess))

    def _finish(self, sess: GatewaySession, now_s: float, how: str) -> None:
        self.counts["finished" if how == "finished" else how] += 1
        self.table.remove(sess, SessionState.FINISHED)
        self._guarded("the policy's session-end hook", self.driver.session_finished, sess.uid, now_s)
        self._record_end(sess.session_id)
        self._wake(sess)
        if self.driver.parked:
            self._changed()

    def _record_end(self, session_id: str) -> None:
        if self.recorder is None:
            return
        ended = self.recorder.session_ended(session_id)
        if ended is not None and self.on_recorded is not None:
            self.on_recorded(*ended)

    def set_params(self, updates: dict[str, object]) -> dict[str, object]:
        """Change the policy's parameters at run time (admin API). Unknown
        names, wrong types, values out of range, and values that would need
        an engine mechanism a gateway cannot provide are refused with a
        ValueError naming the field; the old parameters then stay."""
        try:
            candidate = self.policy.params.with_params(**updates)
        except PolicyParamError as exc:
            raise ValueError(str(exc)) from None
        needs = self.policy.needs_with(candidate)
        missing = unprovided(needs, self.config)
        if missing:
            raise ValueError(f"these parameters would need {', '.join(missing)} inside the engine, which a "
                             f"gateway cannot provide{lending_hint(needs, self.config)}; the old parameters stay")
        self.policy.update_params(**updates)
        return json_values(self.policy.params.as_dict(), nonfinite="string")

    # ------------------------------------------------------------ views
    def parked_order(self) -> list[str]:
        """Parked session ids in the order the policy would release them: by its priority
        key, then arrival (a walk and a sort of the parked queue: for views, not calls)."""
        driver = self.driver
        position = {uid: i for i, uid in enumerate(driver.parked)}
        inf = math.inf

        def key(uid: int) -> tuple[float, int]:
            prio = driver.priority_key(uid)
            return (prio if prio is not None else inf, position[uid])
        return [self.table.by_uid[uid].session_id for uid in sorted(driver.parked, key=key)
                if uid in self.table.by_uid]

    def state(self) -> dict[str, object]:
        """Everything an operator asks first, as plain JSON values."""
        sig = self.last_signals
        policy_state = getattr(self.policy, "state", None)
        detail: dict[str, object] = {}
        if dataclasses.is_dataclass(policy_state) and not isinstance(policy_state, type):
            detail = json_values(dataclasses.asdict(policy_state), nonfinite="string")
        cliff = self.policy.describe().get("cliff_profile")
        cliff_view = json_values(cliff, nonfinite="string") if isinstance(cliff, dict) else None
        return {
            "policy": self.policy.name,
            "draining": self.draining,
            "ordering": self.ordered,
            "sessions": self.session_counts(),
            "parked_order": self.parked_order()[:PARKED_SHOWN],
            "paused": self.paused_count(),
            "counts": dict(self.counts),
            "working_set_tokens": self.driver.working_set_tokens,
            "signals": json_values(dataclasses.asdict(sig), nonfinite="string") if sig else None,
            "controller": detail,
            "control": {"failures_in_a_row": self.control_failures, "errors": self.control_errors,
                        "last_error": self.last_control_error, "healthy": not self.control_failed},
            "params": json_values(self.policy.params.as_dict(), nonfinite="string"),
            "cliff": cliff_view,
        }
