"""The simulator's engine, taking calls one at a time from outside.

The instances are the simulator's own (:class:`~basin.sim.prefill.PrefillInstance`
over a :class:`~basin.sim.cache.RadixCache` with its host tier,
:class:`~basin.sim.decode.DecodeInstance`, the routers of
:mod:`basin.sim.router`, one :class:`~basin.sim.events.EventLoop`), built
from the catalogue's calibrated costs. A call follows the simulator's path
(``Simulator._issue`` and the handlers after it): route, reserve decode
memory (before prefill, SGLang's order, or at prefill completion), prefill
against the cache, pay the PD transfer, cache the prompt, decode. What the
simulator gets from a session's trajectory (prompt, output, cache key) comes
here from the request (:mod:`basin.emulate.calls`).

Decode-memory lending (BASIN's engine change, :mod:`basin.sim.lending`) is
the simulator's too, switched from outside (:meth:`EmulatedEngine.lending`,
the server's ``POST /emulator/lending``): after a call, its decode instance
may keep the prompt as a unit for the session's next call.

No clock and no I/O: the driver advances the model to a simulated time and
asks when the next event is due; the same calls at the same simulated times
give the same timings.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from basin.catalog import Deployment, HardwareProfile, cache_capacity
from basin.emulate.calls import ChatCall, RequestError, affinity_uid
from basin.sim.cache import RadixCache
from basin.sim.decode import DecodeInstance, DecodeRoom
from basin.sim.events import ENGINE, EventLoop
from basin.sim.lending import LendingConfig, LentMemory, LentTier
from basin.sim.prefill import PrefillInstance
from basin.sim.router import choose_decode, choose_prefill
from basin.sim.sessions import Piece, Request, SessionState
from basin.workload.records import Call, Session

#: Calls per prefill instance behind its ``cache_hit_rate`` gauge.
HIT_WINDOW_CALLS = 64


class EmulatedCall:
    """One call in the model; its times are simulated seconds (NaN until reached)."""

    __slots__ = ("call", "req", "arrival_s", "first_token_s", "finished_s", "cached_tokens", "listener",
                 "withdrawn")

    def __init__(self, call: ChatCall, req: Request, arrival_s: float):
        self.call = call
        self.req = req
        self.arrival_s = arrival_s
        self.first_token_s = math.nan
        self.finished_s = math.nan
        self.cached_tokens = 0
        #: Told of the first token and of the finish (the driver wakes its client).
        self.listener: Callable[[EmulatedCall], None] | None = None
        self.withdrawn = False

    @property
    def started(self) -> bool:
        return not math.isnan(self.req.prefill_start_s)

    @property
    def finished(self) -> bool:
        return not math.isnan(self.finished_s)

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> float:
        return self.finished_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class PrefillFigures:
    index: int
    queue_requests: int
    running_requests: int
    pool_tokens: int
    pool_used_fraction: float
    host_tokens: int
    prompt_tokens_total: int
    cached_tokens_total: int
    #: Cached share of the prompt tokens of its last :data:`HIT_WINDOW_CALLS` calls (0 before any).
    recent_hit_rate: float


@dataclass(frozen=True, slots=True)
class DecodeFigures:
    index: int
    running_requests: int
    #: KV arrived, joining the batch at the next step boundary.
    joining_requests: int
    #: Waiting for a KV reservation (SGLang's prealloc queue).
    memory_wait_requests: int
    #: KV in flight from prefill (SGLang's transfer queue).
    transfer_requests: int
    kv_tokens: int
    kv_used_fraction: float
    #: Decode memory now lent as prefix cache (0 while lending was never switched on).
    lent_tokens: int


@dataclass(frozen=True, slots=True)
class LendingState:
    """Decode-memory lending as the engine now runs it."""

    on: bool
    #: Lent memory never exceeds this share of a decode instance's KV (phi).
    cap_fraction: float
    lent_tokens: int
    decode_kv_tokens: int


class EmulatedEngine:
    """A deployment of the simulator's instances, driven call by call."""

    def __init__(self, hardware: HardwareProfile, deployment: Deployment, *,
                 reserve_at_prefill_completion: bool = False):
        self.hardware = hardware
        self.deployment = deployment
        self.reserve_at_completion = reserve_at_prefill_completion
        self.loop = EventLoop()
        cap = cache_capacity(deployment, hardware)
        pre = hardware.prefill
        self.prefill_loads = [0] * deployment.prefill_instances
        self.prefills = [
            PrefillInstance(i, pre, RadixCache(cap.gpu_tokens_per_instance, cap.host_tokens_per_instance,
                                               hardware.page_tokens, pre.state_slots, pre.load_threshold_tokens),
                            self.loop, self._prefill_done, self.prefill_loads)
            for i in range(deployment.prefill_instances)
        ]
        self.decode_room = DecodeRoom(deployment.decode_instances)
        self.decodes = [
            DecodeInstance(i, hardware.decode, hardware.itl_slo_s, self.loop, self._decode_reserved, self._finished,
                           self.decode_room)
            for i in range(deployment.decode_instances)
        ]
        # The engine runs with priority scheduling on: equal priorities keep arrival order.
        for p in self.prefills:
            p.set_ordered(True)
        for d in self.decodes:
            d.set_ordered(True)
        self._calls: dict[int, EmulatedCall] = {}
        self._seq = 0
        self._prompt = [0] * len(self.prefills)
        self._cached = [0] * len(self.prefills)
        self._recent: list[deque[tuple[int, int]]] = [deque(maxlen=HIT_WINDOW_CALLS) for _ in self.prefills]
        self._in_transfer = [0] * len(self.decodes)
        self.generation_tokens_total = 0
        self.calls_finished = 0
        #: Decode memory lent as prefix cache: wired in at the first switch-on and kept (as the
        #: simulator wires it for the first policy that asks); off until then.
        self.lent_tier: LentTier | None = None
        self.lending_on = False
        self.lend_cap_fraction = LendingConfig().cap_fraction
        #: Each lent unit's prompt key and the prefill instance that cached it, by session uid.
        self._lent_keys: dict[int, tuple[list[Piece], int]] = {}

    # ------------------------------------------------------------------ time
    @property
    def now(self) -> float:
        return self.loop.now

    def advance(self, sim_s: float) -> None:
        """Run the model up to simulated time ``sim_s`` (never backwards)."""
        self.loop.run(max(sim_s, self.loop.now))

    @property
    def next_due_s(self) -> float | None:
        """When the model next has something to do (a driver sleeps until then)."""
        return self.loop.next_event_s

    # ----------------------------------------------------------------- calls
    def check_fits(self, call: ChatCall) -> None:
        """Refuse, as an engine does, a call that no instance could ever hold."""
        pool = min(p.cache.device_capacity for p in self.prefills)
        if call.prompt_tokens > pool:
            raise RequestError("messages", f"the prompt is about {call.prompt_tokens} tokens, more than the "
                               f"{pool}-token prefill pool of {self.deployment.name}; shorten the conversation")
        kv = min(d.capacity for d in self.decodes)
        need = call.prompt_tokens + call.output_tokens + self.hardware.decode.reserve_output_tokens
        if need > kv:
            room = kv - call.prompt_tokens - self.hardware.decode.reserve_output_tokens
            raise RequestError("max_tokens", f"prompt ({call.prompt_tokens}) plus output ({call.output_tokens}) "
                               f"exceeds the {kv}-token decode memory of {self.deployment.name}; "
                               f"ask for at most {max(room, 0)} tokens")

    def submit(self, call: ChatCall, queue_key: float, now_s: float) -> EmulatedCall:
        """Issue ``call`` at simulated time ``now_s``; ``queue_key`` orders it in the queues (lower first)."""
        self.check_fits(call)
        self.advance(now_s)
        now = self.loop.now
        self._seq += 1
        record = Session(session_id=f"call-{self._seq}",
                         calls=(Call(call.prompt_tokens, call.prompt_tokens, call.output_tokens),))
        state = SessionState(affinity_uid(call.affinity), record, "emulated", now, 0, None)
        key: list[Piece] = list(call.key)
        state.key = key
        if self.lent_tier is not None:
            self._drop_foreign_unit(state.uid, key)
        req = Request(state, 0, key, self._seq, now)
        req.prio = queue_key
        state.inflight = req
        handle = EmulatedCall(call, req, now)
        self._calls[req.seq] = handle
        prefill = choose_prefill(self.deployment.router, self.prefills, self.prefill_loads, req)
        state.last_prefill = prefill.index
        req.prefill = prefill
        decode = choose_decode(self.decode_room, self.decodes)
        req.decode = decode
        if self.reserve_at_completion:
            prefill.enqueue(req)
        else:
            decode.request_memory(req)
        return handle

    def withdraw(self, handle: EmulatedCall) -> bool:
        """Take back a call whose client left, if its prefill has not started
        (as the simulator withdraws a terminated session's call); a started
        call runs to its end. True when withdrawn."""
        req = handle.req
        if handle.started or handle.finished or handle.withdrawn:
            return False
        req.cancelled = True
        handle.withdrawn = True
        if req.prefill is not None and req.prefill.remove(req) and req.decode is not None:
            req.decode.release_reservation(req)
        self._calls.pop(req.seq, None)
        return True

    def generated(self, handle: EmulatedCall) -> int:
        """Output tokens produced so far (the first with the first token; the
        rest at the decode instance's current step cost, the last at the finish)."""
        if handle.finished:
            return handle.call.output_tokens
        if math.isnan(handle.first_token_s):
            return 0
        req = handle.req
        d = req.decode
        n = 1 + req.generated
        if d is not None and req in d.batch:
            n += d.step - req.join_step
            n += int(max(self.loop.now - d.epoch_t, 0.0) / self.step_s(handle))
        return min(n, handle.call.output_tokens - 1)

    def step_s(self, handle: EmulatedCall) -> float:
        """The current decode step time of the call's decode instance."""
        d = handle.req.decode
        if d is None:
            return self.hardware.decode.step_base_s
        return d.profile.step_s(max(len(d.batch), 1), d.ctx_sum) + d.step_extra_s

    # ------------------------------------------------ the call path (engine.py's)
    def _decode_reserved(self, req: Request) -> None:
        assert req.decode is not None
        if req.cancelled:
            req.decode.release_reservation(req)
            return
        if not math.isnan(req.prefill_end_s):
            # Prefill done (reservation at completion, or a retracted request resuming).
            self._transfer(req)
        else:
            assert req.prefill is not None
            req.prefill.enqueue(req)

    def _prefill_done(self, req: Request) -> None:
        assert req.prefill is not None and req.decode is not None
        i = req.prefill.index
        cached = req.prompt - req.uncached
        self._prompt[i] += req.prompt
        self._cached[i] += cached
        self._recent[i].append((req.prompt, cached))
        handle = self._calls.get(req.seq)
        if handle is not None:
            handle.cached_tokens = cached
        if not req.reserved:
            req.decode.request_memory(req)
        else:
            self._transfer(req)

    def _transfer(self, req: Request) -> None:
        assert req.decode is not None
        self._in_transfer[req.decode.index] += 1
        self.loop.at(self.loop.now + self.hardware.transfer_s, ENGINE, self._transferred, req)

    def _transferred(self, req: Request) -> None:
        assert req.decode is not None
        self._in_transfer[req.decode.index] -= 1
        now = self.loop.now
        if math.isnan(req.first_token_s):
            req.first_token_s = now
            assert req.prefill is not None
            req.prefill.release(req, now)
            handle = self._calls.get(req.seq)
            if handle is not None:
                handle.first_token_s = now
                if handle.listener is not None:
                    handle.listener(handle)
        req.decode.join(req)

    def _finished(self, req: Request) -> None:
        self.generation_tokens_total += req.output
        self.calls_finished += 1
        if self.lent_tier is not None:
            self._lend(req)
        handle = self._calls.pop(req.seq, None)
        if handle is not None:
            handle.finished_s = self.loop.now
            if handle.listener is not None:
                handle.listener(handle)

    # -------------------------------------------------------------- lending
    def lending(self, on: bool, cap_fraction: float | None = None) -> LendingState:
        """Lend idle decode memory as prefix cache from the next call's finish on, or stop, as the
        simulator's ``Simulator.lending`` does: switching off adopts no more units and reclaims below
        the margin; units already lent go when decode needs the memory or the session moves on.
        ``cap_fraction`` (phi) replaces the cap of lent memory, now and for later units."""
        if cap_fraction is not None:
            if not 0.0 < cap_fraction <= 1.0:
                raise ValueError(f"cap_fraction must be in (0, 1], got {cap_fraction!r}")
            self.lend_cap_fraction = cap_fraction
            if self.lent_tier is not None:
                config = dataclasses.replace(self.lent_tier.config, cap_fraction=cap_fraction)
                self.lent_tier.config = config
                for memory in self.lent_tier.memories:
                    memory.config = config
        if on and self.lent_tier is None:
            self._wire_lending()
        if self.lent_tier is not None:
            self.lending_on = on
            if not on:
                for d in self.decodes:
                    assert d.lending is not None
                    d.lending.maintain(d.free_beyond_demand(), self._prefill_holds)
        return self.lending_state()

    def lending_state(self) -> LendingState:
        return LendingState(on=self.lending_on, cap_fraction=self.lend_cap_fraction, lent_tokens=self.lent_tokens,
                            decode_kv_tokens=sum(d.capacity for d in self.decodes))

    @property
    def lent_tokens(self) -> int:
        return self.lent_tier.lent_tokens if self.lent_tier is not None else 0

    def _wire_lending(self) -> None:
        """Give each decode instance its lent memory and the prefill side the tier over them
        (``Simulator._apply_needs``)."""
        config = LendingConfig(cap_fraction=self.lend_cap_fraction)
        memories: list[LentMemory] = []
        for d in self.decodes:
            memories.append(d.lend(config))
            d.held_by_prefill = self._prefill_holds
        self.lent_tier = LentTier(memories, config)
        for p in self.prefills:
            p.lower_tiers.append(self.lent_tier)

    def _lend(self, req: Request) -> None:
        """After a call, its decode instance may keep the prompt as a unit (``Simulator._lend``; the
        emulator never knows a call is its session's last, so any call may leave one)."""
        tier, d = self.lent_tier, req.decode
        assert tier is not None and d is not None and d.lending is not None and req.prefill is not None
        uid = req.session.uid
        if self.lending_on and not d.waiting and d.lending.adopt(uid, req.prompt, d.free_beyond_demand()):
            tier.record(uid, d.index)
            self._lent_keys[uid] = (req.key, req.prefill.index)
        else:
            tier.forget(uid)
            self._lent_keys.pop(uid, None)
        d.lending.maintain(d.free_beyond_demand(), self._prefill_holds)
        units = sum(len(m.units) for m in tier.memories)
        if len(self._lent_keys) > 2 * units + 64:
            # Units reclaimed under memory pressure leave their index entries behind: sweep them.
            for gone in [u for u in self._lent_keys if not tier.covered_tokens(u, 0)]:
                tier.forget(gone)
                del self._lent_keys[gone]

    def _drop_foreign_unit(self, uid: int, key: list[Piece]) -> None:
        """A unit is fetched by session alone, since a simulated session's prompts only grow. Here a
        session's next call may not extend its last prompt (an edited message, or two conversations
        under one routing key): such a unit could not serve it, and is dropped rather than counted."""
        held = self._lent_keys.get(uid)
        if held is not None and key[:len(held[0])] != held[0]:
            assert self.lent_tier is not None
            self.lent_tier.forget(uid)
            del self._lent_keys[uid]

    def _prefill_holds(self, uid: int, tokens: int) -> bool:
        """Whether the unit's prompt is still in its prefill cache (such units are reclaimed first)."""
        held = self._lent_keys.get(uid)
        return held is not None and self.prefills[held[1]].cache.peek(held[0]) >= tokens

    # --------------------------------------------------------------- figures
    def prefill_figures(self) -> list[PrefillFigures]:
        out = []
        for p in self.prefills:
            c = p.cache
            recent = self._recent[p.index]
            asked = sum(n for n, _ in recent)
            out.append(PrefillFigures(
                index=p.index, queue_requests=len(p.queue), running_requests=len(p.running),
                pool_tokens=c.device_capacity,
                pool_used_fraction=min(1.0, (c.device_used + c.inflight) / c.device_capacity),
                host_tokens=c.host_capacity, prompt_tokens_total=self._prompt[p.index],
                cached_tokens_total=self._cached[p.index],
                recent_hit_rate=sum(k for _, k in recent) / asked if asked else 0.0))
        return out

    def decode_figures(self) -> list[DecodeFigures]:
        return [
            DecodeFigures(
                index=d.index, running_requests=len(d.batch), joining_requests=len(d.pending),
                memory_wait_requests=d.live_waiting(),
                transfer_requests=self._in_transfer[d.index], kv_tokens=d.capacity,
                kv_used_fraction=min(1.0, d.used / d.capacity), lent_tokens=d.lent)
            for d in self.decodes
        ]

    @property
    def calls_in_flight(self) -> int:
        return len(self._calls)
