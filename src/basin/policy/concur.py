"""``concur``: an agent window under additive increase and multiplicative
decrease (CONCUR, arXiv 2601.22705), as the paper ported it.

Control law, every ``tick_s``::

    U = decode occupancy (requests reserved, transferring or running on decode
        over decode KV capacity: Signals.decode_used_fraction)
    H = recent prefix hit rate (Signals.hit_rate)
    if U < u_low:                    W += alpha
    elif U > u_high and H < h_thresh: W *= beta
    W = clamp(W, w_min, w_max)

Admission, only at turn boundaries: the active set A holds admitted agents
that are not paused. When ``|A| > floor(W)`` the agents that reach a turn
boundary next are paused (the engine holds their next call; their KV is left
to the cache's LRU); when ``|A| < floor(W)`` paused agents resume first in
FIFO order, then parked new agents are admitted in arrival order. A new agent
is admitted at arrival only if ``|A| < floor(W)`` and nothing is paused or
parked. An agent in A keeps going turn after turn.

Parameters as the paper ran it: ``alpha=2``, ``beta=0.5``, ``u_low=0.2``,
``u_high=0.5`` and the hit-rate threshold raised from 0.2 to ``h_thresh=0.7``;
U is decode occupancy; turn-boundary pausing is on.

Assumptions where the material is silent (all parameters)
---------------------------------------------------------
* ``tick_s=1`` s (about 50 decode steps); ``w_init=4`` (the third-party
  re-implementation); ``w_min=1``; ``w_max`` is the number of agents present
  (admitted, paused or parked), so the window never runs ahead of the
  population during additive increase. A hit rate that is not yet measured
  (NaN) never triggers the decrease.
* The engine applies pauses at control ticks, and a pause takes effect when
  the session's next call comes due. Victims are chosen as the agents that
  reach a boundary soonest: agents already between calls first (most
  recently finished first), then agents whose call in flight was issued
  earliest. Agents marked for pause leave A at once (they are committed).

Settings are :class:`ConcurParams`. The window ``W`` is run state: it starts
at ``w_init``, and a later change of ``w_init`` does not move it (a change of
``w_min`` or ``w_max`` clamps it at the next tick).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from basin.policy.base import Admission, ControlDecision, Policy, SessionInfo, Signals
from basin.policy.params import PolicyParams


@dataclass(frozen=True, slots=True)
class ConcurParams(PolicyParams):
    """CONCUR's settings (see the module docstring for the control law)."""

    policy = "concur"

    #: Additive increase of the window per tick while ``U < u_low``.
    alpha: float = 2.0
    #: Multiplicative decrease while ``U > u_high`` and ``H < h_thresh``.
    beta: float = 0.5
    #: Decode occupancy below which the window grows.
    u_low: float = 0.2
    #: Decode occupancy above which the window may shrink.
    u_high: float = 0.5
    #: The window shrinks only while the hit rate is below this.
    h_thresh: float = 0.7
    #: The window's starting value.
    w_init: float = 4.0
    #: The window never falls below this.
    w_min: float = 1.0
    #: The window never rises above this (None: the agents present).
    w_max: float | None = None
    #: Control tick.
    tick_s: float = 1.0

    def check(self) -> None:
        self.require(0 <= self.alpha < math.inf, "alpha", "must be a finite number >= 0")
        self.require(0 < self.beta <= 1, "beta", "must be in (0, 1]")
        self.require(0 <= self.u_low <= 1, "u_low", "must be in [0, 1]")
        self.require(self.u_low <= self.u_high <= 1, "u_high", "must be in [u_low, 1]")
        self.require(0 <= self.h_thresh <= 1, "h_thresh", "must be in [0, 1]")
        # Below 1 the window's floor can be 0: nothing would ever be admitted.
        self.require(1 <= self.w_min < math.inf, "w_min", "must be a finite number >= 1")
        self.require(self.w_init >= self.w_min, "w_init", "must be >= w_min")
        if self.w_max is not None:
            self.require(self.w_max >= self.w_init, "w_max", "must be >= w_init (or null: the agents present)")
        self.require(self.tick_s > 0 and math.isfinite(self.tick_s), "tick_s", "must be a finite number > 0")


class ConcurPolicy(Policy):
    name = "concur"

    Params = ConcurParams
    params: ConcurParams

    def __init__(self, params: ConcurParams | None = None):
        super().__init__(params)
        #: The agent window ``W`` (run state).
        self.window = self.params.w_init
        #: Active agents: uid -> (in flight?, time of the last event).
        self.active: dict[int, tuple[bool, float]] = {}
        self.paused: dict[int, None] = {}   # FIFO of paused agents
        self.parked: dict[int, None] = {}   # FIFO of new agents not yet admitted

    # ---------------------------------------------------------------- window
    def update_window(self, u: float, h: float) -> float:
        p = self.params
        if u < p.u_low:
            self.window += p.alpha
        elif u > p.u_high and not math.isnan(h) and h < p.h_thresh:
            self.window *= p.beta
        upper = p.w_max if p.w_max is not None else max(
            float(len(self.active) + len(self.paused) + len(self.parked)), p.w_min)
        self.window = min(max(self.window, p.w_min), upper)
        return self.window

    @property
    def limit(self) -> int:
        return int(math.floor(self.window))

    # ---------------------------------------------------------------- events
    def on_session_arrival(self, info: SessionInfo, signals: Signals) -> Admission:
        if not self.paused and not self.parked and len(self.active) < self.limit:
            self.active[info.uid] = (True, signals.now_s)
            return Admission.ADMIT
        self.parked[info.uid] = None
        return Admission.PARK

    def attach(self, active: Sequence[SessionInfo], now_s: float) -> None:
        for info in active:
            self.active.setdefault(info.uid, (False, now_s))

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        if uid in self.active:
            self.active[uid] = (True, now_s)

    def on_call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        if uid in self.active:
            self.active[uid] = (False, now_s)
        return 0.0

    def on_session_finished(self, uid: int, now_s: float) -> None:
        self.active.pop(uid, None)
        self.paused.pop(uid, None)
        self.parked.pop(uid, None)

    # --------------------------------------------------------------- control
    def control(self, signals: Signals, parked: Sequence[int]) -> ControlDecision:
        live = set(parked)
        for uid in [u for u in self.parked if u not in live]:
            del self.parked[uid]
        self.update_window(signals.decode_used_fraction, signals.hit_rate)
        limit = self.limit
        pause: list[int] = []
        resume: list[int] = []
        release: list[int] = []
        if len(self.active) > limit:
            for uid in self.boundary_order()[: len(self.active) - limit]:
                del self.active[uid]
                self.paused[uid] = None
                pause.append(uid)
        else:
            while len(self.active) < limit and self.paused:
                uid = next(iter(self.paused))
                del self.paused[uid]
                self.active[uid] = (False, signals.now_s)
                resume.append(uid)
            while len(self.active) < limit and self.parked:
                uid = next(iter(self.parked))
                del self.parked[uid]
                self.active[uid] = (True, signals.now_s)
                release.append(uid)
        return ControlDecision(release=tuple(release), pause=tuple(pause), resume=tuple(resume),
                               next_tick_s=self.params.tick_s)

    def boundary_order(self) -> list[int]:
        """Active agents by how soon they reach a turn boundary: those between
        calls first (latest finished first), then those in flight (issued
        earliest first)."""
        between = sorted((u for u, (busy, _) in self.active.items() if not busy),
                         key=lambda u: (-self.active[u][1], u))
        busy = sorted((u for u, (b, _) in self.active.items() if b), key=lambda u: (self.active[u][1], u))
        return between + busy
