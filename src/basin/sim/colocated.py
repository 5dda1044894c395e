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
from heapq import heapify, heappop, heappush

from basin.catalog import DecodeProfile, PrefillProfile
from basin.sim.cache import RadixCache
from basin.sim.costs import DecodeCosts, PrefillCosts
from basin.sim.events import ENGINE, EventLoop
from basin.sim.invariants import InvariantViolation, RequestNeverFits, require
from basin.sim.requests import Queued, Request, queue_key

#: What one step does: the requests that decode a token, and the prefill
#: chunks ``(request, tokens)``.
Plan = tuple[list[Request], list[tuple[Request, int]]]


class ColocatedInstance:
    """One colocated server (see the module's docstring for its rules)."""

    def __init__(self, index: int, prefill: PrefillProfile, decode: DecodeProfile, cache: RadixCache,
                 loop: EventLoop, on_first_token: Callable[[Request], None],
                 on_finished: Callable[[Request], None], *, max_running: int | None = None):
        if cache.host_capacity:
            raise ValueError("a colocated instance's pool has no host tier")
        self.index = index
        self.cache = cache
        self.loop = loop
        self.on_first_token = on_first_token
        self.on_finished = on_finished
        self.prefill_costs = PrefillCosts(prefill)
        self.decode_costs = DecodeCosts(decode)
        self.chunk_tokens: int = prefill.chunk_tokens
        self.step_overhead_s: float = prefill.step_overhead_s
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

    # ----------------------------------------------------------------- calls
    def submit(self, req: Request) -> None:
        """Queue a call; it is scheduled at the next step (now, when idle)."""
        if req.prompt + 1 > self.cache.device_capacity:
            raise RequestNeverFits(
                "LIVE-COLOCATED-FITS",
                f"instance {self.index}: a prompt of {req.prompt} tokens (session {req.session}, call "
                f"{req.call_index}) and its first output token exceed the {self.cache.device_capacity}-token pool")
        req.prefill = req.decode = self.index
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
            if req.match is None:  # preempted earlier in this step
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
        self.busy = True
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
                self.on_first_token(req)
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
        self.on_finished(req)

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
