"""The gateway's host of the policy driver: the same
:class:`~basin.policy.driver.PolicyDriver` the simulator hosts, fed from the
gateway's session table and the engine's scraped metrics.

Everything here is synchronous and single-threaded: the proxy calls it from
one event loop, so each state change (admit, park, release, shed, pause,
resume, finish) happens in exactly one place and a waiting call is woken
exactly once. Waiters are futures the proxy creates; the gate only resolves
them. Time is handed in.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Protocol

from basin.catalog import effective_cache_tokens
from basin.gateway.config import GatewayConfig
from basin.gateway.sessions import GatewaySession, SessionState, SessionTable
from basin.gateway.snapshot import EngineSnapshot
from basin.gateway.usage import CallUsage
from basin.jsonvalues import json_values
from basin.policy.base import Admission, Policy, SessionInfo, Signals
from basin.policy.driver import EngineFigures, PolicyDriver
from basin.policy.params import PolicyParamError

log = logging.getLogger("basin.gateway")

#: Capacity reported to the policy when neither the operator nor the engine
#: gives one: admission by working set then never engages (the gateway warns).
UNKNOWN_CAPACITY_TOKENS = 1 << 60


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


class Gate:
    def __init__(self, policy: Policy, config: GatewayConfig, engine: EngineView | None = None,
                 capacity_tokens: int | None = None, origin_s: float = 0.0):
        self.config = config
        self.engine = engine
        self.capacity_tokens = capacity_tokens
        self.origin_s = origin_s
        self.table = SessionTable()
        self.waiters: dict[int, list[Waiter]] = {}
        self.draining = False
        self.driver = PolicyDriver(policy, self)
        self.counts = {"admitted": 0, "parked": 0, "shed": 0, "finished": 0, "abandoned": 0, "expired": 0}

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
        never as idle or as saturated), else the gateway's own accounting."""
        snap, stale = self._engine_snapshot(now_s)
        table = self.table
        hit = table.hit_rate(now_s, self.config.hit_window_s)
        if math.isnan(hit) and snap is not None:
            hit = snap.hit_rate
        # The capacity the operator set, else the last one any scrape reported
        # (a deployment's capacity does not go stale with its scrape).
        capacity = self.capacity_tokens or (self.engine.capacity_tokens if self.engine is not None else None)
        if capacity is None and snap is not None:
            capacity = snap.cache_capacity_tokens
        kv = snap.kv_used_fraction if snap is not None else math.nan
        # Without a fresh scrape the engine's queue is unknown: the calls the
        # gateway forwarded and has no answer for stand in for it.
        queue = (snap.queue_requests if snap is not None
                 else sum(1 for s in table.sessions.values() if s.unanswered_prompt_tokens > 0))
        gpu = int(capacity) if capacity else UNKNOWN_CAPACITY_TOKENS
        host = self.config.host_cache_tokens
        return EngineFigures(
            hit_rate=hit,
            prefill_queue_requests=queue,
            prefill_backlog_tokens=table.unanswered_prompt_tokens(),
            decode_wait_requests=snap.decode_wait_requests if snap is not None else 0,
            decode_used_fraction=0.0 if math.isnan(kv) else float(kv),
            gpu_cache_tokens=gpu,
            host_cache_tokens=host,
            effective_cache_tokens=effective_cache_tokens(gpu, host),
            lent_cache_tokens=0,
            decode_kv_tokens=0,
            stale_s=stale,
        )

    # ------------------------------------------------------------ driver host
    def admitted(self, uid: int) -> None:
        sess = self.table.by_uid[uid]
        sess.state = SessionState.ADMITTED
        self.counts["admitted"] += 1
        self._wake(sess)

    def shed(self, uid: int, reason: str) -> None:
        sess = self.table.by_uid.get(uid)
        if sess is not None:
            sess.shed_reason = reason
            self.counts["shed"] += 1
            self.table.remove(sess, SessionState.SHED)
            self._wake(sess)

    def resumed(self, uid: int) -> None:
        sess = self.table.by_uid.get(uid)
        if sess is not None:
            self._wake(sess)

    def ordering(self, on: bool) -> None:
        """The engine reads the order from each call's priority field (see :meth:`priority_rank`)."""

    def lending(self, on: bool) -> None:
        """A gateway lends no decode memory (policies that need it are refused at start)."""

    # ------------------------------------------------------------ calls
    def open_call(self, session_id: str, now_s: float, prompt_tokens: int, task_text: str | None,
                  end: bool) -> GatewaySession:
        """The session a call belongs to; a new id is a session's arrival and
        gets the policy's admission decision. Raises :class:`ShedError`."""
        sess = self.table.get(session_id)
        if sess is None:
            if self.draining:
                raise ShedError("draining", "the gateway is draining and admits no new sessions")
            sess = self.table.add(session_id, now_s, prompt_tokens, task_text)
            info = SessionInfo(sess.uid, session_id, "gateway", now_s, prompt_tokens, task_text)
            if self.driver.arrive(info) is Admission.PARK:
                self.counts["parked"] += 1
        if sess.state is SessionState.SHED:
            raise ShedError(sess.shed_reason or "policy", "the session was shed to protect the engine")
        sess.ending = sess.ending or end
        sess.last_seen_s = now_s
        if self.driver.is_paused(sess.uid):
            self.driver.call_held(sess.uid, now_s)
        return sess

    def must_wait(self, sess: GatewaySession) -> bool:
        return sess.state is SessionState.PARKED or self.driver.is_paused(sess.uid)

    def paused_count(self) -> int:
        return sum(1 for t in self.driver.sessions.values() if t.paused)

    def wait(self, sess: GatewaySession, waiter: Waiter) -> None:
        """Hold a call until its session is released or resumed (or shed)."""
        self.waiters.setdefault(sess.uid, []).append(waiter)

    def forwarded(self, sess: GatewaySession, prompt_tokens: int, now_s: float) -> None:
        self.table.call_forwarded(sess, prompt_tokens, now_s)
        self.driver.call_issued(sess.uid, prompt_tokens, now_s)

    def answering(self, sess: GatewaySession, prompt_tokens: int) -> None:
        self.table.call_answering(sess, prompt_tokens)

    def done(self, sess: GatewaySession, usage: CallUsage | None, now_s: float) -> None:
        """A forwarded call ended (answered, failed or abandoned)."""
        self.table.call_done(sess, usage, now_s)
        last = sess.ending and sess.in_flight == 0
        if sess.state is SessionState.ADMITTED:
            self.driver.call_finished(sess.uid, sess.context_tokens, last, now_s)
        if last:
            self._finish(sess, now_s, "finished")

    def abandon(self, sess: GatewaySession, waiter: Waiter, now_s: float) -> None:
        """A held call's client went away: forget the waiter; a parked session
        with nobody waiting leaves the queue."""
        held = self.waiters.get(sess.uid, [])
        if waiter in held:
            held.remove(waiter)
        if not held:
            self.waiters.pop(sess.uid, None)
            if sess.state is SessionState.PARKED:
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
        """One control step; returns seconds until the next one."""
        for sess in self.table.idle(now_s, self.config.idle_timeout_s):
            if sess.uid not in self.waiters:  # a held call is not idleness
                self._finish(sess, now_s, "expired")
        return self.driver.tick(now_s)

    def _wake(self, sess: GatewaySession) -> None:
        for waiter in self.waiters.pop(sess.uid, []):
            if not waiter.done():
                waiter.set_result(sess.state)

    def _finish(self, sess: GatewaySession, now_s: float, how: str) -> None:
        self.counts["finished" if how == "finished" else how] += 1
        self.table.remove(sess, SessionState.FINISHED)
        self.driver.session_finished(sess.uid, now_s)
        self._wake(sess)

    def set_params(self, updates: dict[str, object]) -> dict[str, object]:
        """Change the policy's parameters at run time (admin API). Unknown
        names, wrong types, values out of range, and values that would need
        an engine mechanism a gateway cannot provide are refused with a
        ValueError naming the field; the old parameters then stay."""
        try:
            candidate = self.policy.params.with_params(**updates)
        except PolicyParamError as exc:
            raise ValueError(str(exc)) from None
        missing = self.policy.needs_with(candidate).required()
        if missing:
            raise ValueError(f"these parameters would need {', '.join(missing)} inside the engine, which a "
                             "gateway cannot provide; the old parameters stay")
        self.policy.update_params(**updates)
        return json_values(self.policy.params.as_dict(), nonfinite="string")

    # ------------------------------------------------------------ views
    def state(self) -> dict[str, object]:
        """Everything an operator asks first, as plain JSON values."""
        sig = self.last_signals
        policy_state = getattr(self.policy, "state", None)
        detail: dict[str, object] = {}
        if dataclasses.is_dataclass(policy_state) and not isinstance(policy_state, type):
            detail = json_values(dataclasses.asdict(policy_state), nonfinite="string")
        cliff = getattr(self.policy, "cliff", None)
        return {
            "policy": self.policy.name,
            "draining": self.draining,
            "ordering": self.ordered,
            "sessions": {state.value: len(self.table.of_state(state))
                         for state in (SessionState.ADMITTED, SessionState.PARKED)},
            "paused": self.paused_count(),
            "counts": dict(self.counts),
            "working_set_tokens": self.table.working_set_tokens(),
            "signals": json_values(dataclasses.asdict(sig), nonfinite="string") if sig else None,
            "controller": detail,
            "params": json_values(self.policy.params.as_dict(), nonfinite="string"),
            "cliff": json_values(dataclasses.asdict(cliff), nonfinite="string")
            if dataclasses.is_dataclass(cliff) and not isinstance(cliff, type) else None,
        }
