"""A colocated engine instance: one server whose chunked prefill and decode
share each step's token budget, and whose one KV pool holds both the
running requests and the prefix cache (a single vLLM or llama.cpp server,
as most deployments run; the PD instances are :mod:`basin.sim.prefill` and
:mod:`basin.sim.decode`).

The rules, read from vLLM 0.32's V1 scheduler (``v1/core/sched/scheduler.py``)
and KV cache manager (``v1/core/kv_cache_manager.py``, ``block_pool.py``);
docs/colocated.md gives the references:

C1 *Pool.* The pool (``pool_tokens`` in pages of ``page_tokens``) holds the
   cached prefixes and the running requests' KV. A cached prefix no running
   request uses is evictable, least recently used first: the device tier of
   a :class:`~basin.sim.cache.RadixCache` without a host tier. A running
   request's KV always wins over a cached prefix.
C2 *Step.* A step first schedules the running requests in the order they
   were admitted (a decoding one takes one token, one part-way through its
   prefill its next chunk) out of one token budget (``chunk_tokens``), then
   admits waiting requests in queue order while budget is left and fewer
   than ``max_running`` run. The next step starts when this one ends.
C3 *Admission.* A waiting request is matched against the cache (whole
   pages, at most ``(prompt - 1) // page`` of them: its last token is always
   computed), its match locked, and pool space for the rest of its prompt
   (and any output it had generated before a preemption) allocated at once;
   when the pool cannot give it, even by evicting every unlocked cached
   page, scanning stops there (head-of-line blocking). Nothing is admitted
   in a step that preempted.
C4 *Growth.* A decoding request takes one more page of the pool whenever
   its generated tokens fill what it holds: vLLM allocates per step for the
   tokens it schedules and reserves no output ahead.
C5 *Preemption.* When that page cannot be had, the running request admitted
   last (first-come order) or the one with the largest priority value, the
   latest on a tie (priority order), is preempted by recompute: its
   computed prompt stays cached (vLLM's full blocks keep their hashes), its
   pool space and lock are given back, and it waits again, at the queue's
   front in first-come order or at its own place in priority order. It
   keeps its generated tokens and recomputes them with its prompt when
   readmitted. A running request is never preempted for a waiting one.
C6 *Cache insertion and finish.* A request's prompt is cached when its
   prefill completes (its first token), and stays locked while it decodes;
   at the end of the step that produced its last token its lock and output
   pages are given back. Its output is not cached: the session's next
   prompt holds it as new tokens (a few hundred beside tens of thousands).
C7 *Step time.* ``decode.step_s(decoding requests, their contexts)`` when the
   step decodes, else the prefill profile's step overhead; plus each prefill
   chunk's ``prefill.tokens_cost_s(chunk, position)``.
C8 *Order.* First-come by default; with ordering on, by priority (lower
   first, vLLM's ``--scheduling-policy priority``), then arrival.

Hit rates count a request's first admission only (vLLM's exported prefix
counters leave out the recomputation after a preemption).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

from basin.catalog import DecodeProfile, Deployment, HardwareProfile, PrefillProfile
from basin.errors import BasinInputError
from basin.policy.base import EngineFigures
from basin.sim.cache import MatchResult, RadixCache
from basin.sim.cluster import DecodeFigures, PrefillFigures
from basin.sim.core import EngineCore, stopped
from basin.sim.costs import DecodeCosts, PrefillCosts
from basin.sim.events import ENGINE, EventLoop
from basin.sim.invariants import InvariantViolation, RequestNeverFits, require
from basin.sim.requests import Callbacks, CallListener, Piece, Queued, Request, Route, queue_key

#: What one step does: the requests that decode a token, and the prefill
#: chunks ``(request, tokens)``.
Plan = tuple[list[Request], list[tuple[Request, int]]]


class ColocatedInstance:
    """One colocated server (see the module's docstring for its rules)."""

    def __init__(self, index: int, prefill: PrefillProfile, decode: DecodeProfile, cache: RadixCache,
                 loop: EventLoop, listener: CallListener, *, max_running: int | None = None,
                 itl_slo_s: float = math.inf):
        if cache.host_capacity:
            raise ValueError("a colocated instance's pool has no host tier")
        self.index = index
        self.cache = cache
        self.loop = loop
        #: Hears of each call's first token and finish.
        self.listener = listener
        self.prefill_costs = PrefillCosts(prefill)
        self.decode_costs = DecodeCosts(decode)
        self.chunk_tokens: int = prefill.chunk_tokens
        self.step_overhead_s: float = prefill.step_overhead_s
        self.frontend_s_per_prompt_token: float = prefill.frontend_s_per_prompt_token
        #: Front-end time of calls submitted since the last step began, owed by the next one.
        self.frontend_owed_s = 0.0
        self.page: int = cache.page
        self.max_running: int = max_running if max_running is not None else decode.max_running_requests
        self.queue: list[Queued] = []
        #: Running requests in the order they were admitted (C2, C5).
        self.running: list[Request] = []
        self.ordered = False
        self.busy = False
        #: Preempted requests put back in first-come order go before every
        #: other waiting one, the latest first (vLLM prepends them).
        self._front = 0.0
        self._end_step_handler: Callable[[Plan], None] = self._end_step
        #: Prompt tokens of first admissions, and those of them found cached.
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.preemptions = 0
        #: A decode step longer than this counts as an ITL violation for each request it decodes.
        self.itl_slo_s = itl_slo_s
        self.last_step_s = 0.0

    def detach(self, handler: Callable[..., None]) -> None:
        """Let go of the listener and of the handler bound to itself
        (``handler`` replaces both): the end of a run, after which nothing
        may be due here."""
        self.listener = Callbacks(handler, handler)
        self._end_step_handler = handler

    # ----------------------------------------------------------------- calls
    def submit(self, req: Request) -> None:
        """Queue a call; it is scheduled at the next step (now, when idle)."""
        if req.prompt + 1 > self.cache.device_capacity:
            raise RequestNeverFits(
                "LIVE-COLOCATED-FITS",
                f"instance {self.index}: a prompt of {req.prompt} tokens (session {req.session}, call "
                f"{req.call_index}) and its first output token exceed the {self.cache.device_capacity}-token pool")
        req.prefill = req.decode = self.index
        if self.frontend_s_per_prompt_token > 0.0:
            self.frontend_owed_s += req.prompt * self.frontend_s_per_prompt_token
        heappush(self.queue, Queued(queue_key(req, self.ordered), req))
        if not self.busy:
            self._start_step()

    def withdraw(self, req: Request) -> bool:
        """Take back a call that is waiting (not a preempted one that has run)."""
        for i, entry in enumerate(self.queue):
            if entry.req is req and math.isnan(req.prefill_start_s):
                self.queue[i] = self.queue[-1]
                self.queue.pop()
                heapify(self.queue)
                req.cancelled = True
                return True
        return False

    def kick(self) -> None:
        """Pool space was freed outside a step (a pin let go): schedule if idle."""
        if not self.busy:
            self._start_step()

    def set_ordered(self, ordered: bool) -> None:
        if ordered == self.ordered:
            return
        self.ordered = ordered
        self.queue = [Queued(self._wait_key(e.req), e.req) for e in self.queue]
        heapify(self.queue)

    def _wait_key(self, req: Request) -> float:
        return queue_key(req, self.ordered)

    # ----------------------------------------------------------------- steps
    def _start_step(self) -> None:
        now = self.loop.now
        budget = self.chunk_tokens
        decoding: list[Request] = []
        chunks: list[tuple[Request, int]] = []
        preempted = False
        for req in list(self.running):
            # Preempted earlier in this step. (Read into a name: a narrowed
            # ``req.match`` would stay narrowed past ``_grow`` below, which
            # may clear it, and the compiled build checks narrowed reads.)
            held = req.match
            if held is None:
                continue
            if budget <= 0:
                break
            if req.remaining > 0:
                take = min(req.remaining, budget)
                chunks.append((req, take))
                budget -= take
                continue
            if req.generated >= req.reserved and not self._grow(req, decoding, chunks):
                preempted = True
                if req.match is None:
                    continue
            decoding.append(req)
            budget -= 1
        if preempted:
            budget = self.chunk_tokens - len(decoding) - sum(t for _, t in chunks)
        while not preempted and budget > 0 and self.queue and len(self.running) < self.max_running:
            req = self.queue[0].req
            if not self._admit(req, now):
                break
            heappop(self.queue)
            self.running.append(req)
            take = min(req.remaining, budget)
            chunks.append((req, take))
            budget -= take
        if not decoding and not chunks:
            self.busy = False
            if self.queue and not self.running:
                self._refuse_head_that_never_fits()
            return
        step_s = self.decode_costs.step_s(len(decoding), sum(r.prompt + r.generated for r in decoding)) \
            if decoding else self.step_overhead_s
        for req, take in chunks:
            step_s += self.prefill_costs.tokens_cost_s(take, req.position)
        if self.frontend_owed_s > 0.0:
            step_s += self.frontend_owed_s
            self.frontend_owed_s = 0.0
        self.busy = True
        self.last_step_s = step_s
        if step_s > self.itl_slo_s:
            for req in decoding:
                req.itl_violations += 1
        self.loop.at(now + step_s, ENGINE, self._end_step_handler, (decoding, chunks))

    def _admit(self, req: Request, now: float) -> bool:
        """C3: match, lock, allocate the rest at once, or leave it waiting."""
        cache = self.cache
        # At most the prompt's whole pages before its last token; a cursor
        # from a walk past that (the prompt cached before a preemption) is not used.
        cursor = req.route.cursor_for(req.key, cache)
        if cursor is not None and cursor.tokens > req.prompt - 1:
            cursor = None
        m = cache.match(req.key, now, cursor, req.prompt - 1)
        cache.lock(m)
        cached = m.device_tokens
        need = req.prompt - cached + req.generated
        if not cache.allocate(need):
            cache.unlock(m)
            return False
        req.match = m
        req.alloc = need
        req.remaining = need
        req.position = cached
        req.reserved = req.generated
        if math.isnan(req.prefill_start_s):
            req.prefill_start_s = now
            req.cached = cached
            req.uncached = req.prompt - cached
            self.prompt_tokens_total += req.prompt
            self.cached_tokens_total += cached
        return True

    def _grow(self, req: Request, decoding: list[Request], chunks: list[tuple[Request, int]]) -> bool:
        """C4/C5: a page for ``req``'s next tokens, preempting until there is
        one. False when something was preempted (``req`` itself perhaps)."""
        grew = True
        while not self.cache.allocate(self.page):
            victim = self._victim()
            if victim is req and len(self.running) == 1:
                raise RequestNeverFits(
                    "LIVE-COLOCATED-FITS",
                    f"instance {self.index}: session {req.session} call {req.call_index} holds "
                    f"{req.prompt + req.generated} tokens and needs a page more than the "
                    f"{self.cache.device_capacity}-token pool has")
            self._preempt(victim, decoding, chunks)
            grew = False
            if victim is req:
                return False
        req.alloc += self.page
        req.reserved += self.page
        return grew

    def _victim(self) -> Request:
        if not self.ordered:
            return self.running[-1]
        return max(self.running, key=lambda r: (r.prio if r.prio is not None else math.inf, r.seq))

    def _preempt(self, victim: Request, decoding: list[Request], chunks: list[tuple[Request, int]]) -> None:
        """C5: give back the victim's pool space and lock, its computed
        prompt cached, and put it back in the queue."""
        if victim in decoding:
            decoding.remove(victim)
        for j, (r, _) in enumerate(chunks):
            if r is victim:
                del chunks[j]
                break
        now = self.loop.now
        m = victim.match
        assert m is not None  # a running request holds its match
        if victim.remaining > 0:
            # Still in its prefill: what it computed of its prompt goes into the cache now.
            computed = min(victim.position, victim.prompt)
            cursor = self.cache.insert(victim.key, now, victim.alloc, m, computed)
            if victim.route.key is victim.key:
                victim.route.keep_cursor(self.cache, cursor)
        else:
            self.cache.release(victim.alloc)
        self.cache.unlock(m)
        victim.match = None
        victim.alloc = victim.reserved = victim.remaining = victim.position = 0
        victim.retractions += 1
        self.preemptions += 1
        self.running.remove(victim)
        if self.ordered:
            key = self._wait_key(victim)
        else:
            self._front -= 1.0
            key = -1e18 + self._front
        heappush(self.queue, Queued(key, victim))

    def _end_step(self, plan: Plan) -> None:
        now = self.loop.now
        decoding, chunks = plan
        done: list[Request] = []
        for req in decoding:
            req.generated += 1
            if req.generated >= req.output:
                done.append(req)
        for req, take in chunks:
            req.remaining -= take
            req.position += take
            if req.remaining > 0:
                continue
            self._prompt_cached(req, now)
            if math.isnan(req.prefill_end_s):
                req.prefill_end_s = now
                req.generated = 1
                req.first_token_s = now
                self.listener.first_token(req)
                if req.output <= 1:
                    done.append(req)
        for req in done:
            self._finish(req, now)
        self._start_step()

    def _prompt_cached(self, req: Request, now: float) -> None:
        """C6: the prompt enters the cache at the end of its prefill; the
        request keeps it locked while it decodes, and holds its last partial
        page and the output pages it had as its own allocation."""
        cache = self.cache
        m = req.match
        assert m is not None  # a running request holds its match
        cursor = cache.insert(req.key, now, req.alloc - req.reserved, m, req.prompt)
        if req.route.key is req.key:
            req.route.keep_cursor(cache, cursor)
        whole = cache.match(req.key, now, req.route.cursor_for(req.key, cache), req.prompt)
        cache.lock(whole)
        cache.unlock(m)
        req.match = whole
        # The insert cached whole pages only and gave back the rest; the
        # request still holds its partial last page.
        tail = req.prompt - whole.device_tokens
        if not cache.allocate(tail):
            raise InvariantViolation("INFLIGHT", f"instance {self.index}: the {tail}-token tail just "
                                     "given back could not be taken again")
        req.alloc = req.reserved + tail

    def _finish(self, req: Request, now: float) -> None:
        m = req.match
        assert m is not None
        self.cache.release(req.alloc)
        self.cache.unlock(m)
        req.match = None
        req.alloc = req.reserved = 0
        req.finished_s = now
        self.running.remove(req)
        self.listener.finished(req)

    def _refuse_head_that_never_fits(self) -> None:
        """Nothing runs and the head cannot be admitted: every unlocked page
        was evictable, so it never will be (pins aside)."""
        req = self.queue[0].req
        if self.cache.lock_handles == 0:
            raise RequestNeverFits(
                "LIVE-COLOCATED-FITS",
                f"instance {self.index}: session {req.session} call {req.call_index} needs "
                f"{req.prompt + req.generated} tokens, more than the {self.cache.device_capacity}-token pool")

    # --------------------------------------------------------------- figures
    @property
    def backlog_tokens(self) -> int:
        """Prompt tokens waiting or still to prefill."""
        return sum(e.req.prompt for e in self.queue) + sum(r.remaining for r in self.running)

    @property
    def held_tokens(self) -> int:
        """Pool tokens the running requests hold (vLLM's KV use: not the idle cached prefixes)."""
        return self.cache.inflight + sum(self.cache.locked_device_tokens(r.match)
                                         for r in self.running if r.match is not None)

    def check(self) -> None:
        """The instance's invariants (tests and the engine's invariant runs)."""
        require(len(self.running) <= self.max_running, "COLOCATED-RUNNING",
                f"instance {self.index}: {len(self.running)} running, at most {self.max_running}")
        require(self.cache.lock_handles == len(self.running), "LOCK-BALANCE",
                f"instance {self.index}: {self.cache.lock_handles} locks for {len(self.running)} running requests")
        inflight = sum(r.alloc for r in self.running)
        if inflight != self.cache.inflight:
            raise InvariantViolation("INFLIGHT", f"instance {self.index}: requests hold {inflight} in-flight "
                                     f"tokens, the pool counts {self.cache.inflight}")
        self.cache.check()


# ============================================================================
# the engine core of a colocated deployment


@dataclass(frozen=True, slots=True)
class ColocatedTopology:
    """``instances`` colocated servers, each with one KV pool of
    ``pool_tokens`` (the prefix cache a server has when nothing runs); a call
    goes to its session's server, a session's first call to the least loaded."""

    instances: int
    pool_tokens: int

    @classmethod
    def of(cls, deployment: Deployment, hardware: HardwareProfile) -> ColocatedTopology:
        return cls(deployment.prefill_instances, hardware.prefill.prefix_cache_tokens)


class _HitFirst(CallListener):
    """What a colocated server reports to: its core (first tokens count in
    the hit window), then the core's owner (let go by the server's detach)."""

    def __init__(self, core: ColocatedCluster) -> None:
        self.core = core

    def first_token(self, req: Request) -> None:
        self.core._first_token(req)

    def finished(self, req: Request) -> None:
        self.core.listener.finished(req)


class ColocatedCluster(EngineCore):
    """The engine core (:class:`basin.sim.cluster.Cluster`'s calls) over
    colocated servers. What PD needs an engine change for is how a colocated
    server works anyway: no decode memory is reserved ahead, idle KV is the
    prefix cache, and prefill and decode share each step; so lending,
    reservation at prefill completion and prefill borrowing are accepted and
    change nothing."""

    def __init__(self, hardware: HardwareProfile, topology: ColocatedTopology, listener: CallListener, *,
                 hit_window_calls: int = 0):
        if hardware.prefill.schedule_policy != "fcfs":
            # vLLM's scheduler serves its waiting queue first-come (or by
            # priority); it has no longest-prefix-match order to model.
            raise BasinInputError(
                f"schedule_policy '{hardware.prefill.schedule_policy}': a colocated deployment is a vLLM "
                "server, whose scheduler has no longest-prefix-match order (it is SGLang's, for PD "
                "deployments); set engine.schedule_policy to fcfs or leave it out")
        super().__init__(hardware, [RadixCache(topology.pool_tokens, 0, hardware.page_tokens)
                                    for _ in range(topology.instances)], listener, hit_window_calls)
        self.topology = topology
        reports = _HitFirst(self)
        self.instances = [
            ColocatedInstance(i, hardware.prefill, hardware.decode, cache, self.loop, reports,
                              itl_slo_s=hardware.itl_slo_s)
            for i, cache in enumerate(self.caches)
        ]
        self.reserve_at_completion = True
        self.lent_tier: None = None
        self.lending_on = False
        self.lend_cap_fraction = 0.0

    def _let_go(self) -> None:
        for inst in self.instances:
            inst.detach(stopped)

    # ----------------------------------------------------------------- calls
    def submit(self, session: int, key: list[Piece], prompt_tokens: int, new_tokens: int, output_tokens: int,
               priority: float | None, *, route: Route | None = None, call_index: int = 0) -> Request:
        """As :meth:`basin.sim.cluster.Cluster.submit`: the call goes to its
        session's server, a session's first to the least loaded."""
        req = self._request(session, key, prompt_tokens, new_tokens, output_tokens, priority, route, call_index)
        route = req.route
        home = route.last_prefill
        if home < 0:
            home = min(range(len(self.instances)),
                       key=lambda i: (len(self.instances[i].queue) + len(self.instances[i].running), i))
        route.last_prefill = home
        route.placed_on |= 1 << home
        self.instances[home].submit(req)
        return req

    def withdraw(self, req: Request) -> bool:
        return self.instances[req.prefill].withdraw(req)

    def set_ordered(self, on: bool) -> None:
        for inst in self.instances:
            inst.set_ordered(on)

    def preload(self, route: Route, key: list[Piece], last_touch_s: float) -> int:
        """A warm start, whose server is then the session's."""
        home = super().preload(route, key, last_touch_s)
        route.last_prefill = home
        return home

    def unpin(self, instance: int, pin: MatchResult) -> None:
        inst = self.instances[instance]
        inst.cache.unlock(pin)
        if not inst.busy:
            inst.kick()

    # Mechanisms that a colocated server has by construction (see the class).
    def wire_lending(self, cap_fraction: float) -> None:
        self.lend_cap_fraction = cap_fraction

    def set_lending(self, on: bool) -> None:
        self.lending_on = on

    def set_lend_cap(self, cap_fraction: float) -> None:
        self.lend_cap_fraction = cap_fraction

    @property
    def lent_tokens(self) -> int:
        return 0

    def drop_unit_unless_extended(self, uid: int, key: list[Piece]) -> None:
        return None

    def _first_token(self, req: Request) -> None:
        """A first token counts in the hit window before the owner hears of it."""
        self._note_hit(req.prefill, req.prompt, req.cached)
        self.listener.first_token(req)

    # =============================================================== figures
    def prefill_totals(self) -> tuple[int, int, int, int]:
        prompt = sum(i.prompt_tokens_total for i in self.instances)
        cached = sum(i.cached_tokens_total for i in self.instances)
        return prompt, cached, 0, prompt - cached

    def engine_figures(self, hit_rate: float) -> EngineFigures:
        pool = self.topology.pool_tokens * len(self.instances)
        held = sum(i.held_tokens for i in self.instances)
        return EngineFigures(
            hit_rate=hit_rate,
            prefill_queue_requests=sum(len(i.queue) for i in self.instances),
            prefill_backlog_tokens=sum(i.backlog_tokens for i in self.instances),
            decode_wait_requests=0,
            decode_used_fraction=held / pool,
            gpu_cache_tokens=pool,
            host_cache_tokens=0,
            effective_cache_tokens=pool,
            lent_cache_tokens=0,
            decode_kv_tokens=pool,
        )

    def gauges(self) -> dict[str, float]:
        pool = self.topology.pool_tokens * len(self.instances)
        return {
            "cache_capacity_tokens": pool,
            "host_capacity_tokens": 0,
            "decode_kv_decoding_tokens": sum(i.held_tokens for i in self.instances),
            "decode_kv_reserved_idle_tokens": 0,
            "decode_kv_capacity_tokens": pool,
            "decode_kv_lent_tokens": 0,
            "prefill_queue_len": sum(len(i.queue) for i in self.instances),
            "decode_wait_len": 0,
            "decode_running": sum(len(i.running) for i in self.instances),
        }

    @property
    def smallest_pool_tokens(self) -> int:
        return self.topology.pool_tokens

    @property
    def smallest_kv_tokens(self) -> int:
        return self.topology.pool_tokens

    @property
    def decode_kv_tokens(self) -> int:
        return self.topology.pool_tokens * len(self.instances)

    def prefill_figures(self) -> list[PrefillFigures]:
        """Each server as the emulator's metrics read a prefill instance."""
        out = []
        for i in self.instances:
            out.append(PrefillFigures(
                index=i.index, queue_requests=len(i.queue), running_requests=len(i.running),
                pool_tokens=i.cache.device_capacity,
                pool_used_fraction=min(1.0, i.held_tokens / i.cache.device_capacity),
                host_tokens=0, prompt_tokens_total=i.prompt_tokens_total, cached_tokens_total=i.cached_tokens_total,
                recent_hit_rate=self.recent_hit_rate(i.index)))
        return out

    def decode_figures(self) -> list[DecodeFigures]:
        """Each server as the emulator's metrics read a decode instance (nothing waits for memory apart)."""
        return [DecodeFigures(index=i.index, running_requests=sum(1 for r in i.running if r.remaining <= 0),
                              joining_requests=0, memory_wait_requests=0, transfer_requests=0,
                              kv_tokens=i.cache.device_capacity,
                              kv_used_fraction=min(1.0, i.held_tokens / i.cache.device_capacity), lent_tokens=0)
                for i in self.instances]

    def generated_tokens(self, req: Request) -> int:
        if not math.isnan(req.finished_s):
            return req.output
        return req.generated

    def step_s(self, req: Request) -> float:
        inst = self.instances[req.prefill] if req.prefill >= 0 else self.instances[0]
        return inst.last_step_s

