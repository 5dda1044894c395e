"""The gateway's driver of a control policy: the same policy objects the
simulator drives, fed from the gateway's session table and the engine's
scraped metrics.

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

from basin.gateway.config import GatewayConfig
from basin.gateway.engines import EngineSnapshot
from basin.gateway.sessions import GatewaySession, SessionState, SessionTable
from basin.gateway.usage import CallUsage
from basin.policy.base import Admission, Policy, SessionInfo, Signals

log = logging.getLogger("basin.gateway")

#: Capacity reported to the policy when neither the operator nor the engine
#: gives one: admission by working set then never engages (the gateway warns).
UNKNOWN_CAPACITY_TOKENS = 1 << 60


class Waiter(Protocol):
    """What the gate resolves to wake a held call (an ``asyncio.Future``)."""

    def done(self) -> bool: ...

    def set_result(self, result: object) -> None: ...


class EngineView(Protocol):
    """The latest engine scrape, its age, and the last cache capacity any
    scrape reported (the merged metrics pollers)."""

    latest: EngineSnapshot | None
    capacity_tokens: int | None

    def stale_s(self, now_s: float) -> float: ...


#: Policy parameters that switch engine-side mechanisms a gateway cannot provide.
ENGINE_SIDE_PARAMS = frozenset({"lending"})


class ShedError(Exception):
    """The session was shed; ``reason`` is the machine-readable cause."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Gate:
    def __init__(self, policy: Policy, config: GatewayConfig, engine: EngineView | None = None,
                 capacity_tokens: int | None = None, origin_s: float = 0.0):
        self.policy = policy
        self.config = config
        self.engine = engine
        self.capacity_tokens = capacity_tokens
        self.origin_s = origin_s
        self.table = SessionTable()
        self.waiters: dict[int, list[Waiter]] = {}
        self.draining = False
        self.ordering = False
        self.last_signals: Signals | None = None
        self.counts = {"admitted": 0, "parked": 0, "shed": 0, "finished": 0, "abandoned": 0, "expired": 0}

    # ------------------------------------------------------------ signals
    def _engine_snapshot(self, now_s: float) -> tuple[EngineSnapshot | None, float]:
        if self.engine is None or self.engine.latest is None:
            return None, math.inf
        stale = self.engine.stale_s(now_s)
        return (self.engine.latest if stale <= self.config.stale_after_s else None), stale

    def signals(self, now_s: float) -> Signals:
        """The policy's view: the gateway's own accounting, and the engine's
        figures only while the last scrape is fresh (a stale scrape counts as
        unknown, never as idle or as saturated)."""
        snap, stale = self._engine_snapshot(now_s)
        table = self.table
        admitted = table.admitted()
        working_set = sum(s.context_tokens for s in admitted)
        hit = table.hit_rate(now_s, self.config.hit_window_s)
        if math.isnan(hit) and snap is not None:
            hit = snap.hit_rate
        # The capacity the operator set, else the last one any scrape reported
        # (a deployment's capacity does not go stale with its scrape).
        capacity = self.capacity_tokens or getattr(self.engine, "capacity_tokens", None)
        if capacity is None and snap is not None:
            capacity = snap.cache_capacity_tokens
        kv = snap.kv_used_fraction if snap is not None else math.nan
        # Without a fresh scrape the engine's queue is unknown: the calls the
        # gateway forwarded and has no answer for stand in for it.
        queue = (snap.queue_requests if snap is not None
                 else sum(1 for s in table.sessions.values() if s.unanswered_prompt_tokens > 0))
        return Signals(
            now_s=now_s,
            active_sessions=len(admitted),
            parked_sessions=sum(1 for s in table.sessions.values() if s.state is SessionState.PARKED),
            working_set_tokens=working_set,
            mean_context_tokens=working_set / len(admitted) if admitted else 0.0,
            hit_rate=hit,
            prefill_queue_requests=queue,
            prefill_backlog_tokens=table.unanswered_prompt_tokens(),
            decode_wait_requests=snap.decode_wait_requests if snap is not None else 0,
            decode_used_fraction=0.0 if math.isnan(kv) else float(kv),
            arrival_rate_per_min=table.arrival_rate_per_min(now_s),
            gpu_cache_tokens=int(capacity) if capacity else UNKNOWN_CAPACITY_TOKENS,
            host_cache_tokens=self.config.host_cache_tokens,
            lent_cache_tokens=0,
            decode_kv_tokens=0,
            stale_s=stale,
        )

    # ------------------------------------------------------------ calls
    def open_call(self, session_id: str, now_s: float, prompt_tokens: int, task_text: str | None,
                  end: bool) -> GatewaySession:
        """The session a call belongs to; a new id is a session's arrival and
        gets the policy's admission decision. Raises :class:`ShedError`."""
        sess = self.table.get(session_id)
        if sess is None:
            if self.draining:
                raise ShedError("draining", "the gateway is draining and admits no new sessions")
            signals = self.signals(now_s)
            sess = self.table.add(session_id, now_s, prompt_tokens, task_text)
            info = SessionInfo(sess.uid, session_id, "gateway", now_s, prompt_tokens, task_text)
            verdict = self.policy.on_session_arrival(info, signals)
            if verdict is Admission.SHED:
                self._shed(sess, "policy", now_s)
            elif verdict is Admission.ADMIT:
                sess.state = SessionState.ADMITTED
                self.counts["admitted"] += 1
            else:
                self.counts["parked"] += 1
        if sess.state is SessionState.SHED:
            raise ShedError(sess.shed_reason or "policy", "the session was shed to protect the engine")
        sess.ending = sess.ending or end
        sess.last_seen_s = now_s
        if sess.paused:
            self.policy.on_call_held(sess.uid, now_s)
        return sess

    @staticmethod
    def must_wait(sess: GatewaySession) -> bool:
        return sess.state is SessionState.PARKED or sess.paused

    def wait(self, sess: GatewaySession, waiter: Waiter) -> None:
        """Hold a call until its session is released or resumed (or shed)."""
        self.waiters.setdefault(sess.uid, []).append(waiter)

    def forwarded(self, sess: GatewaySession, prompt_tokens: int, now_s: float) -> None:
        self.table.call_forwarded(sess, prompt_tokens, now_s)
        self.policy.on_call_issued(sess.uid, prompt_tokens, now_s)

    def answering(self, sess: GatewaySession, prompt_tokens: int) -> None:
        self.table.call_answering(sess, prompt_tokens)

    def done(self, sess: GatewaySession, usage: CallUsage | None, now_s: float) -> None:
        """A forwarded call ended (answered, failed or abandoned)."""
        self.table.call_done(sess, usage, now_s)
        last = sess.ending and sess.in_flight == 0
        if sess.state is SessionState.ADMITTED:
            self.policy.on_call_finished(sess.uid, sess.context_tokens, last, now_s)
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
        if not self.ordering:
            return None
        key = self.policy.priority_key(sess.uid)
        if key is None or not math.isfinite(key):
            return None
        return max(int(round(key - self.origin_s)), 0)

    # ------------------------------------------------------------ control
    def tick(self, now_s: float) -> float:
        """One control step; returns seconds until the next one."""
        for sess in self.table.idle(now_s, self.config.idle_timeout_s):
            if sess.uid not in self.waiters:  # a held call is not idleness
                self._finish(sess, now_s, "expired")
        signals = self.signals(now_s)
        self.last_signals = signals
        parked = [s.uid for s in sorted(self.table.of_state(SessionState.PARKED), key=lambda s: s.arrival_s)]
        decision = self.policy.control(signals, parked)
        by_uid = self.table.by_uid
        for uid in decision.shed:
            sess = by_uid.get(uid)
            if sess is not None and sess.state is SessionState.PARKED:
                self._shed(sess, "persistent-overload", now_s)
        for uid in decision.release:
            sess = by_uid.get(uid)
            if sess is not None and sess.state is SessionState.PARKED:
                sess.state = SessionState.ADMITTED
                self.counts["admitted"] += 1
                self._wake(sess)
        for uid in decision.pause:
            if uid in by_uid:
                by_uid[uid].paused = True
        for uid in decision.resume:
            sess = by_uid.get(uid)
            if sess is not None and sess.paused:
                sess.paused = False
                self._wake(sess)
        self.ordering = decision.order_by_priority
        return max(decision.next_tick_s, 0.1)

    def _wake(self, sess: GatewaySession) -> None:
        for waiter in self.waiters.pop(sess.uid, []):
            if not waiter.done():
                waiter.set_result(sess.state)

    def _shed(self, sess: GatewaySession, reason: str, now_s: float) -> None:
        sess.shed_reason = reason
        self.counts["shed"] += 1
        self.table.remove(sess, SessionState.SHED)
        self.policy.on_session_finished(sess.uid, now_s)
        self._wake(sess)

    def _finish(self, sess: GatewaySession, now_s: float, how: str) -> None:
        self.counts["finished" if how == "finished" else how] += 1
        self.table.remove(sess, SessionState.FINISHED)
        self.policy.on_session_finished(sess.uid, now_s)
        self._wake(sess)

    def set_params(self, updates: dict[str, object]) -> dict[str, object]:
        """Change the policy's parameters at run time (admin API). Unknown
        names and values of the wrong type are refused with a ValueError."""
        params = getattr(self.policy, "params", None)
        if params is None or not dataclasses.is_dataclass(params):
            raise ValueError(f"policy '{self.policy.name}' has no run-time parameters")
        current = dataclasses.asdict(params)
        clean: dict[str, object] = {}
        for name, value in updates.items():
            if name not in current:
                raise ValueError(f"unknown parameter '{name}' of policy '{self.policy.name}'; "
                                 f"known: {', '.join(sorted(current))}")
            if name in ENGINE_SIDE_PARAMS:
                raise ValueError(f"parameter '{name}' switches an engine-side mechanism that a gateway "
                                 "cannot provide; it stays off")
            old = current[name]
            if isinstance(old, bool):
                ok = isinstance(value, bool)
            elif isinstance(old, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(old, float):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                value = float(value) if ok else value
            else:
                ok = isinstance(value, type(old))
            if not ok:
                raise ValueError(f"parameter '{name}': expected {type(old).__name__}, got {value!r}")
            clean[name] = value
        self.policy.params = dataclasses.replace(params, **clean)  # type: ignore[attr-defined]
        return {k: _plain(v) for k, v in dataclasses.asdict(self.policy.params).items()}  # type: ignore[attr-defined]

    # ------------------------------------------------------------ views
    def state(self) -> dict[str, object]:
        """Everything an operator asks first, as plain JSON values."""
        sig = self.last_signals
        policy_state = getattr(self.policy, "state", None)
        detail: dict[str, object] = {}
        if policy_state is not None and dataclasses.is_dataclass(policy_state):
            detail = {k: _plain(v) for k, v in dataclasses.asdict(policy_state).items()}
        params = getattr(self.policy, "params", None)
        cliff = getattr(self.policy, "cliff", None)
        return {
            "policy": self.policy.name,
            "draining": self.draining,
            "ordering": self.ordering,
            "sessions": {state.value: len(self.table.of_state(state))
                         for state in (SessionState.ADMITTED, SessionState.PARKED)},
            "paused": sum(1 for s in self.table.sessions.values() if s.paused),
            "counts": dict(self.counts),
            "working_set_tokens": self.table.working_set_tokens(),
            "signals": {k: _plain(v) for k, v in dataclasses.asdict(sig).items()} if sig else None,
            "controller": detail,
            "params": {k: _plain(v) for k, v in dataclasses.asdict(params).items()}
            if params is not None and dataclasses.is_dataclass(params) else {},
            "cliff": {k: _plain(v) for k, v in dataclasses.asdict(cliff).items()}
            if cliff is not None and dataclasses.is_dataclass(cliff) else None,
        }


def _plain(value: object) -> object:
    """JSON has no infinities or NaN: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
