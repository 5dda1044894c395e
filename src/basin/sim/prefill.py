"""A prefill instance: its queue, chunked prefill steps and its prefix cache.

Each forward step takes up to ``chunk_tokens`` of uncached work: requests
already in progress continue first, then the queue's head (first-come or by
the policy's session priority) is started while the budget lasts. Starting a
request matches its prompt against the cache (a queued request holds no
prefix, as in SGLang, unless the profile's ``lock_queued_prefix`` says it
locks its match at enqueue), locks the match, loads back
host hits (overlapped with compute) and allocates pool space for the tokens
it will compute; when the pool cannot be freed the head waits (head-of-line),
as in SGLang; a request that could not start even on an empty instance (its
prompt, or its locked prefix plus its allocation, exceeds the pool) is
refused with :class:`~basin.sim.invariants.RequestNeverFits` instead of
blocking the queue forever. A step costs a fixed overhead plus each chunk's
compute, which grows with the chunk's position in its prompt (full-attention
layers).

The queue's order is the profile's ``schedule_policy``. ``fcfs`` (SGLang's
default) serves it first-come, or by the sessions' priorities when a policy
asks for them. ``lpm`` is SGLang's ``--schedule-policy lpm``, whose rules,
read from ``python/sglang/srt/managers/schedule_policy.py``, are these:

* Every round (each step here; SGLang's ``get_new_batch_prefill`` calls
  ``SchedulePolicy.calc_priority`` before it admits anything), while at most
  :data:`LPM_MAX_WAITING` requests wait, each waiting request is matched
  against the radix tree (``_compute_prefix_matches``). The match refreshes
  the LRU stamps along its path, as ``RadixCache.match_prefix`` does, so a
  waiting request's prefix stays young; it locks nothing.
* The queue is sorted by the matched tokens, device and host tiers together
  (``num_matched_prefix_tokens``), the longest first
  (``_sort_by_longest_prefix``). The sort is stable: ties keep their order
  in the queue, which is first-come until a sort has reordered them.
* In-batch prefix caching (``_compute_prefix_matches``): a request with at
  most :data:`IN_BATCH_CHECK_TOKENS` tokens on the device that shares at
  least :data:`IN_BATCH_DEPRIORITIZE_TOKENS` tokens with an earlier such
  request of the same round goes last, so that one of them computes the
  shared prefix and the others find it cached.
* With more than :data:`LPM_MAX_WAITING` waiting the queue is neither
  matched nor sorted (``_determine_active_policy``): it is served in the
  order it stands in, that of the last sort with later arrivals behind it
  first-come.
* Session priorities are ignored: SGLang's LPM sort does not read them, nor
  does its fallback (priorities apply only under ``fcfs``).
* Decode memory lent as a cache tier (:class:`LowerTier`) is not the
  engine's radix tree and does not count in the match.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from heapq import heapify, heappop, heappush
from typing import Protocol

from basin.catalog import PrefillProfile
from basin.sim.cache import MatchResult, RadixCache
from basin.sim.costs import PrefillCosts
from basin.sim.events import ENGINE, EventLoop
from basin.sim.invariants import InvariantViolation, RequestNeverFits, require
from basin.sim.requests import Piece, Queued, Request, queue_key

#: LPM's cut-off: with more requests waiting than this SGLang neither matches
#: nor sorts its queue (``SchedulePolicy._determine_active_policy``, a
#: constant there: matching every waiting request each round is expensive).
LPM_MAX_WAITING = 128
#: In-batch prefix caching's two thresholds, SGLang's defaults
#: (``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`` and
#: ``IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD`` in schedule_policy.py):
#: a request is checked when its device match is at most the first, and
#: deprioritised when it shares at least the second with an earlier one.
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32


def lpm_order(matched_tokens: Sequence[int], deprioritized: Sequence[bool]) -> list[int]:
    """The positions of waiting requests, given in the queue's current
    order, in LPM's order: the most cached tokens first, deprioritised ones
    last, ties in their current order (SGLang's sort is stable)."""
    return sorted(range(len(matched_tokens)), key=lambda i: (deprioritized[i], -matched_tokens[i], i))


def shared_prefix_tokens(a: Sequence[Piece], b: Sequence[Piece]) -> int:
    """Tokens two prompt keys have in common from their start: pieces with
    one chunk id hold the same tokens, so the keys agree up to the first
    piece that differs in its chunk or ends earlier in one of them."""
    shared = 0
    for (chunk_a, n_a), (chunk_b, n_b) in zip(a, b, strict=False):
        if chunk_a != chunk_b:
            break
        shared += min(n_a, n_b)
        if n_a != n_b:
            break
    return shared


class LowerTier(Protocol):
    """A cache tier outside the prefill instance, such as decode memory lent
    as cache: it says how much of a session's prompt it holds and charges the
    transfer of what the prefill takes from it."""

    def covered_tokens(self, session_uid: int, prompt_tokens: int) -> int: ...

    def fetch(self, session_uid: int, tokens: int, now: float) -> float:
        """Hand over ``tokens``; returns the transfer time in seconds."""
        ...


class PrefillInstance:
    def __init__(self, index: int, profile: PrefillProfile, cache: RadixCache, loop: EventLoop,
                 on_done: Callable[[Request], None], loads: list[int] | None = None):
        # What the prefill router reads of an instance it walks comes first
        # (see DecodeInstance).
        self.index = index
        #: Requests queued or running here (the cache-aware router's load),
        #: slot ``index``: counted where the two lists change, in a list the
        #: engine's prefill instances share, which the router scans rather
        #: than every instance (ROUTER-LOAD).
        self.loads = loads if loads is not None else [0] * (index + 1)
        self.queue: list[Queued] = []
        self.running: list[Request] = []
        self.cache = cache
        self.profile = profile
        self.costs = PrefillCosts(profile)
        # The profile's figures read on every step, held as the instance's own
        # attributes: compiled, a read of the (interpreted) profile's field is
        # a generic attribute lookup, a read of these is a load.
        self.chunk_tokens: int = profile.chunk_tokens
        self.step_overhead_s: float = profile.step_overhead_s
        self.frontend_s_per_prompt_token: float = profile.frontend_s_per_prompt_token
        #: Front-end time of requests queued since the last step began, owed by the next one.
        self.frontend_owed_s = 0.0
        self.load_tokens_per_s: float = profile.load_tokens_per_s
        self.lock_queued_prefix: bool = profile.lock_queued_prefix
        #: SGLang's LPM orders the queue (see the module's docstring).
        self.lpm: bool = profile.schedule_policy == "lpm"
        #: Bound once (compiled, a bound method made per step costs more than
        #: the step's bookkeeping); let go by :meth:`detach`.
        self._end_step_handler: Callable[[list[tuple[Request, int]]], None] = self._end_step
        self.loop = loop
        self.on_done = on_done
        self.busy = False
        self.ordered = False
        self.queued_tokens = 0  # prompt tokens waiting (a load signal for routers)
        #: Pool tokens the queue's head asked for when its allocation last failed.
        self.blocked_tokens = 0
        #: Cache tiers outside the instance, consulted after the local match.
        self.lower_tiers: list[LowerTier] = []
        #: Prompt tokens prefilled here so far, and those of them served from
        #: a cache (device, host or lent); the engine counts them.
        self.prompt_tokens_total = 0
        self.hit_tokens_total = 0

    def detach(self, on_done: Callable[..., None]) -> None:
        """Let go of the owner's handler (``on_done`` replaces it) and of the
        handler bound to itself: the end of a run, after which nothing may
        be due here."""
        self.on_done = on_done
        self._end_step_handler = on_done

    # ----------------------------------------------------------------- queue
    def enqueue(self, req: Request) -> None:
        """Queue a request. As in SGLang, its prefix is matched when it starts,
        so while it waits its cached prefix ages like any other and may be
        evicted; with the profile's ``lock_queued_prefix`` it is matched and
        locked now instead, and waiting costs it nothing."""
        if req.prompt > self.cache.device_capacity:
            raise RequestNeverFits(
                "LIVE-PREFILL-FITS",
                f"prefill {self.index}: a prompt of {req.prompt} tokens (session {req.session}, "
                f"call {req.call_index}) exceeds the {self.cache.device_capacity}-token pool")
        req.prefill = self.index
        if self.frontend_s_per_prompt_token > 0.0:
            self.frontend_owed_s += req.prompt * self.frontend_s_per_prompt_token
        if self.lock_queued_prefix:
            m = self.cache.match(req.key, self.loop.now, req.route.cursor_on(self.cache), req.prompt)
            self.cache.lock(m)
            req.match = m
        heappush(self.queue, Queued(self._sort_key(req), req))
        self.queued_tokens += req.prompt
        self.loads[self.index] += 1
        if not self.busy:
            self._start_step()

    def _sort_key(self, req: Request) -> float:
        if self.lpm:
            # Behind every request a sort has placed (their keys are
            # negative), first-come among themselves.
            return float(req.seq)
        return queue_key(req, self.ordered)

    def set_ordered(self, ordered: bool) -> None:
        if ordered == self.ordered:
            return
        if self.lpm:
            # LPM reads no priority: the queue keeps its order.
            self.ordered = ordered
            return
        self.ordered = ordered
        self.queue = [Queued(self._sort_key(e.req), e.req) for e in self.queue]
        heapify(self.queue)

    def remove(self, req: Request) -> bool:
        """Drop a queued request (its session was terminated or shed)."""
        for i, r in enumerate(e.req for e in self.queue):
            if r is req:
                self.queue[i] = self.queue[-1]
                self.queue.pop()
                heapify(self.queue)
                self.queued_tokens -= req.prompt
                self.loads[self.index] -= 1
                if req.match is not None:
                    self.cache.unlock(req.match)
                    req.match = None
                return True
        return False

    def kick(self) -> None:
        """Memory was freed: resume if the head was waiting for the pool."""
        if not self.busy:
            self._start_step()

    def resume(self, req: Request) -> None:
        """Take back a started request whose prefill a decode instance had
        borrowed (:mod:`basin.sim.borrow`): it runs here from where it is."""
        self.running.append(req)
        self.loads[self.index] += 1
        self.kick()

    def _order_by_prefix(self, now: float) -> None:
        """LPM's round: match every waiting request (refreshing its prefix's
        LRU stamps, counting nothing in the cache's statistics) and re-key
        the queue in LPM's order. The keys are the positions minus the
        queue's length, all negative: a sorted list is a heap, and a request
        queued later (key: its sequence number) goes behind them until the
        next round places it."""
        entries = sorted(self.queue)
        cache = self.cache
        matched: list[int] = []
        deprioritized: list[bool] = []
        checked: dict[Hashable, list[list[Piece]]] = {}
        for entry in entries:
            req = entry.req
            m = cache.match(req.key, now, req.route.cursor_on(cache), req.prompt, False)
            matched.append(min(m.total_tokens, req.prompt - 1))
            late = False
            if m.device_tokens <= IN_BATCH_CHECK_TOKENS and req.key:
                peers = checked.setdefault(req.key[0][0], [])
                for key in peers:
                    if shared_prefix_tokens(req.key, key) >= IN_BATCH_DEPRIORITIZE_TOKENS:
                        late = True
                        break
                if not late:
                    peers.append(req.key)
            deprioritized.append(late)
        order = lpm_order(matched, deprioritized)
        n = len(order)
        self.queue = [Queued(float(rank - n), entries[i].req) for rank, i in enumerate(order)]

    # ----------------------------------------------------------------- steps
    def _begin(self, req: Request, now: float) -> bool:
        """Start ``req`` if the pool can take it (False: it stays queued).

        Its match may be older than this attempt (taken at enqueue, or kept
        from a failed attempt): the lock keeps the matched path in the tree
        and its device part on the device (LOCKED-KEPT), but another request
        sharing the path may have loaded part of the host part back since.
        Such a match is taken again. Nothing is loaded or fetched before the
        allocation is granted (as SGLang checks its token budget before its
        load-back), so a failed attempt leaves no trace to go stale.
        """
        cache = self.cache
        m = req.match
        if m is None:
            m = cache.match(req.key, now, req.route.cursor_on(cache), req.prompt)
            cache.lock(m)
            req.match = m
        elif _host_part_loaded(m):
            fresh = cache.match(req.key, now, req.route.cursor_on(cache), req.prompt)
            cache.lock(fresh)
            cache.unlock(m)
            req.match = m = fresh
        host = m.host_tokens
        cached = m.device_tokens
        fetched = 0
        fetches: list[tuple[LowerTier, int]] = []
        for tier in self.lower_tiers:
            # A tier outside this instance (decode-lent memory) may hold more
            # of the prompt than the local match; its extra tokens are copied
            # into the pool like computed ones, at the tier's transfer cost.
            covered = min(tier.covered_tokens(req.session, req.prompt), req.prompt - 1)
            extra = covered - cached - host - fetched
            if extra > 0:
                fetches.append((tier, extra))
                fetched += extra
        uncached = req.prompt - cached - host - fetched
        if uncached <= 0:
            # A fully cached prompt still computes its last token.
            uncached = 1
            if host:
                host -= 1
            else:
                cached -= 1
        # One allocation covers the load-back too (all or nothing), so once
        # it is granted the load cannot fail.
        if not cache.allocate(m.host_tokens + uncached + fetched):
            self.blocked_tokens = m.host_tokens + uncached + fetched
            return False
        if m.host_tokens:
            cache.release(m.host_tokens)
            loaded = cache.load_back(m)
            if loaded != m.host_tokens:
                raise InvariantViolation(
                    "MATCH-FRESH", f"prefill {self.index}: loaded {loaded} of a {m.host_tokens}-token host match")
        fetch_s = 0.0
        for tier, extra in fetches:
            fetch_s = max(fetch_s, tier.fetch(req.session, extra, now))
        req.cached = cached
        req.loaded = host + fetched
        req.uncached = uncached
        req.alloc = uncached + fetched
        req.remaining = uncached
        req.position = cached + host + fetched
        req.load_s = max(host / self.load_tokens_per_s, fetch_s)
        req.prefill_start_s = now
        return True

    def _start_step(self) -> None:
        now = self.loop.now
        budget = self.chunk_tokens
        cost = 0.0
        load_s = 0.0
        plan: list[tuple[Request, int]] = []
        if self.lpm and self.queue and len(self.queue) <= LPM_MAX_WAITING:
            self._order_by_prefix(now)
        for req in self.running:
            take = min(req.remaining, budget)
            if take <= 0:
                break
            plan.append((req, take))
            budget -= take
        while budget > 0 and self.queue:
            req = self.queue[0].req
            if not self._begin(req, now):
                break
            heappop(self.queue)
            self.queued_tokens -= req.prompt
            self.running.append(req)
            take = min(req.remaining, budget)
            plan.append((req, take))
            budget -= take
            if req.load_s > load_s:
                load_s = req.load_s
        if not plan:
            self.busy = False
            if self.queue and not self.running:
                if self._release_queued_locks():
                    self._start_step()
                else:
                    self._check_head_fits()
            return
        costs = self.costs
        for req, take in plan:
            cost += costs.tokens_cost_s(take, req.position)
        step_s = self.step_overhead_s + max(cost, load_s)
        if self.frontend_owed_s > 0.0:
            step_s += self.frontend_owed_s
            self.frontend_owed_s = 0.0
        self.busy = True
        self.loop.at(now + step_s, ENGINE, self._end_step_handler, plan)

    def _end_step(self, plan: list[tuple[Request, int]]) -> None:
        now = self.loop.now
        finished = []
        for req, take in plan:
            req.remaining -= take
            req.position += take
            if req.remaining <= 0:
                finished.append(req)
        if finished:
            held = len(self.running)
            self.running = [r for r in self.running if r.remaining > 0]
            self.loads[self.index] -= held - len(self.running)
            for req in finished:
                req.prefill_end_s = now
                self.on_done(req)
        self._start_step()

    def _release_queued_locks(self) -> bool:
        """Nothing runs and the head cannot get pool space: the prefixes held
        by the other queued requests give way (they re-match when they start).
        Without this, queued locks could hold the whole pool and stall."""
        released = False
        head = self.queue[0].req
        for req in (e.req for e in self.queue):
            if req is not head and req.match is not None:
                self.cache.unlock(req.match)
                req.match = None
                released = True
        return released

    def _check_head_fits(self) -> None:
        """The instance is stalled on its head (nothing runs, no queued lock
        left to give way): refuse the head if it could never start, that is if
        the prefix its own lock keeps plus its allocation exceed the pool.
        Otherwise it waits for what others hold (pins, borrowed prefills)."""
        req = self.queue[0].req
        m = req.match
        if m is None:
            return
        need = self.cache.locked_device_tokens(m) + self.blocked_tokens
        if need > self.cache.device_capacity:
            raise RequestNeverFits(
                "LIVE-PREFILL-FITS",
                f"prefill {self.index}: session {req.session} call {req.call_index} needs "
                f"{need} pool tokens ({self.blocked_tokens} to allocate beside its locked prefix), "
                f"more than the {self.cache.device_capacity}-token pool")

    # --------------------------------------------------------------- release
    def release(self, req: Request, now: float) -> None:
        """The request's KV left for decode: cache its prompt, drop the lock."""
        m = req.match
        if m is None:
            return
        cursor = self.cache.insert(req.key, now, req.alloc, m, req.prompt)
        route = req.route
        if route.key is req.key:
            route.keep_cursor(self.cache, cursor)
        self.cache.unlock(m)
        req.match = None
        req.alloc = 0
        self.kick()

    @property
    def load_requests(self) -> int:
        return self.loads[self.index]

    @property
    def backlog_tokens(self) -> int:
        return self.queued_tokens + sum(r.remaining for r in self.running)

    def check(self) -> None:
        """Verify ROUTER-LOAD: the load the router reads is the requests
        queued and running here."""
        held = len(self.queue) + len(self.running)
        require(self.load_requests == held, "ROUTER-LOAD",
                f"prefill {self.index}: load {self.load_requests}, {held} requests queued or running")


def _host_part_loaded(m: MatchResult) -> bool:
    """Whether some of ``m``'s host part is on the device now. Device
    residency along a path is a prefix of it (TREE), so the node just below
    the match's device end tells."""
    if not m.host_tokens:
        return False
    node = m.last_node
    while node.parent is not m.device_node:
        node = node.parent  # type: ignore[assignment]  # stops below the device node
    return node.on_device
