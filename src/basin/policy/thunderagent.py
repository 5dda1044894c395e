"""``thunderagent``: program-level admission against a token ledger
(ThunderAgent, arXiv 2602.13692; router code ``ThunderAgent-org/ThunderAgent``).

The ledger
----------
Every admitted program (session) has ``tokens``: its latest context (prompt
plus output of its last finished call; before its first response, its first
prompt). A program is REASONING while a call of it is in flight or held, and
ACTING between calls (in its tool gap). The backend's use is::

    used = sum(REASONING tokens) + w * sum(ACTING tokens * f(t)) + buffer * n_programs
    remaining = C - used

with ``f(t) = 2 ** (-t / decay_half_life_s)``, ``t`` the seconds since the
program entered ACTING. ``C`` is the *larger* cache tier
(``max(gpu_cache_tokens, host_cache_tokens)``), as the paper ran it.

Decisions
---------
* **Every 5 s** (``tick_s``): first *greedy resume*, then *pause until safe*.

  - Resume: the capacity is ``remaining`` in the resume view (with decay);
    candidates are paused programs whose next call is held (REASONING),
    then new sessions held at arrival (parked), then paused programs still in
    their tool gap (ACTING), each group shortest first. Programs are taken in
    that order while ``sum(tokens + buffer)`` fits, then placed best-fit
    decreasing over the backends (here one: the deployment; the signals are
    deployment totals and the router places calls).
  - Pause (undecayed view) while ``remaining < 0``: the ACTING program with
    the fewest tokens is paused at once (its next call will be held; its KV
    is left to the cache's LRU); when none is left, the smallest REASONING
    program is *marked*: it pauses as soon as its call in flight finishes.

* **At arrival** a new session is held (parked) whenever paused or parked
  work is waiting, or when ``remaining < tokens + buffer``; otherwise it is
  admitted. Calls of admitted, unpaused programs are never gated.
* **Forced resume**: a held call (or a parked new session) that has waited
  ``force_after_s`` (30 min) is released whatever the ledger says.

Assumptions where the material is silent (all parameters)
---------------------------------------------------------
* ``capacity="larger"`` (the paper's port); ``"gpu"`` is the public code's
  device-only bound, ``"sum"`` the Dynamo port's device plus host.
* ``decay="resume"``: the decay is used in the resume view only (the code's
  switch applies it there); ``"none"`` and ``"both"`` (the paper's Eq. 7,
  also in the pause check) are options. ``decay_half_life_s=1`` gives the
  paper's ``f(t) = 2^-t``.
* ``mark_all=False``: marking stops once the marked tokens cover the overflow
  (the paper's rule); ``True`` reproduces the code's quirk of marking every
  REASONING program once no ACTING program is left.
* A program resumed in a tick is not paused again in the same tick (our
  engine applies a tick's pauses before its resumes, so the two cannot be
  combined); it is reconsidered 5 s later.
* ``shared_tokens`` is 0 (its update is never called in the public code);
  ``buffer=100`` tokens per program, ``w=1``.
* The engine tells the policy that a paused session's next call is being
  held (``on_call_held``), as the router sees the request arrive.

Settings are :class:`ThunderAgentParams`; ``update_params`` takes effect at
the next event or tick (the ledger is recomputed from the programs each time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from basin.policy.base import Admission, ControlDecision, Policy, SessionInfo, Signals
from basin.policy.params import PolicyParams

REASONING = "reasoning"
ACTING = "acting"


@dataclass(slots=True)
class Program:
    uid: int
    tokens: int
    arrival_s: float
    status: str = REASONING
    admitted: bool = False
    paused: bool = False
    marked: bool = False
    pending: bool = False  # a call of this paused program is being held
    held_since: float = 0.0
    acting_since: float = 0.0
    steps: int = 0
    #: The ACTING weight is not decayed until this time (a live KV pin).
    resident_until: float = -1.0


def best_fit_decreasing(tokens: dict[int, int], caps: Sequence[float], buffer: int) -> dict[int, int]:
    """Place programs (uid -> tokens) largest first onto the backend with the
    most room left; returns uid -> backend index for the ones placed. A
    backend drops out once its room is at most ``buffer``."""
    room = list(caps)
    placed: dict[int, int] = {}
    for uid in sorted(tokens, key=lambda u: (-tokens[u], u)):
        live = [i for i, r in enumerate(room) if r > buffer]
        if not live:
            break
        best = max(live, key=lambda i: (room[i], -i))
        need = tokens[uid] + buffer
        if need > room[best]:
            continue
        room[best] -= need
        placed[uid] = best
    return placed


@dataclass(frozen=True, slots=True)
class ThunderAgentParams(PolicyParams):
    """ThunderAgent's settings (see the module docstring for each rule)."""

    policy = "thunderagent"

    #: Control tick (resume, then pause until safe).
    tick_s: float = 5.0
    #: Tokens added per counted program.
    buffer: int = 100
    #: ``w``: weight of an ACTING program's tokens.
    acting_weight: float = 1.0
    #: Where ACTING weights decay: nowhere, in the resume view, or in both views.
    decay: Literal["none", "resume", "both"] = "resume"
    #: Half-life of the ACTING decay ``f(t) = 2 ** (-t / half_life)``.
    decay_half_life_s: float = 1.0
    #: ``C``: the larger cache tier, the GPU tier, or their sum.
    capacity: Literal["larger", "gpu", "sum"] = "larger"
    #: ``C`` is multiplied by this.
    capacity_scale: float = 1.0
    #: A held call or parked session goes through after waiting this long.
    force_after_s: float = 1800.0
    #: Mark every REASONING program once no ACTING one is left (the code's quirk).
    mark_all: bool = False

    def check(self) -> None:
        self.require(self.tick_s > 0 and math.isfinite(self.tick_s), "tick_s", "must be a finite number > 0")
        self.require(self.buffer >= 0, "buffer", "must be >= 0")
        self.require(0 <= self.acting_weight < math.inf, "acting_weight", "must be a finite number >= 0")
        self.require(self.decay_half_life_s > 0, "decay_half_life_s", "must be > 0")
        self.require(0 < self.capacity_scale < math.inf, "capacity_scale", "must be a finite number > 0")
        self.require(self.force_after_s >= 0, "force_after_s", "must be >= 0")


class ThunderAgentPolicy(Policy):
    name = "thunderagent"

    Params = ThunderAgentParams
    params: ThunderAgentParams

    def __init__(self, params: ThunderAgentParams | None = None):
        super().__init__(params)
        self.programs: dict[int, Program] = {}
        self.parked: dict[int, Program] = {}  # new sessions held at arrival, in arrival order
        self.signals: Signals | None = None

    # --------------------------------------------------------------- ledger
    def capacity(self) -> float:
        sig = self.signals
        if sig is None:
            return float("inf")
        gpu, host = sig.gpu_cache_tokens, sig.host_cache_tokens
        c = {"larger": max(gpu, host), "gpu": gpu, "sum": gpu + host}[self.params.capacity]
        return c * self.params.capacity_scale

    def weight(self, p: Program, now: float, decayed: bool) -> float:
        if p.status == REASONING:
            return float(p.tokens)
        w = self.params.acting_weight * p.tokens
        if decayed and now >= p.resident_until:
            w *= 2.0 ** (-max(now - p.acting_since, 0.0) / self.params.decay_half_life_s)
        return w

    def counted(self) -> Iterable[Program]:
        """Programs the backend carries: admitted and not paused (marked
        programs count until their call finishes)."""
        return (p for p in self.programs.values() if p.admitted and not p.paused)

    def remaining(self, now: float, view: str = "pause") -> float:
        decayed = self.params.decay == "both" or (self.params.decay == "resume" and view == "resume")
        used = 0.0
        n = 0
        for p in self.counted():
            used += self.weight(p, now, decayed)
            n += 1
        return self.capacity() - used - self.params.buffer * n

    # --------------------------------------------------------------- events
    def on_session_arrival(self, info: SessionInfo, signals: Signals) -> Admission:
        self.signals = signals
        p = Program(info.uid, info.first_prompt_tokens, info.arrival_s)
        if self.parked or any(q.paused for q in self.programs.values()):
            self.parked[info.uid] = p
            return Admission.PARK
        if self.remaining(signals.now_s) >= p.tokens + self.params.buffer:
            p.admitted = True
            self.programs[info.uid] = p
            return Admission.ADMIT
        self.parked[info.uid] = p
        return Admission.PARK

    def attach(self, active: Sequence[SessionInfo], now_s: float) -> None:
        for info in active:
            if info.uid not in self.programs:
                self.programs[info.uid] = Program(info.uid, info.first_prompt_tokens, info.arrival_s,
                                                  status=ACTING, admitted=True, acting_since=now_s, steps=1)

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        p = self.programs.get(uid)
        if p is None:
            return
        p.status = REASONING
        p.pending = False
        p.steps += 1

    def on_call_held(self, uid: int, now_s: float) -> None:
        """The engine holds this paused program's next call."""
        p = self.programs.get(uid)
        if p is not None:
            p.status = REASONING
            p.pending = True
            p.held_since = now_s

    def on_call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        p = self.programs.get(uid)
        if p is not None:
            p.tokens = context_tokens
            p.status = ACTING
            p.acting_since = now_s
            if p.marked:
                p.marked = False
                p.paused = True
        return 0.0

    def on_session_finished(self, uid: int, now_s: float) -> None:
        self.programs.pop(uid, None)
        self.parked.pop(uid, None)

    # -------------------------------------------------------------- control
    def control(self, signals: Signals, parked: Sequence[int]) -> ControlDecision:
        self.signals = signals
        now = signals.now_s
        # Parked sessions the engine no longer holds (shed elsewhere) are dropped.
        live = set(parked)
        for uid in [u for u in self.parked if u not in live]:
            del self.parked[uid]
        release: list[int] = []
        resume: list[int] = []
        self._forced(now, release, resume)
        self._greedy_resume(now, release, resume)
        pause = self._pause_until_safe(now, exclude=set(resume) | set(release))
        return ControlDecision(release=tuple(release), resume=tuple(resume), pause=tuple(pause),
                               next_tick_s=self.params.tick_s)

    def _admit_parked(self, p: Program) -> None:
        del self.parked[p.uid]
        p.admitted = True
        p.status = REASONING
        self.programs[p.uid] = p

    def _resume(self, p: Program) -> None:
        p.paused = False
        p.marked = False

    def _forced(self, now: float, release: list[int], resume: list[int]) -> None:
        for p in list(self.parked.values()):
            if now - p.arrival_s >= self.params.force_after_s:
                self._admit_parked(p)
                release.append(p.uid)
        for p in self.programs.values():
            if p.paused and p.pending and now - p.held_since >= self.params.force_after_s:
                self._resume(p)
                resume.append(p.uid)

    def resume_order(self) -> list[Program]:
        paused = [p for p in self.programs.values() if p.paused]
        reasoning = sorted((p for p in paused if p.pending), key=lambda p: (p.tokens, p.uid))
        new = sorted(self.parked.values(), key=lambda p: (p.tokens, p.uid))
        acting = sorted((p for p in paused if not p.pending), key=lambda p: (p.tokens, p.uid))
        return reasoning + new + acting

    def _greedy_resume(self, now: float, release: list[int], resume: list[int]) -> None:
        room = self.remaining(now, view="resume")
        if room <= self.params.buffer:
            return
        picked: list[Program] = []
        total = 0
        for p in self.resume_order():
            need = p.tokens + self.params.buffer
            if total + need > room:
                break
            picked.append(p)
            total += need
        if not picked:
            return
        placed = best_fit_decreasing({p.uid: p.tokens for p in picked}, [room], self.params.buffer)
        for p in picked:
            if p.uid not in placed:
                continue
            if p.uid in self.parked:
                self._admit_parked(p)
                release.append(p.uid)
            else:
                self._resume(p)
                resume.append(p.uid)

    def _pause_until_safe(self, now: float, exclude: set[int]) -> list[int]:
        overflow = -self.remaining(now, view="pause")
        if overflow <= 0:
            return []
        decayed = self.params.decay == "both"
        pause: list[int] = []
        candidates = [p for p in self.counted() if p.uid not in exclude and not p.marked]
        acting = sorted((p for p in candidates if p.status == ACTING), key=lambda p: (p.tokens, p.uid))
        for p in acting:
            if overflow <= 0:
                return pause
            overflow -= self.weight(p, now, decayed) + self.params.buffer
            p.paused = True
            pause.append(p.uid)
        if overflow <= 0:
            return pause
        reasoning = sorted((p for p in candidates if p.status == REASONING), key=lambda p: (p.tokens, p.uid))
        marked = 0.0
        for p in reasoning:
            if not self.params.mark_all and marked >= overflow:
                break
            p.marked = True
            marked += p.tokens + self.params.buffer
            pause.append(p.uid)
        return pause
