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
and answers with decisions; the one :class:`~basin.policy.driver.PolicyDriver`
keeps the session accounting and applies them, and the simulator hosts it
(the gateway hosts the same driver; the emulator runs no policy, the gateway
in front of it does). The engine mechanisms a policy needs
(:class:`~basin.policy.base.EngineNeeds`) are applied at the start and again
when an intervention switches the policy.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NoReturn

import numpy as np

from basin.catalog import Deployment, HardwareProfile, effective_cache_tokens
from basin.policy.base import EngineNeeds, Policy, SessionInfo
from basin.policy.driver import EngineFigures, PolicyDriver
from basin.sim.borrow import Borrowing, attach_borrowing
from basin.sim.cache import RadixCache
from basin.sim.decode import DecodeInstance, DecodeRoom
from basin.sim.events import CLIENT, CONTROL, ENGINE, SAMPLE, EventLoop
from basin.sim.invariants import InvariantViolation
from basin.sim.lending import LendingConfig, LentMemory, LentTier
from basin.sim.prefill import PrefillInstance
from basin.sim.recorder import Recorder
from basin.sim.router import choose_decode, choose_prefill
from basin.sim.sessions import Request, SessionState
from basin.workload.arrivals import SessionArrival
from basin.workload.records import Session
from basin.workload.reference import unloaded_references_s


class EngineSwitchError(ValueError):
    """A policy switch asks for an engine mechanism that cannot start or stop mid-run."""


def switch_refusal(before: EngineNeeds, after: EngineNeeds) -> str | None:
    """Why the engine cannot go from ``before``'s mechanisms to ``after``'s
    mid-run, or None. Reservation order and lending switch at once; prefill
    borrowing on decode instances is wired in at the start and stays as it is."""
    if before.decode_prefill_borrowing != after.decode_prefill_borrowing:
        return ("prefill on decode instances (Crossflow's borrowing) cannot start, stop or change "
                "mid-run; run the two policies' borrowing alike, or start with the second policy")
    return None


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


def _disposed(*_: object) -> NoReturn:
    """The callbacks of a disposed simulator (see Simulator.dispose)."""
    raise RuntimeError("the simulator was disposed of")


class Simulator:
    def __init__(self, config: SimConfig, policy: Policy,
                 on_sample: Callable[[Simulator, int], None] | None = None):
        """``on_sample`` is called after each simulated minute is recorded
        (tests check invariants there; the compiled simulator cannot be
        subclassed from Python)."""
        self.config = config
        self.on_sample = on_sample
        hw = config.hardware
        dep = config.deployment
        self.loop = EventLoop()
        self.recorder = Recorder()
        needs = policy.needs
        host_tokens = int(dep.host_ratio * hw.prefill.prefix_cache_tokens)
        #: What the routers read of each instance (PrefillInstance.loads, DecodeInstance.room).
        self.prefill_loads = [0] * dep.prefill_instances
        self.prefills = [
            PrefillInstance(
                i, hw.prefill,
                RadixCache(hw.prefill.prefix_cache_tokens, host_tokens, hw.page_tokens,
                           hw.prefill.state_slots, hw.prefill.load_threshold_tokens),
                self.loop, self._prefill_done, self.prefill_loads,
            )
            for i in range(dep.prefill_instances)
        ]
        self.decode_room = DecodeRoom(dep.decode_instances)
        self.decodes = [
            DecodeInstance(i, hw.decode, hw.itl_slo_s, self.loop,
                           self._decode_reserved, self._call_finished, self.decode_room)
            for i in range(dep.decode_instances)
        ]
        # Decode instances run prefill chunks under an ITL lease (Crossflow).
        self.borrowing: Borrowing | None = None
        if needs.decode_prefill_borrowing is not None:
            self.borrowing = attach_borrowing(self.decodes, hw.prefill, hw.itl_slo_s, self.loop,
                                              dataclasses.asdict(needs.decode_prefill_borrowing))
        self.lent_tier: LentTier | None = None
        self._lending_on = False
        self.reserve_at_completion = False
        self.needs = needs
        self._apply_needs(needs)
        self.effective_cache_tokens = effective_cache_tokens(
            hw.prefill.prefix_cache_tokens * len(self.prefills), sum(p.cache.host_capacity for p in self.prefills))
        self.driver = PolicyDriver(policy, self)
        self.sessions: list[SessionState] = []
        self.active: set[SessionState] = set()
        self.active_by_tag: Counter[str] = Counter()
        self._req_seq = 0
        self._reference_cache: dict[int, float] = {}
        # Read on every call: the (interpreted) profile's and deployment's
        # fields held as the simulator's own, and the handlers bound once.
        self._transfer_s: float = hw.transfer_s
        self._router: str = dep.router
        self._transferred_handler: Callable[[Request], None] = self._transferred
        self._issue_handler: Callable[[SessionState], None] = self._issue
        self._prefill_holds_handler: Callable[[int, int], bool] = self._prefill_holds

    @property
    def policy(self) -> Policy:
        return self.driver.policy

    # ================================================================== run
    def run(self, progress: Callable[[float], None] | None = None) -> RunResult:
        # The run allocates millions of short-lived objects, all freed by
        # reference counting: a run makes no cyclic garbage that grows with it
        # (a few hundred objects under each system; tests/test_sim_engine.py
        # pins it for every system). The cyclic collector would find nothing,
        # and its passes walk what is alive: the workload's calls and the
        # imports (a fifth of a run, before they were frozen), then the cache
        # nodes and keys the run builds up, which a larger deployment holds
        # more of (one young collection of an hour of 8P24D walked 500,000
        # of them in 0.2 s, 5% of the run). So the collector is off while the
        # run is on, and what existed before it is frozen; both are restored
        # after, also when the run fails. At the end the run's survivors (its
        # tables and state) join the frozen set before the collector is back,
        # so that the next young collection does not walk them all at once
        # (90 ms for a surge-1p3d run); when the run froze, it then thaws
        # everything into the oldest generation. A process that froze objects
        # itself keeps its freeze, with the run's survivors in it until it
        # thaws them.
        collecting = gc.isenabled()
        freeze = gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
        gc.disable()
        try:
            return self._run(progress)
        finally:
            gc.freeze()
            if collecting:
                gc.enable()
            if freeze:
                gc.unfreeze()

    def dispose(self) -> None:
        """Give back at once what a finished run built and what refers back
        to the simulator. A run's state refers to itself (a cache node and
        its parent, a request and the instance that queues it, a session
        and its request in flight, the simulator and the callbacks its
        instances and driver hold), so otherwise all of it, the arrivals and
        the workload's records included, waits for a full collection, which
        a process running simulation after simulation rarely makes: it
        carried every earlier run's state and slowed down by up to a third.
        The result of :meth:`run` stays valid; the simulator is unusable
        after (its callbacks and its driver's host raise)."""
        self.loop.discard_pending()
        # The instances' state, and what of theirs refers back to the
        # simulator (its callbacks; its own handlers and its driver below):
        # without these it is freed when its owner lets it go, and its
        # configuration (the arrivals, so the workload's records) with it.
        for p in self.prefills:
            p.cache.dispose()
            p.queue = []
            p.running = []
            p.on_done = _disposed
        for d in self.decodes:
            d.wait = []
            d.batch = set()
            d.pending = []
            d.finish_heap = []
            d.cross_heap = []
            d.borrower = None
            d.lending = None
            d.on_reserved = _disposed
            d.on_finished = _disposed
            d.held_by_prefill = _disposed
        for s in self.sessions:
            s.inflight = None
            s.pin = None
            s.pin_instance = None
            s.cursors = []
        self.sessions = []
        self.active = set()
        self.decode_room.stale.clear()
        self._transferred_handler = _disposed
        self._issue_handler = _disposed
        self._prefill_holds_handler = _disposed
        self.driver.detach()
        self.borrowing = None
        self.lent_tier = None
        self.prefills = []
        self.decodes = []

    def _run(self, progress: Callable[[float], None] | None) -> RunResult:
        cfg = self.config
        loop = self.loop
        self._tabulate_references([arr for arr in cfg.arrivals if arr.arrival_s <= cfg.duration_s])
        warm: list[SessionState] = []
        arriving: list[SessionArrival] = []
        for arr in cfg.arrivals:
            if arr.arrival_s > cfg.duration_s:
                continue
            if arr.start_call > 0 or arr.tag == "warm":
                warm.append(self._new_session(arr))
            else:
                arriving.append(arr)
        loop.at_each([arr.arrival_s for arr in arriving], CLIENT, self._arrive, arriving)
        if warm:
            self._warm_start(warm)
        for iv in cfg.interventions:
            loop.at(iv.at_s, CONTROL, self._intervene, iv)
        loop.at(0.0, CONTROL, self._tick, None)
        minutes = list(range(int(cfg.duration_s // 60)))
        loop.at_each([(minute + 1) * 60.0 for minute in minutes], SAMPLE, self._sample, minutes)
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
            gap = s.calls[s.next_call - 1].tool_gap_s if s.next_call > 0 else 0.0
            residual = float(rng.uniform(0.0, gap)) if gap > 0 else 0.0
            starts.append((residual - gap, residual, s))
        for last_touch, _, s in sorted(starts, key=lambda x: (x[0], x[2].uid)):
            if s.key:
                home = self.prefills[s.uid % len(self.prefills)]
                s.placed_on |= 1 << home.index
                s.keep_cursor(home.cache, home.cache.insert(s.key, last_touch, 0))
        self.driver.attach([(self._info(s), s.context_tokens) for s in warm], 0.0)
        for _, residual, s in starts:
            s.admitted_s = 0.0
            self.active.add(s)
            self.active_by_tag[s.tag] += 1
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
                           s.calls[s.next_call].prompt_tokens, rec.task_text, rec.peak_context_tokens)

    def _arrive(self, arr: SessionArrival) -> None:
        s = self._new_session(arr)
        self.driver.arrive(self._info(s), s.context_tokens)

    # Driver host: the driver's decisions, applied to the engine.
    def admitted(self, uid: int) -> None:
        s = self.sessions[uid]
        now = self.loop.now
        s.admitted_s = now
        self.active.add(s)
        self.active_by_tag[s.tag] += 1
        self.recorder.first_admitted(now - s.arrival_s)
        self._issue(s, first=True)

    def shed(self, uid: int, reason: str) -> None:
        self.sessions[uid].shed = True

    def resumed(self, uid: int) -> None:
        self._issue(self.sessions[uid])

    def lending(self, on: bool) -> None:
        if self.lent_tier is not None:
            self._lending_on = on
            if not on:
                for dec in self.decodes:
                    if dec.lending is not None:
                        dec.lending.maintain(dec.free_beyond_demand(), self._prefill_holds)

    def ordering(self, on: bool) -> None:
        for p in self.prefills:
            p.set_ordered(on)
        for dec in self.decodes:
            dec.set_ordered(on)

    def _issue(self, s: SessionState, first: bool = False) -> None:
        """The session's next call is ready (its tool gap has elapsed)."""
        if s.terminated:
            self._end_session(s, completed=False)
            return
        if self.driver.is_paused(s.uid):
            self.driver.call_held(s.uid, self.loop.now)
            return
        now = self.loop.now
        self._unpin(s)
        k = s.next_call
        key = s.advance_key(k)
        self._req_seq += 1
        req = Request(s, k, key, self._req_seq, now)
        if first:
            req.issued_s = s.arrival_s
        # The policy hears of the call first, so its key can reflect the moment.
        req.prio = self.driver.call_issued(s.uid, req.prompt, now)
        s.inflight = req
        s.context_tokens = req.prompt
        prefill = choose_prefill(self._router, self.prefills, self.prefill_loads, req)
        s.last_prefill = prefill.index
        s.placed_on |= 1 << prefill.index
        req.prefill = prefill
        decode = choose_decode(self.decode_room, self.decodes)
        req.decode = decode
        if self.reserve_at_completion:
            prefill.enqueue(req)
        else:
            decode.request_memory(req)

    # ============================================================ call path
    def _decode_reserved(self, req: Request) -> None:
        assert req.decode is not None
        if req.cancelled:
            req.decode.release_reservation(req)
            return
        if not math.isnan(req.prefill_end_s):
            # Prefill already done (reservation at completion, or a retracted
            # request resuming): transfer its KV now.
            self.loop.at(self.loop.now + self._transfer_s, ENGINE, self._transferred_handler, req)
        else:
            assert req.prefill is not None
            req.prefill.enqueue(req)
            if self.borrowing is not None:
                self.borrowing.queued(req)

    def _prefill_done(self, req: Request) -> None:
        self.recorder.prefill_done(req)
        assert req.decode is not None
        if not req.reserved:
            # Issued while decode memory is reserved at prefill completion
            # (the mode may have changed since, with the policy).
            req.decode.request_memory(req)
        else:
            self.loop.at(self.loop.now + self._transfer_s, ENGINE, self._transferred_handler, req)

    def _transferred(self, req: Request) -> None:
        now = self.loop.now
        if math.isnan(req.first_token_s):
            req.first_token_s = now
            self.recorder.first_token(req)
            assert req.prefill is not None
            req.prefill.release(req, now)
        assert req.decode is not None
        req.decode.join(req)

    def _call_finished(self, req: Request) -> None:
        now = self.loop.now
        s = req.session
        s.inflight = None
        s.calls_done += 1
        s.next_call += 1
        self.recorder.call_done(req, req.itl_violations)
        s.context_tokens += req.output
        last = s.done
        pin_s = self.driver.call_finished(s.uid, s.context_tokens, last, now)
        if self.lent_tier is not None:
            self._lend(s, req, keep=not (last or s.terminated))
        if last or s.terminated:
            self._end_session(s, completed=last and not s.terminated)
            return
        if pin_s > 0:
            self._pin(s, req, pin_s)
        gap = s.calls[req.call_index].tool_gap_s
        self.loop.at(now + gap, CLIENT, self._issue_handler, s)

    def _end_session(self, s: SessionState, completed: bool) -> None:
        now = self.loop.now
        if s in self.active:
            self.active.discard(s)
            self.active_by_tag[s.tag] -= 1
        self._unpin(s)
        if completed:
            s.finished_s = now
            self.recorder.session_done()
        self.driver.session_finished(s.uid, now)

    # -------------------------------------------------------------- lending
    def _lend(self, s: SessionState, req: Request, keep: bool) -> None:
        """After a call, its decode instance may keep the prompt as a unit."""
        tier = self.lent_tier
        d = req.decode
        assert d is not None
        if tier is None or d.lending is None:
            raise InvariantViolation("LENDING-WIRED", f"decode instance {d.index} lends without a lent tier")
        if keep and self._lending_on and not d.waiting and d.lending.adopt(s.uid, req.prompt, d.free_beyond_demand()):
            tier.record(s.uid, d.index)
        else:
            tier.forget(s.uid)
        d.lending.maintain(d.free_beyond_demand(), self._prefill_holds_handler)

    def _prefill_holds(self, uid: int, tokens: int) -> bool:
        s = self.sessions[uid]
        if s.last_prefill < 0 or not s.key:
            return False
        cache = self.prefills[s.last_prefill].cache
        return cache.peek(s.key, s.cursor_on(cache)) >= tokens

    # ------------------------------------------------------------ TTL pins
    def _pin(self, s: SessionState, req: Request, pin_s: float) -> None:
        assert req.prefill is not None
        cache = req.prefill.cache
        m = cache.match(req.key, self.loop.now, s.cursor_for(req.key, cache), req.prompt)
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
            assert s.pin_instance is not None
            s.pin_instance.cache.unlock(s.pin)
            s.pin_instance.kick()
            s.pin = None
            s.pin_instance = None

    # ============================================================== control
    def engine_figures(self, now_s: float) -> EngineFigures:
        decode_cap = sum(d.capacity for d in self.decodes)
        gpu = self.config.hardware.prefill.prefix_cache_tokens * len(self.prefills)
        host = sum(p.cache.host_capacity for p in self.prefills)
        return EngineFigures(
            hit_rate=self.recorder.recent_hit_rate(),
            prefill_queue_requests=sum(len(p.queue) for p in self.prefills),
            prefill_backlog_tokens=sum(p.backlog_tokens for p in self.prefills),
            decode_wait_requests=sum(d.waiting for d in self.decodes),
            decode_used_fraction=sum(d.used for d in self.decodes) / decode_cap,
            gpu_cache_tokens=gpu,
            host_cache_tokens=host,
            effective_cache_tokens=self.effective_cache_tokens,
            lent_cache_tokens=self.lent_tier.lent_tokens if self.lent_tier is not None else 0,
            decode_kv_tokens=decode_cap,
        )

    def _tick(self, _: object) -> None:
        next_s = self.driver.tick(self.loop.now)
        self.loop.at(self.loop.now + next_s, CONTROL, self._tick, None)

    def _apply_needs(self, needs: EngineNeeds) -> None:
        """Switch the engine mechanisms ``needs`` asks for (at the start, and
        when a policy is switched on). Decode-memory lending is wired in the
        first time a policy asks for it and stays available (lending itself
        follows each tick's decision)."""
        forced = self.config.reserve_at_prefill_completion
        self.reserve_at_completion = needs.reserve_decode_at_prefill_completion if forced is None else forced
        if needs.decode_memory_lending and self.lent_tier is None:
            lending = LendingConfig(cap_fraction=needs.lend_cap_fraction)
            memories: list[LentMemory] = []
            for d in self.decodes:
                memories.append(d.lend(lending))
                d.held_by_prefill = self._prefill_holds
            self.lent_tier = LentTier(memories, lending)
            for p in self.prefills:
                p.lower_tiers.append(self.lent_tier)
        elif not needs.decode_memory_lending and self.lent_tier is not None:
            self.lending(False)
        self.needs = needs

    def _intervene(self, iv: Intervention) -> None:
        if iv.kind == "terminate-tag":
            # Parked sessions of the tag leave the queue (and the policy's books).
            for uid in [uid for uid in self.driver.parked if self.sessions[uid].tag == iv.tag]:
                self.sessions[uid].terminated = True
                self.driver.session_finished(uid, self.loop.now)
            for s in [s for s in self.active if s.tag == iv.tag]:
                s.terminated = True
                req = s.inflight
                if req is not None and math.isnan(req.prefill_start_s):
                    # Not started yet: withdraw it from the queues.
                    req.cancelled = True
                    if req.prefill is not None and req.prefill.remove(req):
                        assert req.decode is not None
                        req.decode.release_reservation(req)
                    s.inflight = None
                    self._end_session(s, completed=False)
                elif self.driver.is_held(s.uid):
                    self._end_session(s, completed=False)
                # Otherwise it is running (it ends when the call finishes) or in
                # a tool gap (it ends when its next call comes due).
        elif iv.kind == "switch-policy" and iv.policy is not None:
            refusal = switch_refusal(self.needs, iv.policy.needs)
            if refusal is not None:
                raise EngineSwitchError(f"switch to '{iv.policy.name}' at {iv.at_s:g} s: {refusal}")
            self._apply_needs(iv.policy.needs)
            self.driver.switch_policy(iv.policy, [self._info(s) for s in self.active], self.loop.now)
            for s in self.active:
                if s.inflight is not None:
                    s.inflight.prio = self.driver.priority_key(s.uid)

    # ============================================================== samples
    def _sample(self, minute: int) -> None:
        lent = self.lent_tier.lent_tokens if self.lent_tier is not None else 0
        gauges = {
            "active_sessions": len(self.active),
            "parked_sessions": len(self.driver.parked),
            "working_set_tokens": self.driver.working_set_tokens,
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
        if self.on_sample is not None:
            self.on_sample(self, minute)

    # ============================================================ reference
    def _tabulate_references(self, arrivals: Sequence[SessionArrival]) -> None:
        """Work out the unloaded times of the sessions that will arrive, in one
        batch (session by session, one call at a time, they took about 6% of
        a trapped run's loop); each number is the one its session alone gets
        (one definition: :func:`basin.workload.reference.unloaded_references_s`)."""
        joined = {self._reference_key(a.session, a.start_call): a for a in arrivals}
        values = unloaded_references_s([a.session.calls[a.start_call:] for a in joined.values()],
                                       self.config.hardware)
        self._reference_cache = dict(zip(joined, values, strict=True))

    @staticmethod
    def _reference_key(session: Session, start_call: int) -> int:
        return id(session) * 1000 + start_call

    def _reference_s(self, session: Session, start_call: int) -> float:
        """Unloaded time of the session from where it joined (tabulated at the run's start)."""
        return self._reference_cache[self._reference_key(session, start_call)]
