"""A decode instance: KV reservations, the wait for decode memory, and a
continuous batch advanced in closed form.

Memory: a request reserves its prompt plus ``reserve_output_tokens`` (either
before its prefill starts, SGLang's behaviour, or at prefill completion);
past that reservation a running request grows by one token a step, and when
the pool cannot hold the next step the youngest request is retracted to the
wait queue (it resumes later, after a transfer charge, from where it was).
A reservation larger than the whole instance could never be granted: it is
refused with :class:`~basin.sim.invariants.RequestNeverFits` rather than
left to block the wait queue forever.

Time: while the batch is unchanged, step ``i`` of an epoch costs
``a + k (i - 1)`` with ``a = base + per_request B + per_token C0`` and
``k = per_token B`` (context grows by B tokens a step), so ``m`` steps take
``m a + k m (m - 1) / 2``. Events happen only at completions, joins (at the
next step boundary), reservation crossings and memory exhaustion; ITL-SLO
violations within an epoch are counted in closed form as well.

Stays (STAY): a retracted request may rejoin later, so its finish and
crossing entries from an earlier stay can still be in the heaps. Each entry
carries the stay it was made for, the request's retraction count at the join
(a stay ends in a finish or a retraction, which bumps the count), and an
entry counts only while its request is in the batch in that same stay; stale
entries are dropped when they reach the top of their heap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Final

from basin.catalog import DecodeProfile
from basin.sim.costs import DecodeCosts
from basin.sim.events import EventLoop
from basin.sim.invariants import RequestNeverFits, require
from basin.sim.lending import LendingConfig, LentMemory
from basin.sim.requests import Callbacks, CallListener, Queued, Request, queue_key
from basin.sim.tournament import Entrant, Tournament

_INF: Final = math.inf


class _Due:
    """A batch heap's entry: the step at which a request's stay ``stay`` in
    the batch finishes (or crosses its reserved output). It compares as the
    tuple ``(step, seq, stay)`` would, by its own method (see
    :class:`basin.sim.events._Event` for why not a tuple); a request retracted
    and rejoined can hold two entries for one step, one per stay."""

    __slots__ = ("step", "seq", "stay", "req")

    def __init__(self, step: int, stay: int, req: Request) -> None:
        self.step = step
        self.seq = req.seq
        self.stay = stay
        self.req = req

    def __lt__(self, other: _Due) -> bool:
        if self.step != other.step:
            return self.step < other.step
        if self.seq != other.seq:
            return self.seq < other.seq
        return self.stay < other.stay


class DecodeRoom:
    """What the decode router compares of each instance: its free memory
    less its waiting requests, as the entrant ``index`` of a tournament (the
    most room wins, the lowest index on a tie), so that the router reads
    the winner rather than every instance (on a large deployment each
    instance it read was a cache miss). An instance whose figures may have
    changed lists itself as stale, and its entrant is updated only when the
    router next reads (ROUTER-ROOM). A read empties the list (the engine
    reads once more when it stops, :meth:`basin.sim.cluster.Cluster.stop`,
    so that the room keeps no instance after a run)."""

    __slots__ = ("entrants", "tournament", "stale")

    def __init__(self, instances: int) -> None:
        self.tournament = Tournament()
        #: Keyed by minus the room, tied by index.
        self.entrants = [Entrant(0.0, index) for index in range(instances)]
        for entrant in self.entrants:
            self.tournament.add(entrant)
        self.stale: list[DecodeInstance] = []

    def best(self) -> int:
        """The index of the instance with the most room, the stale ones refreshed."""
        stale = self.stale
        if stale:
            entrants = self.entrants
            tournament = self.tournament
            for d in stale:
                entrant = entrants[d.index]
                entrant.key = float(d.waiting - d.free_tokens)
                tournament.moved(entrant)
                d.room_stale = False
            stale.clear()
        return self.tournament.root.winner.tie

    def current(self) -> list[int]:
        """Every instance's room, the stale ones refreshed (for checks and tests)."""
        self.best()
        return [self.room_of(index) for index in range(len(self.entrants))]

    def room_of(self, index: int) -> int:
        """The room posted for instance ``index`` (stale if it is listed)."""
        return -int(self.entrants[index].key)


def _holds_nothing(uid: int, tokens: int) -> bool:
    """No prefill cache holds a lent unit (an instance that lends nothing)."""
    return False


class Lease:
    """Prefill chunks lent a decode instance's steps (the mechanism is
    :class:`basin.sim.borrow.PrefillBorrower`'s). The instance asks at each
    step boundary and reports the steps done; it is handed in, so the lease
    holds no reference to its instance. This base lends nothing."""

    def plan_step(self, dec: DecodeInstance) -> bool:
        """At a step boundary of ``dec``: plan a chunk for the next step and
        schedule that single step (True), or leave ``dec`` to its closed-form
        batch (False)."""
        return False

    def step_done(self, dec: DecodeInstance, steps: int) -> None:
        """``dec`` completed ``steps`` steps; a planned chunk was part of the first."""


class DecodeInstance:
    def __init__(self, index: int, profile: DecodeProfile, itl_slo_s: float, loop: EventLoop,
                 on_reserved: Callable[[Request], None], listener: CallListener,
                 room: DecodeRoom | None = None):
        """``listener`` hears of each finish (its first token is the engine's to report)."""
        # What a refresh of the router's view reads (DecodeRoom.best) comes
        # first: compiled, attributes lie in the order they are first set, so
        # these share a cache line or two.
        self.index = index
        self.capacity = profile.kv_tokens
        self.used = 0
        #: Requests in the wait heap, cancelled ones included until they reach
        #: its head: counted where the heap changes, so that the router reads
        #: a field of each instance rather than the list (ROUTER-LOAD).
        self.waiting = 0
        self.wait: list[Queued] = []
        #: Memory lent as prefix cache (BASIN); decode allocations reclaim it first.
        self.lending: LentMemory | None = None
        #: What the decode router compares, shared by the engine's decode
        #: instances (see DecodeRoom); ``room_stale``: listed there for a refresh.
        self.room = room if room is not None else DecodeRoom(index + 1)
        self.room_stale = False
        self.profile = profile
        self.costs = DecodeCosts(profile)
        self.itl_slo_s = itl_slo_s
        self.loop = loop
        self.on_reserved = on_reserved
        self.listener = listener
        self.reserve_out = profile.reserve_output_tokens
        self.max_running: int = profile.max_running_requests
        self.reserved_idle = 0
        self.ordered = False
        # the running batch
        self.batch: set[Request] = set()
        self.ctx_sum = 0
        self.epoch_t = 0.0
        self.step = 0
        self.cum_viol = 0
        #: (step, seq, stay, request): a request's finish step and the step it
        #: outgrows its reservation, for the stay given (see STAY above).
        self.finish_heap: list[_Due] = []
        self.cross_heap: list[_Due] = []
        self.n_growing = 0
        self.pending: list[Request] = []
        #: The batch's next wake: ``wake_steps`` steps from the epoch's start,
        #: at ``wake_t`` (infinite: none), held by one timer of the loop that
        #: each new wake moves (see basin.sim.events).
        self.wake_steps = 0
        self.wake_t = _INF
        self.wake_timer = loop.add_timer(self._on_wake)
        #: Prefill borrowing (basin.sim.borrow): the lease of this instance,
        #: and the extra time of the next step for a borrowed prefill chunk.
        self.borrower: Lease | None = None
        self.step_extra_s = 0.0
        self.held_by_prefill: Callable[[int, int], bool] = _holds_nothing
        #: Requests whose KV is on its way here (the engine counts them).
        self.transfers_in = 0
        self.room_changed()

    def detach(self, handler: Callable[..., None]) -> None:
        """Let go of the owner's handler and listener (``handler`` replaces
        both) and of the one its lent memory holds of it: the end of a run."""
        self.on_reserved = handler
        self.listener = Callbacks(handler, handler)
        self.held_by_prefill = _holds_nothing
        if self.lending is not None:
            self.lending.on_change = None

    # ------------------------------------------------------------ reservation
    def _sort_key(self, req: Request) -> float:
        return queue_key(req, self.ordered)

    def room_changed(self) -> None:
        """List this instance for a refresh of its entrant in the router's
        view: at every entry point that may change its free memory or its
        waiting count (an instance listed needlessly costs only the refresh)."""
        if not self.room_stale:
            self.room_stale = True
            self.room.stale.append(self)

    def lend(self, config: LendingConfig) -> LentMemory:
        """Start lending this instance's free memory as prefix cache."""
        self.lending = LentMemory(self.capacity, config, self.room_changed)
        self.room_changed()
        return self.lending

    def request_memory(self, req: Request) -> None:
        req.decode = self.index
        self.room_changed()
        heappush(self.wait, Queued(self._sort_key(req), req))
        self.waiting += 1
        self.admit_waiting()

    def set_ordered(self, ordered: bool) -> None:
        if ordered == self.ordered:
            return
        self.ordered = ordered
        self.wait = [Queued(self._sort_key(e.req), e.req) for e in self.wait]
        heapify(self.wait)

    @property
    def lent(self) -> int:
        return self.lending.lent if self.lending is not None else 0

    @property
    def free_tokens(self) -> int:
        return self.capacity - self.used - self.lent

    def free_beyond_demand(self) -> int:
        """Free memory after what the wait queue asks for (lending headroom)."""
        waiting = sum(e.req.prompt + e.req.generated + self.reserve_out for e in self.wait if not e.req.cancelled)
        return self.free_tokens - waiting

    def _reclaim(self, tokens: int) -> None:
        if self.lending is not None and tokens > 0:
            self.lending.reclaim(tokens, self.held_by_prefill)

    def admit_waiting(self) -> None:
        """Reserve memory for the wait queue's head while it fits (in order)."""
        wait = self.wait
        while wait:
            req = wait[0].req
            # Listed at each change, not once: the callback below may have the
            # router read (and refresh) the view in between.
            if req.cancelled:
                heappop(wait)
                self.room_changed()
                self.waiting -= 1
                continue
            need = req.prompt + req.generated + self.reserve_out
            if need > self.free_tokens:
                self._reclaim(need - self.free_tokens)
                if need > self.free_tokens:
                    if need > self.capacity:
                        raise RequestNeverFits(
                            "LIVE-DECODE-FITS",
                            f"decode {self.index}: session {req.session} call {req.call_index} "
                            f"needs {need} KV tokens ({req.prompt} prompt + {req.generated} generated "
                            f"+ {self.reserve_out} reserved), more than the instance's {self.capacity}")
                    break
            heappop(wait)
            self.room_changed()
            self.waiting -= 1
            self.used += need
            req.reserved = need
            self.reserved_idle += need
            self.on_reserved(req)

    def release_reservation(self, req: Request) -> None:
        """A request that reserved memory but will never decode gives it back."""
        if req.reserved:
            self.room_changed()
            self.used -= req.reserved
            self.reserved_idle -= req.reserved
            req.reserved = 0
            self.admit_waiting()

    # ----------------------------------------------------------------- batch
    def _coeffs(self) -> tuple[float, float]:
        costs = self.costs
        b = len(self.batch)
        a = costs.step_s(b, self.ctx_sum) + self.step_extra_s
        return a, costs.per_context_token_s * b

    @staticmethod
    def _span(a: float, k: float, m: int) -> float:
        return m * a + k * m * (m - 1) / 2.0

    def _steps_done(self, elapsed: float) -> int:
        a, k = self._coeffs()
        if k <= 0:
            m = int(elapsed / a)
        else:
            h = a - k / 2.0
            m = int((-h + math.sqrt(h * h + 2.0 * k * elapsed)) / k)
        while m > 0 and self._span(a, k, m) > elapsed + 1e-12:
            m -= 1
        while self._span(a, k, m + 1) <= elapsed:
            m += 1
        return m

    def join(self, req: Request) -> None:
        """The request's KV arrived; it decodes from the next step boundary."""
        now = self.loop.now
        self.reserved_idle -= req.reserved
        if (not self.batch and self.wake_t == _INF) or now == self.epoch_t:
            # Nothing running, or a step boundary right now: join at once.
            self.epoch_t = now
            self._add(req)
            self._schedule()
            return
        self.pending.append(req)
        target = self._steps_done(now - self.epoch_t) + 1
        if target < self.wake_steps:
            self._set_wake(target)

    def _add(self, req: Request) -> None:
        req.join_step = self.step
        req.viol_at_join = self.cum_viol
        self.batch.add(req)
        self.ctx_sum += req.prompt + 1 + req.generated
        left = req.decode_steps - req.generated
        stay = req.retractions
        heappush(self.finish_heap, _Due(self.step + left, stay, req))
        if left > self.reserve_out:
            heappush(self.cross_heap, _Due(self.step + self.reserve_out, stay, req))

    def _live(self, req: Request, stay: int) -> bool:
        """Whether a heap entry made for ``stay`` still belongs to ``req``'s
        current stay in the batch (STAY)."""
        return req.retractions == stay and req in self.batch

    def _drop_stale(self, heap: list[_Due]) -> None:
        while heap and not self._live(heap[0].req, heap[0].stay):
            heappop(heap)

    def _set_wake(self, steps: int) -> None:
        a, k = self._coeffs()
        self.wake_steps = steps
        self.wake_t = self.epoch_t + self._span(a, k, steps)
        self.wake_timer.set(self.wake_t)

    def _schedule(self) -> None:
        # Stale heads would wake the batch (or stop a borrowed chunk) early.
        self._drop_stale(self.finish_heap)
        self._drop_stale(self.cross_heap)
        if self.borrower is not None and self.borrower.plan_step(self):
            return  # one mixed step with a borrowed prefill chunk
        if not self.batch:
            self.wake_steps = 0
            self.wake_t = _INF
            self.wake_timer.clear()
            return
        target = self.finish_heap[0].step - self.step
        if self.cross_heap:
            target = min(target, self.cross_heap[0].step - self.step)
        if self.n_growing:
            target = min(target, max(1, self.free_tokens // self.n_growing))
        if self.pending:
            target = 1
        self._set_wake(max(target, 0))

    def _on_wake(self) -> None:
        self.room_changed()
        now = self.loop.now
        m = self.wake_steps
        if m > 0:
            a, k = self._coeffs()
            self._count_violations(a, k, m)
            b = len(self.batch)
            self.step += m
            self.ctx_sum += b * m
            self.used += self.n_growing * m
            if self.borrower is not None:
                self.borrower.step_done(self, m)
        self.epoch_t = now
        finished: list[Request] = []
        heap = self.finish_heap
        while heap and heap[0].step <= self.step:
            due = heappop(heap)
            req = due.req
            if self._live(req, due.stay):
                finished.append(req)
                self._remove(req)
        cross = self.cross_heap
        while cross and cross[0].step <= self.step:
            due = heappop(cross)
            req = due.req
            if self._live(req, due.stay) and not req.growing:
                req.growing = True
                self.n_growing += 1
        if self.n_growing and self.free_tokens < self.n_growing:
            self._reclaim(self.n_growing - self.free_tokens)
        while self.n_growing and self.free_tokens < self.n_growing:
            self._retract_youngest()
        cap = self.max_running
        while self.pending and len(self.batch) < cap:
            self._add(self.pending.pop(0))
        self.room_changed()  # again: the borrower's step may have had the view read
        for req in finished:
            req.finished_s = now
            self.listener.finished(req)
        if finished:
            self.admit_waiting()
        self._schedule()

    def _count_violations(self, a: float, k: float, m: int) -> None:
        slo = self.itl_slo_s
        if a > slo:
            self.cum_viol += m
        elif k > 0:
            first = int((slo - a) / k) + 2  # 1-based index of the first step above the SLO
            if first <= m:
                self.cum_viol += m - first + 1

    def _remove(self, req: Request) -> None:
        self.batch.discard(req)
        ran = self.step - req.join_step
        self.ctx_sum -= req.prompt + 1 + req.generated + ran
        extra = max(0, ran - self.reserve_out)
        self.used -= req.reserved + extra
        if req.growing:
            self.n_growing -= 1
            req.growing = False
        req.reserved = 0
        violations = self.cum_viol - req.viol_at_join
        req.itl_violations += violations

    def _retract_youngest(self) -> None:
        # Ordered queues: the request whose session has the largest priority
        # key goes (Continuum's youngest program); otherwise the latest joined.
        if self.ordered:
            victim = max(self.batch, key=lambda r: (self._sort_key(r), r.join_step, r.seq))
        else:
            victim = max(self.batch, key=lambda r: (r.join_step, r.seq))
        ran = self.step - victim.join_step
        self._remove(victim)
        victim.generated += ran
        victim.retractions += 1
        heappush(self.wait, Queued(self._sort_key(victim), victim))
        self.waiting += 1

    # ---------------------------------------------------------------- checks
    def check(self, reserved_idle: int | None = None) -> None:
        """Verify the memory accounting (RESERVE-BALANCE): ``used`` is what
        the idle reservations, the requests pending a join and the batch hold
        (each batch member its reservation plus its growth beyond
        ``reserve_output_tokens``), within capacity; the batch's context and
        growing counts match its members. ``reserved_idle``: the idle
        reservations the caller knows of (requests reserved here and not yet
        joined), checked when given. STAY: each batch member has exactly one
        live finish entry, at the step its remaining output ends."""
        require(self.reserved_idle >= 0, "RESERVE-BALANCE", f"negative idle reservations {self.reserved_idle}")
        held = self.reserved_idle
        for req in self.pending:
            held += req.reserved
        ctx = growing = 0
        for req in self.batch:
            ran = self.step - req.join_step
            held += req.reserved + max(0, ran - self.reserve_out)
            ctx += req.prompt + 1 + req.generated + ran
            growing += req.growing
        require(held == self.used, "RESERVE-BALANCE", f"{self.used} tokens used, {held} held by requests")
        require(0 <= self.used <= self.capacity, "CAP-DECODE", f"{self.used} used of {self.capacity}")
        require(ctx == self.ctx_sum, "BATCH", f"context sum {self.ctx_sum} != {ctx}")
        require(self.waiting == len(self.wait), "ROUTER-LOAD",
                f"decode {self.index}: {self.waiting} counted waiting, {len(self.wait)} in the wait heap")
        listed = any(d is self for d in self.room.stale)
        require(listed == self.room_stale, "ROUTER-ROOM",
                f"decode {self.index}: {'' if listed else 'not '}listed stale, flagged {self.room_stale}")
        self.room.tournament.check()
        posted = self.room.room_of(self.index)
        require(self.room_stale or posted == self.free_tokens - self.waiting, "ROUTER-ROOM",
                f"decode {self.index}: room {posted} posted and not stale, "
                f"{self.free_tokens} free less {self.waiting} waiting")
        require(growing == self.n_growing, "BATCH", f"{self.n_growing} growing counted, {growing} flagged")
        ends: dict[Request, int] = {}
        for due in self.finish_heap:
            req = due.req
            if self._live(req, due.stay):
                require(req not in ends, "STAY", f"session {req.session}: two live finish entries")
                ends[req] = due.step
        for req in self.batch:
            end = req.join_step + req.decode_steps - req.generated
            require(ends.get(req) == end and end >= self.step, "STAY",
                    f"session {req.session}: finish entry {ends.get(req)}, expected {end} (step {self.step})")
        if reserved_idle is not None:
            require(reserved_idle == self.reserved_idle, "RESERVE-BALANCE",
                    f"{self.reserved_idle} idle reservations counted, {reserved_idle} held by requests")

    @property
    def decoding_tokens(self) -> int:
        return self.used - self.reserved_idle

    def live_waiting(self) -> int:
        """Requests waiting for memory that are still wanted (a cancelled one
        leaves the queue only when it reaches the head)."""
        return sum(1 for e in self.wait if not e.req.cancelled)
