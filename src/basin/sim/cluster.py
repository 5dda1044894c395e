"""The engine core: one deployment's instances on one event loop, taking
calls from outside.

A :class:`Cluster` is built from a hardware profile and a topology. The
topology today is :class:`PDTopology` (prefill and decode disaggregated,
xPyD): prefill instances over radix caches with their host tier, decode
instances, the routers, the PD transfer, and, when asked for, decode memory
lent as cache (:mod:`basin.sim.lending`) and prefill borrowed by decode
instances (:mod:`basin.sim.borrow`). Its owner submits calls
(:meth:`Cluster.submit`), may withdraw one that has not started
(:meth:`Cluster.withdraw`), reads figures, and hears of each call twice:
its first token and its finish. The simulator (closed-loop clients under a
policy, :mod:`basin.sim.engine`) and the emulator (HTTP calls,
:mod:`basin.emulate.engine`) are two owners of the same core.

The path of a call: route to a prefill and a decode instance, reserve decode
memory (before prefill, SGLang's order, or at prefill completion), prefill
against the cache, pay the PD transfer, cache the prompt, decode. It is
written once, here.

References point one way. A request names its session by an int and its
instances by index; instances report to the core through the handlers it
gave them; the core reports to its owner through the two callbacks; nothing
refers to the owner otherwise. :meth:`Cluster.stop` (the end of a run) drops
the pending work and lets go of those handlers (and of the ones each object
bound to itself once, to save a bound method per event); what is left holds
no cycle but the loop's few timers: a finished run is freed by reference
counting.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from basin.catalog import CacheCapacity, Deployment, HardwareProfile, cache_capacity
from basin.policy.base import EngineFigures
from basin.sim.borrow import Borrowing, attach_borrowing
from basin.sim.cache import MatchResult, RadixCache
from basin.sim.core import EngineCore, stopped
from basin.sim.decode import DecodeInstance, DecodeRoom
from basin.sim.events import ENGINE
from basin.sim.invariants import InvariantViolation
from basin.sim.lending import LendingConfig, LentMemory, LentTier
from basin.sim.prefill import PrefillInstance
from basin.sim.requests import CallListener, Piece, Request, Route
from basin.sim.router import choose_decode, choose_prefill


@dataclass(frozen=True, slots=True)
class PDTopology:
    """Prefill and decode disaggregated (xPyD): ``prefill_instances``
    instances that prefill against their own prefix cache, and
    ``decode_instances`` that decode, joined by a KV transfer; a call is
    routed to one of each by ``router`` (prefill) and by free memory
    (decode)."""

    prefill_instances: int
    decode_instances: int
    router: str
    #: The prefix caches' capacity (per instance and in all).
    cache: CacheCapacity

    @classmethod
    def of(cls, deployment: Deployment, hardware: HardwareProfile) -> PDTopology:
        return cls(deployment.prefill_instances, deployment.decode_instances, deployment.router,
                   cache_capacity(deployment, hardware))


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
    #: Cached share of the prompt tokens of its last calls (the core's
    #: ``hit_window_calls``; 0 before any, or when none are kept).
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


class _LendFirst(CallListener):
    """What a decode instance's finishes go to while lending is wired in:
    the core, which may keep the prompt as a lent unit before its owner
    hears (let go by the instance's detach)."""

    def __init__(self, core: Cluster) -> None:
        self.core = core

    def finished(self, req: Request) -> None:
        self.core._lent_finish(req)


class Cluster(EngineCore):
    """The engine core of one deployment (see the module's docstring)."""

    def __init__(self, hardware: HardwareProfile, topology: PDTopology, listener: CallListener, *,
                 borrowing: Mapping[str, Any] | None = None, reserve_at_prefill_completion: bool = False,
                 hit_window_calls: int = 0):
        """``borrowing``: decode instances run prefill chunks under an ITL
        lease (Crossflow; its parameters, :class:`basin.sim.borrow.BorrowConfig`),
        wired in now or never. ``hit_window_calls``: keep each prefill
        instance's last calls for :attr:`PrefillFigures.recent_hit_rate` (0:
        none kept, the rate reads 0)."""
        cap = topology.cache
        pre = hardware.prefill
        super().__init__(hardware, [
            RadixCache(cap.gpu_tokens_per_instance, cap.host_tokens_per_instance, hardware.page_tokens,
                       pre.state_slots, pre.load_threshold_tokens)
            for _ in range(topology.prefill_instances)
        ], listener, hit_window_calls)
        self.topology = topology
        #: What the routers read of each instance (PrefillInstance.loads, DecodeRoom).
        self.prefill_loads = [0] * topology.prefill_instances
        self.prefills = [PrefillInstance(i, pre, cache, self.loop, self._prefill_done, self.prefill_loads)
                         for i, cache in enumerate(self.caches)]
        self.decode_room = DecodeRoom(topology.decode_instances)
        # A finish goes straight to the owner until lending is wired in
        # (wire_lending puts the core's own handler in between).
        self.decodes = [
            DecodeInstance(i, hardware.decode, hardware.itl_slo_s, self.loop, self._decode_reserved,
                           listener, self.decode_room)
            for i in range(topology.decode_instances)
        ]
        self.borrowing: Borrowing | None = None
        if borrowing is not None:
            self.borrowing = attach_borrowing(self.decodes, self.prefills, pre, hardware.itl_slo_s, self.loop,
                                              borrowing)
        self.reserve_at_completion = reserve_at_prefill_completion
        #: Decode memory lent as prefix cache: wired in at the first call of
        #: :meth:`wire_lending` and kept; lending itself follows :meth:`set_lending`.
        self.lent_tier: LentTier | None = None
        self.lending_on = False
        self.lend_cap_fraction = LendingConfig().cap_fraction
        #: The route of each session holding a lent unit (as of the call that left it).
        self._unit_routes: dict[int, Route] = {}
        self._sweep_at = 64
        # Read on every call: the (interpreted) profile's and topology's
        # fields held as the core's own.
        self._transfer_s: float = hardware.transfer_s
        self._router: str = topology.router
        #: Bound once (see PrefillInstance); let go by :meth:`stop`.
        self._transferred_handler: Callable[[Request], None] = self._transferred
        self._prefill_holds_handler: Callable[[int, int], bool] = self._prefill_holds
        #: Cumulative prompt tokens prefilled, by how they were served (a
        #: recorder takes differences; each instance keeps its own as well).
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.loaded_tokens_total = 0
        self.uncached_tokens_total = 0

    def _let_go(self) -> None:
        self.decode_room.best()  # its stale list emptied: the room keeps no instance
        for p in self.prefills:
            p.detach(stopped)
        for d in self.decodes:
            d.detach(stopped)
        self._transferred_handler = stopped
        self._prefill_holds_handler = stopped

    # ----------------------------------------------------------------- calls
    def submit(self, session: int, key: list[Piece], prompt_tokens: int, new_tokens: int, output_tokens: int,
               priority: float | None, *, route: Route | None = None, call_index: int = 0) -> Request:
        """Issue a call of session ``session`` now: its prompt's cache key
        and token counts; ``priority`` orders it in ordered queues (lower
        first). ``route`` is what the engine keeps of the session between
        calls (a fresh one when not given: the call is on its own)."""
        req = self._request(session, key, prompt_tokens, new_tokens, output_tokens, priority, route, call_index)
        r = req.route
        prefill = choose_prefill(self._router, self.prefills, self.prefill_loads, req)
        index = prefill.index
        r.last_prefill = index
        r.placed_on |= 1 << index
        req.prefill = index
        decode = choose_decode(self.decode_room, self.decodes)
        req.decode = decode.index
        if self.reserve_at_completion:
            prefill.enqueue(req)
        else:
            decode.request_memory(req)
        return req

    def withdraw(self, req: Request) -> bool:
        """Take back a call whose prefill has not started (its client left,
        its session ended); a started call runs to its end. True when withdrawn."""
        if req.cancelled or not math.isnan(req.prefill_start_s):
            return False
        req.cancelled = True
        if self.prefills[req.prefill].remove(req):
            self.decodes[req.decode].release_reservation(req)
        return True

    def set_ordered(self, on: bool) -> None:
        """Order every queue by the calls' priorities (on) or first-come (off)."""
        for p in self.prefills:
            p.set_ordered(on)
        for d in self.decodes:
            d.set_ordered(on)

    # ------------------------------------------------------------ TTL pins
    def unpin(self, prefill: int, pin: MatchResult) -> None:
        instance = self.prefills[prefill]
        instance.cache.unlock(pin)
        instance.kick()

    # ============================================================ call path
    def _decode_reserved(self, req: Request) -> None:
        if req.cancelled:
            self.decodes[req.decode].release_reservation(req)
            return
        if not math.isnan(req.prefill_end_s):
            # Prefill already done (reservation at completion, or a retracted
            # request resuming): transfer its KV now.
            self.decodes[req.decode].transfers_in += 1
            self.loop.at(self.loop.now + self._transfer_s, ENGINE, self._transferred_handler, req)
        else:
            self.prefills[req.prefill].enqueue(req)
            if self.borrowing is not None:
                self.borrowing.queued(req)

    def _prefill_done(self, req: Request) -> None:
        hit = req.cached + req.loaded
        self.prompt_tokens_total += req.prompt
        self.cached_tokens_total += req.cached
        self.loaded_tokens_total += req.loaded
        self.uncached_tokens_total += req.uncached
        prefill = self.prefills[req.prefill]
        prefill.prompt_tokens_total += req.prompt
        prefill.hit_tokens_total += hit
        self._note_hit(req.prefill, req.prompt, hit)
        decode = self.decodes[req.decode]
        if not req.reserved:
            # Issued while decode memory is reserved at prefill completion
            # (the mode may have changed since).
            decode.request_memory(req)
        else:
            # Its KV goes to decode (the PD transfer, a fixed charge).
            decode.transfers_in += 1
            self.loop.at(self.loop.now + self._transfer_s, ENGINE, self._transferred_handler, req)

    def _transferred(self, req: Request) -> None:
        decode = self.decodes[req.decode]
        decode.transfers_in -= 1
        now = self.loop.now
        if math.isnan(req.first_token_s):
            req.first_token_s = now
            self.prefills[req.prefill].release(req, now)
            self.listener.first_token(req)
        decode.join(req)

    def _lent_finish(self, req: Request) -> None:
        """A finish while lending is wired in: the prompt may be lent first."""
        self._lend(req)
        self.listener.finished(req)

    # -------------------------------------------------------------- lending
    def wire_lending(self, cap_fraction: float) -> None:
        """Give each decode instance lent memory (at most ``cap_fraction`` of
        its KV) and the prefill instances the tier over them; once."""
        if self.lent_tier is not None:
            return
        self.lend_cap_fraction = cap_fraction
        config = LendingConfig(cap_fraction=cap_fraction)
        memories: list[LentMemory] = []
        finishes = _LendFirst(self)
        for d in self.decodes:
            memories.append(d.lend(config))
            d.held_by_prefill = self._prefill_holds_handler
            d.listener = finishes
        self.lent_tier = LentTier(memories, config)
        for p in self.prefills:
            p.lower_tiers.append(self.lent_tier)

    def set_lending(self, on: bool) -> None:
        """Lend from the next call's finish on, or stop: switching off adopts
        no more units and reclaims below the margin; units already lent go
        when decode needs the memory or their session moves on."""
        if self.lent_tier is None:
            return
        self.lending_on = on
        if not on:
            for d in self.decodes:
                if d.lending is not None:
                    d.lending.maintain(d.free_beyond_demand(), self._prefill_holds_handler)

    def set_lend_cap(self, cap_fraction: float) -> None:
        """Replace the cap of lent memory (phi), now and for later units."""
        self.lend_cap_fraction = cap_fraction
        if self.lent_tier is not None:
            config = dataclasses.replace(self.lent_tier.config, cap_fraction=cap_fraction)
            self.lent_tier.config = config
            for memory in self.lent_tier.memories:
                memory.config = config

    @property
    def lent_tokens(self) -> int:
        return self.lent_tier.lent_tokens if self.lent_tier is not None else 0

    def _lend(self, req: Request) -> None:
        """After a call, its decode instance may keep the prompt as a unit
        for the session's next call (none follows a call marked ``last``)."""
        tier = self.lent_tier
        d = self.decodes[req.decode]
        if tier is None or d.lending is None:
            raise InvariantViolation("LENDING-WIRED", f"decode instance {d.index} lends without a lent tier")
        uid = req.session
        if (not req.last and self.lending_on and not d.waiting
                and d.lending.adopt(uid, req.prompt, d.free_beyond_demand())):
            tier.record(uid, d.index)
            self._unit_routes[uid] = req.route
        else:
            tier.forget(uid)
            self._unit_routes.pop(uid, None)
        d.lending.maintain(d.free_beyond_demand(), self._prefill_holds_handler)
        if len(self._unit_routes) >= self._sweep_at:
            # Units reclaimed under memory pressure leave their entries behind: sweep them.
            for gone in [u for u in self._unit_routes if not tier.covered_tokens(u, 0)]:
                tier.forget(gone)
                del self._unit_routes[gone]
            self._sweep_at = 2 * len(self._unit_routes) + 64

    def drop_unit_unless_extended(self, uid: int, key: list[Piece]) -> None:
        """Drop the session's unit unless ``key`` extends the prompt it
        holds: units are fetched by session alone, which is exact while a
        session's prompts only grow (a simulated one's do; an edited message,
        or two conversations under one routing key, break it)."""
        route = self._unit_routes.get(uid)
        if route is not None and self.lent_tier is not None and key[:len(route.key)] != route.key:
            self.lent_tier.forget(uid)
            del self._unit_routes[uid]

    def _prefill_holds(self, uid: int, tokens: int) -> bool:
        """Whether the session's unit is still in its prefill cache (such units are reclaimed first)."""
        route = self._unit_routes.get(uid)
        if route is None or route.last_prefill < 0 or not route.key:
            return False
        cache = self.prefills[route.last_prefill].cache
        return cache.peek(route.key, route.cursor_on(cache)) >= tokens

    # =============================================================== figures
    def prefill_totals(self) -> tuple[int, int, int, int]:
        """Prompt tokens prefilled so far: all, cached on the device, loaded back, computed."""
        return (self.prompt_tokens_total, self.cached_tokens_total, self.loaded_tokens_total,
                self.uncached_tokens_total)

    def engine_figures(self, hit_rate: float) -> EngineFigures:
        """What a policy driver sees of the engine (``hit_rate``: the owner's recent measure)."""
        cache = self.topology.cache
        decode_cap = sum(d.capacity for d in self.decodes)
        return EngineFigures(
            hit_rate=hit_rate,
            prefill_queue_requests=sum(len(p.queue) for p in self.prefills),
            prefill_backlog_tokens=sum(p.backlog_tokens for p in self.prefills),
            decode_wait_requests=sum(d.waiting for d in self.decodes),
            decode_used_fraction=sum(d.used for d in self.decodes) / decode_cap,
            gpu_cache_tokens=cache.gpu_tokens,
            host_cache_tokens=cache.host_tokens,
            effective_cache_tokens=cache.effective_tokens,
            lent_cache_tokens=self.lent_tokens,
            decode_kv_tokens=decode_cap,
        )

    def gauges(self) -> dict[str, float]:
        """The engine's gauges a run samples each minute."""
        cache = self.topology.cache
        return {
            "cache_capacity_tokens": cache.gpu_tokens,
            "host_capacity_tokens": cache.host_tokens,
            "decode_kv_decoding_tokens": sum(d.decoding_tokens for d in self.decodes),
            "decode_kv_reserved_idle_tokens": sum(d.reserved_idle for d in self.decodes),
            "decode_kv_capacity_tokens": sum(d.capacity for d in self.decodes),
            "decode_kv_lent_tokens": self.lent_tokens,
            "prefill_queue_len": sum(len(p.queue) for p in self.prefills),
            "decode_wait_len": sum(d.waiting for d in self.decodes),
            "decode_running": sum(len(d.batch) for d in self.decodes),
        }

    @property
    def smallest_pool_tokens(self) -> int:
        """The smallest prefill pool: a prompt beyond it never runs."""
        return min(p.cache.device_capacity for p in self.prefills)

    @property
    def smallest_kv_tokens(self) -> int:
        """The smallest decode memory: a call needing more never decodes."""
        return min(d.capacity for d in self.decodes)

    @property
    def decode_kv_tokens(self) -> int:
        return sum(d.capacity for d in self.decodes)

    def prefill_figures(self) -> list[PrefillFigures]:
        out = []
        for p in self.prefills:
            c = p.cache
            out.append(PrefillFigures(
                index=p.index, queue_requests=len(p.queue), running_requests=len(p.running),
                pool_tokens=c.device_capacity,
                pool_used_fraction=min(1.0, (c.device_used + c.inflight) / c.device_capacity),
                host_tokens=c.host_capacity, prompt_tokens_total=p.prompt_tokens_total,
                cached_tokens_total=p.hit_tokens_total,
                recent_hit_rate=self.recent_hit_rate(p.index)))
        return out

    def decode_figures(self) -> list[DecodeFigures]:
        return [
            DecodeFigures(
                index=d.index, running_requests=len(d.batch), joining_requests=len(d.pending),
                memory_wait_requests=d.live_waiting(),
                transfer_requests=d.transfers_in, kv_tokens=d.capacity,
                kv_used_fraction=min(1.0, d.used / d.capacity), lent_tokens=d.lent)
            for d in self.decodes
        ]

    def generated_tokens(self, req: Request) -> int:
        """Output tokens a call has produced by now: none before its first
        token, then one a decode step (at the instance's current step cost),
        the last at its finish."""
        if not math.isnan(req.finished_s):
            return req.output
        if math.isnan(req.first_token_s):
            return 0
        d = self.decodes[req.decode]
        n = 1 + req.generated
        if req in d.batch:
            n += d.step - req.join_step
            n += int(max(self.loop.now - d.epoch_t, 0.0) / self.step_s(req))
        return min(n, req.output - 1)

    def step_s(self, req: Request) -> float:
        """The current decode step time of the call's decode instance."""
        if req.decode < 0:
            return self.hardware.decode.step_base_s
        d = self.decodes[req.decode]
        return d.profile.step_s(max(len(d.batch), 1), d.ctx_sum) + d.step_extra_s
