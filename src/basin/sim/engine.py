"""The simulator: closed-loop sessions driving the engine core
(:class:`~basin.sim.cluster.Cluster`) under a control policy.

A session's call is issued when its previous call has finished and the
recorded tool gap has elapsed; the core serves it (route, reserve decode
memory, prefill against the cache, PD transfer, decode) and reports its
first token and its finish. New sessions keep arriving whatever the engine's
state: that partly-open loop is what lets a finite surge leave the engine
trapped. Warm starts, interventions, the minute samples and the sessions'
reference times are the simulator's; so is hosting the policy driver.

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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NoReturn

import numpy as np

from basin.catalog import Deployment, HardwareProfile
from basin.policy.base import EngineFigures, EngineNeeds, Policy, SessionInfo
from basin.policy.driver import PolicyDriver
from basin.sim.cluster import Cluster, PDTopology
from basin.sim.colocated import ColocatedCluster, ColocatedTopology
from basin.sim.events import CLIENT, CONTROL, SAMPLE
from basin.sim.recorder import Recorder
from basin.sim.requests import CallListener, Request
from basin.sim.sessions import SessionState
from basin.sim.streams import WARM_START, stream
from basin.workload.arrivals import SessionArrival
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


def _ended(*_: object) -> NoReturn:
    raise RuntimeError("the run is over")


class Simulator(CallListener):
    """Closed-loop sessions under a policy on an engine core, whose calls it hears of as its listener."""

    def __init__(self, config: SimConfig, policy: Policy,
                 on_sample: Callable[[Simulator, int], None] | None = None):
        """``on_sample`` is called after each simulated minute is recorded
        (tests check invariants there; the compiled simulator cannot be
        subclassed from Python)."""
        self.config = config
        self.on_sample = on_sample
        hw = config.hardware
        self.recorder = Recorder()
        needs = policy.needs
        borrowing = needs.decode_prefill_borrowing
        self.cluster: Cluster | ColocatedCluster
        if config.deployment.topology == "colocated":
            self.cluster = ColocatedCluster(hw, ColocatedTopology.of(config.deployment, hw), self)
        else:
            self.cluster = Cluster(hw, PDTopology.of(config.deployment, hw), self,
                                   borrowing=dataclasses.asdict(borrowing) if borrowing is not None else None)
        self.loop = self.cluster.loop
        self.needs = needs
        self._apply_needs(needs)
        self.driver = PolicyDriver(policy, self)
        self.sessions: list[SessionState] = []
        self.active: set[SessionState] = set()
        self.active_by_tag: Counter[str] = Counter()
        self._references: dict[tuple[int, int], float] = {}
        #: Bound once (compiled, a bound method made per call costs more than
        #: the call's bookkeeping); let go when the run ends.
        self._issue_handler: Callable[[SessionState], None] = self._issue

    @property
    def policy(self) -> Policy:
        return self.driver.policy

    # ================================================================== run
    def run(self, progress: Callable[[float], None] | None = None) -> RunResult:
        """Run to ``config.duration_s``. The run ends there: the engine stops
        (:meth:`Cluster.stop`) and the driver lets go of its host, so the
        simulator's state stays readable and is freed by reference counting
        when it is dropped; the simulator cannot run again."""
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
            self.cluster.stop()
            self.driver.detach()
            self._issue_handler = _ended
            gc.freeze()
            if collecting:
                gc.enable()
            if freeze:
                gc.unfreeze()

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
        cluster = self.cluster
        return RunResult(
            calls=self.recorder.calls_table(),
            sessions=Recorder.sessions_table(self.sessions),
            timeseries=self.recorder.timeseries_table(),
            events=loop.events_run,
            cache_stats=cluster.cache_stats(),
            borrow_stats=cluster.borrowing.stats() if isinstance(cluster, Cluster) and cluster.borrowing is not None
            else {},
        )

    def _warm_start(self, warm: list[SessionState]) -> None:
        """Start from steady operation: each warm session is part-way through
        the tool gap after its last call, and its context is cached in the
        order steady operation would have left it (most recent last)."""
        rng = stream(self.config.seed, WARM_START)
        starts = []
        for s in warm:
            gap = s.calls[s.next_call - 1].tool_gap_s if s.next_call > 0 else 0.0
            residual = float(rng.uniform(0.0, gap)) if gap > 0 else 0.0
            starts.append((residual - gap, residual, s))
        for last_touch, _, s in sorted(starts, key=lambda x: (x[0], x[2].uid)):
            if s.key:
                self.cluster.preload(s.route, s.key, last_touch)
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
        s.reference_s = self._references[(id(arr.session), arr.start_call)]
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
        self.cluster.set_lending(on)

    def ordering(self, on: bool) -> None:
        self.cluster.set_ordered(on)

    def engine_figures(self, now_s: float) -> EngineFigures:
        return self.cluster.engine_figures(self.recorder.recent_hit_rate(self.cluster.prefill_totals()))

    # ================================================================ calls
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
        call = s.calls[k]
        # Each field of the (interpreted) record read once: compiled, a read is a generic lookup.
        prompt, new, output = call.prompt_tokens, call.new_tokens, call.output_tokens
        # The policy hears of the call first, so its key can reflect the moment.
        prio = self.driver.call_issued(s.uid, prompt, now)
        s.context_tokens = prompt
        req = self.cluster.submit(s.uid, key, prompt, new, output, prio, route=s.route, call_index=k)
        if first:
            req.issued_s = s.arrival_s
        req.last = k + 1 >= len(s.calls)
        s.inflight = req

    def first_token(self, req: Request) -> None:
        self.recorder.first_token(req)

    def finished(self, req: Request) -> None:
        now = self.loop.now
        s = self.sessions[req.session]
        s.inflight = None
        s.calls_done += 1
        s.next_call += 1
        s.decode_steps += req.decode_steps
        s.itl_violations += req.itl_violations
        self.recorder.call_done(req, s.tag, req.itl_violations)
        s.context_tokens += req.output
        last = s.done
        pin_s = self.driver.call_finished(s.uid, s.context_tokens, last, now)
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

    # ------------------------------------------------------------ TTL pins
    def _pin(self, s: SessionState, req: Request, pin_s: float) -> None:
        s.pin = self.cluster.pin(req)
        s.pin_instance = req.prefill
        s.pin_expiry_s = self.loop.now + pin_s
        self.loop.at(s.pin_expiry_s, CONTROL, self._pin_expired, (s, s.pin))

    def _pin_expired(self, arg: tuple[SessionState, object]) -> None:
        s, pin = arg
        if s.pin is pin:
            self._unpin(s)

    def _unpin(self, s: SessionState) -> None:
        if s.pin is not None:
            self.cluster.unpin(s.pin_instance, s.pin)
            s.pin = None
            s.pin_instance = -1

    # ============================================================== control
    def _tick(self, _: object) -> None:
        next_s = self.driver.tick(self.loop.now)
        self.loop.at(self.loop.now + next_s, CONTROL, self._tick, None)

    def _apply_needs(self, needs: EngineNeeds) -> None:
        """Switch the engine mechanisms ``needs`` asks for (at the start, and
        when a policy is switched on). Decode-memory lending is wired in the
        first time a policy asks for it and stays available (lending itself
        follows each tick's decision)."""
        forced = self.config.reserve_at_prefill_completion
        cluster = self.cluster
        cluster.reserve_at_completion = needs.reserve_decode_at_prefill_completion if forced is None else forced
        if needs.decode_memory_lending and cluster.lent_tier is None:
            cluster.wire_lending(needs.lend_cap_fraction)
        elif not needs.decode_memory_lending and cluster.lent_tier is not None:
            cluster.set_lending(False)
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
                if req is not None and self.cluster.withdraw(req):
                    # Not started yet: withdrawn from the queues.
                    s.inflight = None
                    self._end_session(s, completed=False)
                elif self.driver.is_held(s.uid):
                    self._end_session(s, completed=False)
                elif req is not None:
                    req.last = True  # running: it ends when the call finishes, keeping nothing lent
                # Otherwise it is in a tool gap (it ends when its next call comes due).
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
        gauges: dict[str, float] = {
            "active_sessions": len(self.active),
            "parked_sessions": len(self.driver.parked),
            "working_set_tokens": self.driver.working_set_tokens,
        }
        gauges.update(self.cluster.gauges())
        self.recorder.close_minute(minute, gauges, self.active_by_tag, self.cluster.prefill_totals())
        if self.on_sample is not None:
            self.on_sample(self, minute)

    # ============================================================ reference
    def _tabulate_references(self, arrivals: Sequence[SessionArrival]) -> None:
        """Work out the unloaded times of the sessions that will arrive, in one
        batch (session by session, one call at a time, they took about 6% of
        a trapped run's loop); each number is the one its session alone gets
        from where it joins (one definition:
        :func:`basin.workload.reference.unloaded_references_s`). Keyed by the
        session record's identity and the call it joins at."""
        joined = {(id(a.session), a.start_call): a for a in arrivals}
        values = unloaded_references_s([a.session.calls[a.start_call:] for a in joined.values()],
                                       self.config.hardware)
        self._references = dict(zip(joined, values, strict=True))
