"""The simulator: closed-loop sessions driving a PD-disaggregated engine under
a control policy.

A session's call is issued when its previous call has finished and the
recorded tool gap has elapsed. A call picks a prefill and a decode instance,
reserves decode memory (before prefill by default, as SGLang does, or at
prefill completion when the policy needs it), is prefilled against the
instance's prefix cache, pays the PD transfer and decodes. New sessions keep
arriving whatever the engine's state: that partly-open loop is what lets a
finite surge leave the engine trapped.

The policy sees only :class:`~basin.policy.base.Signals` and session events,
and answers with decisions the engine applies; it never touches engine state.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import numpy as np

from basin.policy.base import Admission, ControlDecision, Policy, SessionInfo, Signals
from basin.sim.borrow import Borrowing, attach_borrowing
from basin.sim.cache import RadixCache
from basin.sim.config import Deployment, HardwareProfile
from basin.sim.decode import DecodeInstance
from basin.sim.events import CLIENT, CONTROL, ENGINE, SAMPLE, EventLoop
from basin.sim.lending import LendingConfig, LentMemory, LentTier
from basin.sim.prefill import PrefillInstance
from basin.sim.recorder import Recorder
from basin.sim.router import choose_decode, choose_prefill
from basin.sim.sessions import Request, SessionState
from basin.workload.arrivals import SessionArrival
from basin.workload.records import Session

#: Horizon of the long-run arrival rate signal.
ARRIVAL_RATE_WINDOW_S = 15 * 60.0


@dataclass(frozen=True, slots=True)
class Intervention:
    """Something done to the run at a moment: end every session of a tag, or
    switch the control policy."""

    at_s: float
    kind: Literal["terminate-tag", "switch-policy"]
    tag: str | None = None
    policy: Policy | None = None


@dataclass(frozen=True)
class SimConfig:
    hardware: HardwareProfile
    deployment: Deployment
    arrivals: Sequence[SessionArrival]
    duration_s: float
    block_tokens: int | None = None
    interventions: Sequence[Intervention] = ()
    #: None: as the policy needs; True/False forces the engine switch.
    reserve_at_prefill_completion: bool | None = None
    #: Seeds the engine's own randomness (where warm sessions are in their tool gaps).
    seed: int = 0


@dataclass
class RunResult:
    calls: dict[str, np.ndarray]
    sessions: dict[str, np.ndarray]
    timeseries: dict[str, np.ndarray]
    events: int
    cache_stats: list[dict[str, int]] = field(default_factory=list)
    #: Prefill computed on decode instances (empty without borrowing).
    borrow_stats: dict[str, int] = field(default_factory=dict)


class Simulator:
    def __init__(self, config: SimConfig, policy: Policy):
        self.config = config
        self.policy = policy
        hw = config.hardware
        dep = config.deployment
        self.loop = EventLoop()
        self.recorder = Recorder()
        self.reserve_at_completion = (
            policy.needs.reserve_decode_at_prefill_completion
            if config.reserve_at_prefill_completion is None else config.reserve_at_prefill_completion
        )
        host_tokens = int(dep.host_ratio * hw.prefill.prefix_cache_tokens)
        self.prefills = [
            PrefillInstance(
                i, hw.prefill,
                RadixCache(hw.prefill.prefix_cache_tokens, host_tokens, hw.page_tokens,
                           hw.prefill.state_slots, hw.prefill.load_threshold_tokens),
                self.loop, self._prefill_done,
            )
            for i in range(dep.prefill_instances)
        ]
        self.decodes = [
            DecodeInstance(i, hw.decode, hw.itl_slo_s, self.loop,
                           self._decode_reserved, self._call_finished)
            for i in range(dep.decode_instances)
        ]
        # Decode instances run prefill chunks under an ITL lease (Crossflow).
        self.borrowing: Borrowing | None = None
        if policy.needs.decode_runs_prefill:
            self.borrowing = attach_borrowing(self.decodes, hw.prefill, hw.itl_slo_s, self.loop,
                                              policy.needs.extra.get("borrow"))  # type: ignore[arg-type]
        self.lent_tier: LentTier | None = None
        self._lending_on = False
        if policy.needs.decode_memory_lending:
            lending = LendingConfig(cap_fraction=policy.needs.lend_cap_fraction)
            for d in self.decodes:
                d.lending = LentMemory(d.capacity, lending)
                d.held_by_prefill = self._prefill_holds
            self.lent_tier = LentTier([d.lending for d in self.decodes], lending)
            for p in self.prefills:
                p.lower_tiers.append(self.lent_tier)
        self.sessions: list[SessionState] = []
        self.active: set[SessionState] = set()
        self.active_by_tag: Counter[str] = Counter()
        self.parked: list[SessionState] = []
        self.working_set = 0
        self.arrival_times: list[float] = []
        self._req_seq = 0
        self._ordered = False
        self._reference_cache: dict[int, float] = {}

    # ================================================================== run
    def run(self, progress: Callable[[float], None] | None = None) -> RunResult:
        cfg = self.config
        loop = self.loop
        warm: list[SessionState] = []
        for arr in cfg.arrivals:
            if arr.arrival_s > cfg.duration_s:
                continue
            if arr.start_call > 0 or arr.tag == "warm":
                warm.append(self._new_session(arr))
            else:
                loop.at(arr.arrival_s, CLIENT, self._arrive, arr)
        if warm:
            self._warm_start(warm)
        for iv in cfg.interventions:
            loop.at(iv.at_s, CONTROL, self._intervene, iv)
        loop.at(0.0, CONTROL, self._tick, None)
        for minute in range(int(cfg.duration_s // 60)):
            loop.at((minute + 1) * 60.0, SAMPLE, self._sample, minute)
        loop.run(cfg.duration_s, progress)
        return RunResult(
            calls=self.recorder.calls_table(),
            sessions=Recorder.sessions_table(self.sessions),
            timeseries=self.recorder.timeseries_table(),
            events=loop.events_run,
            cache_stats=[dataclasses.asdict(p.cache.stats) for p in self.prefills],
            borrow_stats=self.borrowing.stats() if self.borrowing is not None else {},
        )

    def _warm_start(self, warm: list[SessionState]) -> None:
        """Start from steady operation: each warm session is part-way through
        the tool gap after its last call, and its context is cached in the
        order steady operation would have left it (most recent last)."""
        rng = np.random.default_rng(np.random.SeedSequence([self.config.seed, 7]))
        starts = []
        for s in warm:
            gap = s.record.calls[s.next_call - 1].tool_gap_s if s.next_call > 0 else 0.0
            residual = float(rng.uniform(0.0, gap)) if gap > 0 else 0.0
            starts.append((residual - gap, residual, s))
        for last_touch, _, s in sorted(starts, key=lambda x: (x[0], x[2].uid)):
            if s.key:
                self.prefills[s.uid % len(self.prefills)].cache.insert(s.key, last_touch, 0)
        self.policy.attach([self._info(s) for s in warm], 0.0)
        for _, residual, s in starts:
            s.admitted_s = 0.0
            self.active.add(s)
            self.active_by_tag[s.tag] += 1
            self.working_set += s.context_tokens
            self.loop.at(residual, CLIENT, self._issue, s)

    # ============================================================= sessions
    def _new_session(self, arr: SessionArrival) -> SessionState:
        s = SessionState(len(self.sessions), arr.session, arr.tag, arr.arrival_s, arr.start_call,
                         self.config.block_tokens)
        s.reference_s = self._reference_s(arr.session, arr.start_call)
        self.sessions.append(s)
        self.recorder.arrival()
        return s

    def _info(self, s: SessionState) -> SessionInfo:
        rec = s.record
        return SessionInfo(s.uid, rec.session_id, s.tag, s.arrival_s,
                           rec.calls[s.next_call].prompt_tokens, rec.task_text, rec.peak_context_tokens)

    def _arrive(self, arr: SessionArrival) -> None:
        s = self._new_session(arr)
        self.arrival_times.append(self.loop.now)
        decision = self.policy.on_session_arrival(self._info(s), self._signals())
        if decision is Admission.ADMIT:
            self._admit(s)
        elif decision is Admission.PARK:
            self.parked.append(s)
        else:
            s.shed = True

    def _admit(self, s: SessionState) -> None:
        now = self.loop.now
        s.admitted_s = now
        self.active.add(s)
        self.active_by_tag[s.tag] += 1
        self.working_set += s.context_tokens
        self.recorder.first_admitted(now - s.arrival_s)
        self._issue(s, first=True)

    def _issue(self, s: SessionState, first: bool = False) -> None:
        """The session's next call is ready (its tool gap has elapsed)."""
        if s.terminated:
            self._end_session(s, completed=False)
            return
        if s.paused:
            s.held_call = True
            self.policy.on_call_held(s.uid, self.loop.now)
            return
        now = self.loop.now
        self._unpin(s)
        k = s.next_call
        key = s.prompt_key(k)
        s.key = key
        self._req_seq += 1
        req = Request(s, k, key, self._req_seq, now)
        if first:
            req.issued_s = s.arrival_s
        # The policy hears of the call first, so its key can reflect the moment.
        self.policy.on_call_issued(s.uid, req.prompt, now)
        req.prio = self.policy.priority_key(s.uid)
        s.inflight = req
        self.working_set += req.prompt - s.context_tokens
        s.context_tokens = req.prompt
        prefill = choose_prefill(self.config.deployment.router, self.prefills, req)
        s.last_prefill = prefill.index
        req.prefill = prefill
        decode = choose_decode(self.decodes)
        req.decode = decode
        if self.reserve_at_completion:
            prefill.enqueue(req)
        else:
            decode.request_memory(req)

    # ============================================================ call path
    def _decode_reserved(self, req: Request) -> None:
        if req.cancelled:
            req.decode.release_reservation(req)
            return
        if not math.isnan(req.prefill_end_s):
            # Prefill already done (reservation at completion, or a retracted
            # request resuming): transfer its KV now.
            self.loop.at(self.loop.now + self.config.hardware.transfer_s, ENGINE, self._transferred, req)
        else:
            req.prefill.enqueue(req)
            if self.borrowing is not None:
                self.borrowing.queued(req)

    def _prefill_done(self, req: Request) -> None:
        self.recorder.prefill_done(req)
        if self.reserve_at_completion:
            req.decode.request_memory(req)
        else:
            self.loop.at(self.loop.now + self.config.hardware.transfer_s, ENGINE, self._transferred, req)

    def _transferred(self, req: Request) -> None:
        now = self.loop.now
        if math.isnan(req.first_token_s):
            req.first_token_s = now
            self.recorder.first_token(req)
            req.prefill.release(req, now)
        req.decode.join(req)

    def _call_finished(self, req: Request) -> None:
        now = self.loop.now
        s = req.session
        s.inflight = None
        s.calls_done += 1
        s.next_call += 1
        self.recorder.call_done(req, req.itl_violations)
        self.working_set += req.output
        s.context_tokens += req.output
        last = s.done
        pin_s = self.policy.on_call_finished(s.uid, s.context_tokens, last, now)
        if self.lent_tier is not None:
            self._lend(s, req, keep=not (last or s.terminated))
        if last or s.terminated:
            self._end_session(s, completed=last and not s.terminated)
            return
        if pin_s > 0:
            self._pin(s, req, pin_s)
        gap = s.record.calls[req.call_index].tool_gap_s
        self.loop.at(now + gap, CLIENT, self._issue, s)

    def _end_session(self, s: SessionState, completed: bool) -> None:
        now = self.loop.now
        if s in self.active:
            self.active.discard(s)
            self.active_by_tag[s.tag] -= 1
            self.working_set -= s.context_tokens
        self._unpin(s)
        if completed:
            s.finished_s = now
            self.recorder.session_done()
        self.policy.on_session_finished(s.uid, now)

    # -------------------------------------------------------------- lending
    def _lend(self, s: SessionState, req: Request, keep: bool) -> None:
        """After a call, its decode instance may keep the prompt as a unit."""
        tier = self.lent_tier
        d = req.decode
        assert tier is not None and d.lending is not None
        if keep and self._lending_on and not d.waiting and d.lending.adopt(s.uid, req.prompt, d.free_beyond_demand()):
            tier.record(s.uid, d.index)
        else:
            tier.forget(s.uid)
        d.lending.maintain(d.free_beyond_demand(), self._prefill_holds)

    def _prefill_holds(self, uid: int, tokens: int) -> bool:
        s = self.sessions[uid]
        if s.last_prefill < 0 or not s.key:
            return False
        return self.prefills[s.last_prefill].cache.peek(s.key) >= tokens

    # ------------------------------------------------------------ TTL pins
    def _pin(self, s: SessionState, req: Request, pin_s: float) -> None:
        cache = req.prefill.cache
        m = cache.match(req.key, self.loop.now)
        cache.lock(m)
        s.pin = m
        s.pin_instance = req.prefill
        s.pin_expiry_s = self.loop.now + pin_s
        self.loop.at(s.pin_expiry_s, CONTROL, self._pin_expired, (s, s.pin))

    def _pin_expired(self, arg: tuple[SessionState, object]) -> None:
        s, pin = arg
        if s.pin is pin:
            self._unpin(s)

    def _unpin(self, s: SessionState) -> None:
        if s.pin is not None:
            s.pin_instance.cache.unlock(s.pin)
            s.pin_instance.kick()
            s.pin = None
            s.pin_instance = None

    # ============================================================== control
    def _signals(self) -> Signals:
        now = self.loop.now
        n_active = len(self.active)
        hw = self.config.hardware
        since = bisect.bisect_left(self.arrival_times, now - ARRIVAL_RATE_WINDOW_S)
        window_min = min(now, ARRIVAL_RATE_WINDOW_S) / 60.0
        decode_used = sum(d.used for d in self.decodes)
        decode_cap = sum(d.capacity for d in self.decodes)
        return Signals(
            now_s=now,
            active_sessions=n_active,
            parked_sessions=len(self.parked),
            working_set_tokens=self.working_set,
            mean_context_tokens=self.working_set / n_active if n_active else 0.0,
            hit_rate=self.recorder.recent_hit_rate(),
            prefill_queue_requests=sum(len(p.queue) for p in self.prefills),
            prefill_backlog_tokens=sum(p.backlog_tokens for p in self.prefills),
            decode_wait_requests=sum(d.waiting for d in self.decodes),
            decode_used_fraction=decode_used / decode_cap,
            arrival_rate_per_min=(len(self.arrival_times) - since) / window_min if window_min > 0 else 0.0,
            gpu_cache_tokens=hw.prefill.prefix_cache_tokens * len(self.prefills),
            host_cache_tokens=sum(p.cache.host_capacity for p in self.prefills),
            lent_cache_tokens=self.lent_tier.lent_tokens if self.lent_tier is not None else 0,
            decode_kv_tokens=decode_cap,
        )

    def _tick(self, _: object) -> None:
        parked_uids = [s.uid for s in self.parked]
        decision = self.policy.control(self._signals(), parked_uids)
        self._apply(decision)
        self.loop.at(self.loop.now + max(decision.next_tick_s, 0.1), CONTROL, self._tick, None)

    def _apply(self, d: ControlDecision) -> None:
        if d.release or d.shed:
            by_uid = {s.uid: s for s in self.parked}
            for uid in d.shed:
                s = by_uid.pop(uid, None)
                if s is not None:
                    s.shed = True
            released = [by_uid.pop(uid) for uid in d.release if uid in by_uid]
            self.parked = [s for s in self.parked if s.uid in by_uid]
            for s in released:
                self._admit(s)
        if d.pause or d.resume:
            sessions = self.sessions
            for uid in d.pause:
                sessions[uid].paused = True
            for uid in d.resume:
                s = sessions[uid]
                s.paused = False
                if s.held_call:
                    s.held_call = False
                    self._issue(s)
        if self.lent_tier is not None:
            self._lending_on = d.lend_decode_memory
            if not self._lending_on:
                for dec in self.decodes:
                    assert dec.lending is not None
                    dec.lending.maintain(dec.free_beyond_demand(), self._prefill_holds)
        if d.order_by_priority != self._ordered:
            self._ordered = d.order_by_priority
            for p in self.prefills:
                p.set_ordered(self._ordered)
            for dec in self.decodes:
                dec.set_ordered(self._ordered)

    def _intervene(self, iv: Intervention) -> None:
        if iv.kind == "terminate-tag":
            self.parked = [s for s in self.parked if s.tag != iv.tag]
            for s in [s for s in self.active if s.tag == iv.tag]:
                s.terminated = True
                req = s.inflight
                if req is not None and math.isnan(req.prefill_start_s):
                    # Not started yet: withdraw it from the queues.
                    req.cancelled = True
                    if req.prefill is not None and req.prefill.remove(req):
                        req.decode.release_reservation(req)
                    s.inflight = None
                    self._end_session(s, completed=False)
                elif s.held_call:
                    self._end_session(s, completed=False)
                # Otherwise it is running (it ends when the call finishes) or in
                # a tool gap (it ends when its next call comes due).
        elif iv.kind == "switch-policy" and iv.policy is not None:
            self.policy = iv.policy
            self.policy.attach([self._info(s) for s in self.active], self.loop.now)
            for s in self.active:
                if s.inflight is not None:
                    s.inflight.prio = self.policy.priority_key(s.uid)

    # ============================================================== samples
    def _sample(self, minute: int) -> None:
        lent = self.lent_tier.lent_tokens if self.lent_tier is not None else 0
        gauges = {
            "active_sessions": len(self.active),
            "parked_sessions": len(self.parked),
            "working_set_tokens": self.working_set,
            "cache_capacity_tokens": self.config.hardware.prefill.prefix_cache_tokens * len(self.prefills),
            "host_capacity_tokens": sum(p.cache.host_capacity for p in self.prefills),
            "decode_kv_decoding_tokens": sum(d.decoding_tokens for d in self.decodes),
            "decode_kv_reserved_idle_tokens": sum(d.reserved_idle for d in self.decodes),
            "decode_kv_capacity_tokens": sum(d.capacity for d in self.decodes),
            "decode_kv_lent_tokens": lent,
            "prefill_queue_len": sum(len(p.queue) for p in self.prefills),
            "decode_wait_len": sum(d.waiting for d in self.decodes),
            "decode_running": sum(len(d.batch) for d in self.decodes),
        }
        self.recorder.close_minute(minute, gauges, self.active_by_tag)

    # ============================================================ reference
    def _reference_s(self, session: Session, start_call: int) -> float:
        """Unloaded time of the session: its tool gaps plus, per call, the
        new-suffix prefill, the fixed overheads and batch-one decode."""
        key = id(session) * 1000 + start_call
        cached = self._reference_cache.get(key)
        if cached is not None:
            return cached
        hw = self.config.hardware
        pre, dec = hw.prefill, hw.decode
        total = 0.0
        calls = session.calls
        for k in range(start_call, len(calls)):
            c = calls[k]
            total += pre.step_overhead_s + pre.tokens_cost_s(c.new_tokens, c.reused_tokens) + hw.transfer_s
            m = max(c.output_tokens - 1, 0)
            a = dec.step_s(1, c.prompt_tokens + 1)
            total += m * a + dec.step_per_context_token_s * m * (m - 1) / 2.0
            if k < len(calls) - 1:
                total += c.tool_gap_s
        self._reference_cache[key] = total
        return total
