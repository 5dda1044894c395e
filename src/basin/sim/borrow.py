"""Decode instances that run prefill chunks under an ITL lease (the engine
mechanism Crossflow needs; a policy asks for it with
``EngineNeeds(decode_runs_prefill=True)``).

The rule
--------
A request waiting in a prefill queue has already reserved its decode memory
(SGLang's order) on one decode instance. At each of that instance's step
boundaries, if the step leaves time under the ITL SLO, the instance takes the
first such request (in the prefill queue's own order) and prefills it itself,
one chunk per decode step, mixed into the batch:

* chunk size: the largest page multiple ``k`` with
  ``decode step + chunk compute + chunk_charge <= (1 - margin) * ITL SLO``
  and ``k <= step_token_budget - batch size`` (prefill and decode share the
  mixed step's token budget, by default the prefill chunk size); the lease is
  re-sized every step as the batch changes;
* the chunk's compute is the prefill cost model of the same GPU (linear plus
  position-dependent attention), and it lengthens that decode step; a step
  that still exceeds the SLO (a fixed chunk charge, a host load) counts as an
  ITL violation like any other;
* a request is borrowed only when a chunk of at least ``min_chunk_tokens``
  fits; if a later step has no room (the batch grew), the lease is revoked and
  the rest of the prompt goes back to the prefill instance, which continues
  it ahead of its queue (its running list).

The cache
---------
The borrowed request is matched, locked and host-loaded against its prefill
instance's radix cache exactly as if the prefill instance ran it (the
``PrefillInstance`` start path is reused): its cached prefix is sent to the
decode instance and only the uncached part is computed there. When it
finishes, the usual PD transfer charge covers moving KV between the two
instances, and the prompt is inserted into the prefill instance's cache, as
after any call, so the session's next call finds it there. The copy is
staged in the prefill pool from the start (the allocation ``_begin`` makes).
This keeps reuse identical whichever instance computes, so borrowing changes
only where compute happens: the faithful reading of Crossflow, which lends
compute, not memory.

Only requests holding a decode reservation are borrowed (with the engine's
reservation at prefill completion, nothing in a prefill queue has one, and
nothing is borrowed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any, Final

from basin.catalog import PrefillProfile
from basin.sim.costs import PrefillCosts
from basin.sim.decode import DecodeInstance, Lease
from basin.sim.events import EventLoop
from basin.sim.invariants import InvariantViolation
from basin.sim.prefill import PrefillInstance
from basin.sim.requests import Queued, Request

_INF: Final = math.inf


@dataclass(frozen=True)
class BorrowConfig:
    itl_slo_s: float
    #: The lease keeps a mixed step within ``(1 - margin) * itl_slo_s``.
    margin: float = 0.1
    #: Fixed extra time per borrowed chunk (0; the paper's sensitivity: 20 ms).
    chunk_charge_s: float = 0.0
    min_chunk_tokens: int = 256
    #: Tokens per mixed step shared by prefill and decode (None: the prefill chunk size).
    step_token_budget: int | None = None
    granularity_tokens: int = 64

    @classmethod
    def from_params(cls, itl_slo_s: float, params: Mapping[str, Any]) -> BorrowConfig:
        known = {f for f in cls.__dataclass_fields__ if f != "itl_slo_s"}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unknown borrowing parameter(s): {sorted(unknown)}")
        return cls(itl_slo_s=itl_slo_s, **dict(params))


@dataclass
class BorrowStats:
    leases: int = 0
    tokens: int = 0
    chunks: int = 0
    completed: int = 0
    revoked: int = 0


class PrefillBorrower(Lease):
    """The lease of one decode instance (attached to it as its
    ``borrower``; the instance hands itself in at each call). ``prefills``
    are the engine's prefill instances, ``prefills[i]`` of index ``i``."""

    def __init__(self, decode: DecodeInstance, profile: PrefillProfile, config: BorrowConfig, loop: EventLoop,
                 prefills: list[PrefillInstance]):
        self.index = decode.index
        self.prefills = prefills
        self.profile = profile
        self.costs = PrefillCosts(profile)
        self.config = config
        self.loop = loop
        self.budget = config.step_token_budget or profile.chunk_tokens
        self.candidates: list[Queued] = []
        self.current: Request | None = None
        self.chunk = 0
        self.stats = BorrowStats()
        decode.borrower = self

    # ------------------------------------------------------------ sizing
    def chunk_tokens(self, decode_step_s: float, batch: int, position: int, remaining: int) -> int:
        """Largest chunk that keeps the mixed step under the lease's target."""
        cfg = self.config
        slack = (1.0 - cfg.margin) * cfg.itl_slo_s - decode_step_s - cfg.chunk_charge_s
        room = self.budget - batch
        if slack <= 0 or room <= 0 or remaining <= 0:
            return 0
        lin = self.costs.inverse_linear_tokens_per_s
        att = self.costs.attention_s_per_token_position
        b = lin + att * position
        k_exact = slack / b if att <= 0 else (-b + math.sqrt(b * b + 2.0 * att * slack)) / att
        k = min(int(k_exact), room)
        if k >= remaining:
            return remaining
        k -= k % cfg.granularity_tokens
        return k if k >= cfg.min_chunk_tokens else 0

    @staticmethod
    def _decode_step_s(dec: DecodeInstance) -> float:
        """Cost of the instance's next decode step without a chunk."""
        return dec.costs.step_s(len(dec.batch), dec.ctx_sum)

    # -------------------------------------------------------- candidates
    def _valid(self, req: Request) -> bool:
        return (not req.cancelled and math.isnan(req.prefill_start_s) and req.decode == self.index
                and req.reserved > 0)

    def _peek(self) -> Request | None:
        heap = self.candidates
        while heap:
            req = heap[0].req
            if self._valid(req):
                return req
            heappop(heap)
        return None

    def queued(self, dec: DecodeInstance, req: Request) -> None:
        """A request holding a reservation on ``dec`` (this lease's instance)
        is waiting in a prefill queue."""
        if not self._valid(req):
            return
        heappush(self.candidates, Queued(self.prefills[req.prefill]._sort_key(req), req))
        if self.current is not None or self.chunk:
            return  # the lease in progress takes the next one when it ends
        now = self.loop.now
        if not dec.batch and dec.wake_t == _INF:
            dec.epoch_t = now
            dec._schedule()
            return
        # Stop the closed-form epoch at its next step boundary if a chunk fits.
        a, k = dec._coeffs()
        steps = dec._steps_done(now - dec.epoch_t)
        if self.chunk_tokens(a + k * steps, len(dec.batch), 0, self.config.min_chunk_tokens) <= 0:
            return
        target = steps + 1
        if target < dec.wake_steps:
            dec._set_wake(target)

    # ------------------------------------------------------------ leases
    def plan_step(self, dec: DecodeInstance) -> bool:
        """Called at a step boundary of the decode instance: plan a chunk for
        the next step and schedule that single step (True), or leave the
        instance to its closed-form batch (False)."""
        dec.step_extra_s = 0.0
        self.chunk = 0
        if dec.batch and dec.finish_heap and dec.finish_heap[0].step <= dec.step:
            return False  # a request completes at this very boundary
        step_s = self._decode_step_s(dec)
        batch = len(dec.batch)
        req = self.current
        if req is None:
            req = self._peek()
            if req is None:
                return False
            cache = self.prefills[req.prefill].cache
            cached = cache.peek(req.key, req.route.cursor_for(req.key, cache))
            if self.chunk_tokens(step_s, batch, cached, req.prompt - cached) <= 0:
                return False
            if not self._start(req):
                return False
        k = self.chunk_tokens(step_s, batch, req.position, req.remaining)
        if k <= 0:
            self._revoke()
            return False
        cost = self.costs.tokens_cost_s(k, req.position)
        if req.load_s > 0:
            cost = max(cost, req.load_s)  # host load-back overlapped with the first chunk
            req.load_s = 0.0
        dec.step_extra_s = cost + self.config.chunk_charge_s
        self.chunk = k
        self.stats.chunks += 1
        dec._set_wake(1)
        return True

    def _start(self, req: Request) -> bool:
        heappop(self.candidates)
        pre = self.prefills[req.prefill]
        match = req.match
        if not pre.remove(req):
            return False
        if match is not None:
            # ``remove`` gave the queued lock back; the request keeps its match.
            pre.cache.lock(match)
            req.match = match
        if not pre._begin(req, self.loop.now):
            # No pool space for its KV: it goes back to the prefill queue.
            if req.match is not None:
                pre.cache.unlock(req.match)
                req.match = None
            pre.enqueue(req)
            return False
        pre.kick()  # the queue's head may have changed
        self.current = req
        self.stats.leases += 1
        return True

    def _revoke(self) -> None:
        req = self.current
        self.current = None
        if req is None:
            return
        pre = self.prefills[req.prefill]
        self.stats.revoked += 1
        pre.resume(req)

    def step_done(self, dec: DecodeInstance, steps: int) -> None:
        """The decode instance completed ``steps`` steps; the planned chunk
        (if any) was part of the first."""
        k = self.chunk
        if not k:
            return
        self.chunk = 0
        dec.step_extra_s = 0.0
        req = self.current
        if req is None:
            raise InvariantViolation("LEASE", "a borrowed chunk ran without a leased request")
        req.remaining -= k
        req.position += k
        self.stats.tokens += k
        if req.remaining <= 0:
            self.current = None
            self.stats.completed += 1
            req.prefill_end_s = self.loop.now
            self.prefills[req.prefill].on_done(req)


@dataclass
class Borrowing:
    """Every decode instance's lease; the engine tells it about queued requests."""

    decodes: list[DecodeInstance]
    borrowers: list[PrefillBorrower] = field(default_factory=list)

    def queued(self, req: Request) -> None:
        if req.decode >= 0 and math.isnan(req.prefill_start_s):
            self.borrowers[req.decode].queued(self.decodes[req.decode], req)

    def stats(self) -> dict[str, int]:
        names = [f.name for f in dataclasses.fields(BorrowStats)]
        return {name: sum(getattr(b.stats, name) for b in self.borrowers) for name in names}


def attach_borrowing(decodes: Sequence[DecodeInstance], prefills: list[PrefillInstance], profile: PrefillProfile,
                     itl_slo_s: float, loop: EventLoop, params: Mapping[str, Any] | None = None) -> Borrowing:
    """A lease on each of ``decodes`` (``decodes[i]`` of index ``i``), of
    prefills from ``prefills``."""
    config = BorrowConfig.from_params(itl_slo_s, params or {})
    return Borrowing(list(decodes), [PrefillBorrower(d, profile, config, loop, prefills) for d in decodes])
