"""The population over time for an arrival schedule: Eq. 1, and Eq. 3 with
an admission budget, integrated with ``scipy.integrate.solve_ivp``.

Without admission every arrival joins the active population:
``dN/dt = lambda(t) - D(N)``. With admission a gateway holds first calls in a
queue ``Q`` and lets them in at rate ``I(t)``:
``dN/dt = I - D(N)``, ``dQ/dt = lambda - I``. The budget is a working set in
tokens, so it admits up to ``N_B = B / c_bar`` sessions; the gateway admits
arrivals and parked sessions (within a control interval ``tau``) while the
population is below ``N_B`` and only replaces departures at the budget:
``I = max(0, min(lambda + Q / tau, departures + (N_B - N) / tau))``.

Stages of progress. Eq. 1 counts every finished call as ``1/K`` of a
departure, so a surge's new sessions start leaving at once. They cannot: a
session leaves after its last call, and sessions that arrived in a surge are
still at their first calls when it ends (in the calibrated simulator, the
+100% surge's ten minutes see about 4 departures a minute while calls finish
at 4.5-5.3 sessions' worth). The integration therefore splits the population into
``M`` equal stages of progress through a session's calls (the linear chain
of an Erlang-``M`` number of calls): every session advances at the
population's per-session call rate ``X(N) / N``, a stage is ``K / M`` calls,
and sessions leave from the last stage. In steady state the stages hold equal
shares and departures are exactly ``X(N) / K``, so ``D(N)``, its equilibria
and the band are unchanged; only transients lag. ``M = 1`` is Eq. 1 itself.
The default ``M`` is derived from the workload (``K^2 / Var K``, the Erlang
shape with the same spread of calls per session; 2 for terminal-bench).

Time is in minutes and rates in sessions per minute throughout. Arrival
schedules are :class:`basin.workload.arrivals.PoissonSchedule` objects, the
same a scenario builds, read through their ``rate_at``: the fluid model sees
the schedule's rate, not its random draws. Integration runs piece by piece
between the schedule's breakpoints so no step straddles a jump in the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.integrate import solve_ivp

from basin.errors import BasinInputError
from basin.model.equilibria import stable_and_unstable
from basin.model.throughput import FluidModel
from basin.workload.arrivals import PoissonSchedule

Outcome = Literal["recovers", "trapped", "overloaded", "backlog"]

#: The paper's admission margin below the cliff (m = 0.9).
DEFAULT_MARGIN = 0.9
#: The controller's interval (CALIBRATION.md: 30 s), in minutes.
DEFAULT_TAU_MIN = 0.5
#: Largest integration step (minutes): keeps the solver from stepping over a
#: short surge it has not yet seen the effect of.
MAX_STEP_MIN = 0.25


@dataclass(frozen=True, slots=True)
class AdmissionBudget:
    """A working-set budget in tokens and the control interval that enforces it."""

    tokens: float
    tau_min: float = DEFAULT_TAU_MIN

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tokens) and self.tokens > 0):
            raise BasinInputError(f"admission budget: expected a number of tokens > 0, got {self.tokens!r}")
        if not (math.isfinite(self.tau_min) and self.tau_min > 0):
            raise BasinInputError(f"admission tau_min: expected minutes > 0, got {self.tau_min!r}")


def reference_budget(model: FluidModel, margin: float = DEFAULT_MARGIN) -> AdmissionBudget:
    """The default budget: the cliff with the paper's margin, ``m x_k C``.

    The paper's reference ``B0 = min(m x_k C, C)`` bounds the sum of each
    session's *predicted peak* context, which covers growth the session has
    not made yet; the fluid model counts current contexts (``W = N c_bar``),
    the quantity the cliff itself is measured in, so its budget is the cliff
    term alone. It stays below the unstable equilibrium whenever the cliff
    does, which is what keeps an admitted population out of the trap.
    """
    if not (math.isfinite(margin) and 0 < margin <= 1):
        raise BasinInputError(f"admission margin: expected a number in (0, 1], got {margin!r}")
    p = model.params
    return AdmissionBudget(margin * p.knee_ratio * p.cache_tokens)


@dataclass(frozen=True)
class Trajectory:
    """The integrated population (and parked queue) on a time grid, with its verdict."""

    t_min: np.ndarray
    n: np.ndarray
    q: np.ndarray
    rate_per_min: np.ndarray
    departures_per_min: np.ndarray
    outcome: Outcome
    final_rate_per_min: float
    n_stable: float | None
    n_unstable: float | None
    budget_sessions: float | None
    stages: int = 1

    @property
    def peak_n(self) -> float:
        return float(np.max(self.n))

    def summary(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "n_start": float(self.n[0]),
            "n_peak": self.peak_n,
            "n_end": float(self.n[-1]),
            "queue_peak": float(np.max(self.q)),
            "queue_end": float(self.q[-1]),
            "final_rate_per_min": self.final_rate_per_min,
            "n_stable_final": self.n_stable,
            "n_unstable_final": self.n_unstable,
            "budget_sessions": self.budget_sessions,
            "stages": self.stages,
        }


def _breakpoints(schedule: PoissonSchedule, duration_min: float) -> list[float]:
    points = {0.0, duration_min}
    points.update(c.at_min for c in schedule.rate_changes)
    points.update(t for s in schedule.surges for t in (s.start_min, s.end_min))
    return sorted(p for p in points if 0.0 <= p <= duration_min)


def _verdict(model: FluidModel, n_end: float, q_end: float, rate: float,
             budget_n: float | None) -> tuple[Outcome, float | None, float | None]:
    ns, nu = stable_and_unstable(model, rate)
    if ns is None:
        # No balance at this rate: without admission the population grows,
        # with it the parked queue does.
        return ("overloaded" if budget_n is None else "backlog"), ns, nu
    if nu is not None and n_end > nu:
        return "trapped", ns, nu
    if q_end >= 1.0:
        # Still parked sessions at the end (a fraction of one counts as drained).
        return "backlog", ns, nu
    return "recovers", ns, nu


def integrate(model: FluidModel, schedule: PoissonSchedule, duration_min: float, n0: float,
              budget: AdmissionBudget | None = None, q0: float = 0.0, stages: int | None = None,
              points_per_min: int = 4) -> Trajectory:
    """Integrate the population from ``n0`` (and ``q0`` parked) over ``duration_min``.

    ``stages`` (default: the parameters' ``progress_stages``) splits the
    population into equal stages of progress through a session's calls
    (module docstring); 1 is the paper's Eq. 1 exactly.

    The verdict reads the end state against the equilibria of the final
    arrival rate: beyond ``N_u`` the population is trapped (it only grows from
    there), below it the run recovers; with no equilibrium the rate exceeds
    the departure peak (overloaded). With a budget, the population cannot
    pass ``N_B``; what remains is whether the parked queue has drained.
    """
    if not (math.isfinite(duration_min) and duration_min > 0):
        raise BasinInputError(f"duration: expected minutes > 0, got {duration_min!r}")
    if not (math.isfinite(n0) and n0 >= 0):
        raise BasinInputError(f"initial population: expected a number of sessions >= 0, got {n0!r}")
    if not (math.isfinite(q0) and q0 >= 0):
        raise BasinInputError(f"initial queue: expected a number of sessions >= 0, got {q0!r}")
    m_stages = model.params.progress_stages if stages is None else stages
    if isinstance(m_stages, bool) or not isinstance(m_stages, int) or m_stages < 1:
        raise BasinInputError(f"stages: expected a whole number >= 1 (1 is the paper's Eq. 1), got {m_stages!r}")
    budget_n = None if budget is None else budget.tokens / model.params.mean_context_tokens
    k = model.params.calls_per_session

    def rate(t_min: float) -> float:
        return float(schedule.rate_at(t_min * 60.0))

    def stage_rate(n: float) -> float:
        """Per-session rate of passing one stage, per minute: calls per session
        per minute (X / N) times stages per call (M / K)."""
        if n <= 1e-12:
            x0 = float(model.closed_loop_bound(1e-6)) / 1e-6  # the limit of X / N at N -> 0
            return 60.0 * x0 * m_stages / k
        return 60.0 * float(model.throughput(n)) / n * m_stages / k

    def rhs(t: float, y: np.ndarray, lam: float) -> np.ndarray:
        stages_n = np.maximum(y[:-1], 0.0)
        q = max(y[-1], 0.0)
        n = float(stages_n.sum())
        r = stage_rate(n)
        out = r * stages_n            # flow out of each stage
        departures = out[-1]
        if budget_n is None or budget is None:  # budget_n is None exactly when budget is
            inflow = lam
        else:
            inflow = max(0.0, min(lam + q / budget.tau_min, departures + (budget_n - n) / budget.tau_min))
        dy = np.empty_like(y)
        dy[0] = inflow - out[0]
        dy[1:-1] = out[:-1] - out[1:]
        dy[-1] = lam - inflow if budget_n is not None else 0.0
        return dy

    ts: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    y = np.concatenate([np.full(m_stages, float(n0) / m_stages), [float(q0)]])
    edges = _breakpoints(schedule, duration_min)
    for a, b in zip(edges[:-1], edges[1:]):
        lam = rate(a)
        grid = np.linspace(a, b, max(2, int(math.ceil((b - a) * points_per_min)) + 1))
        sol = solve_ivp(rhs, (a, b), y, t_eval=grid, args=(lam,), method="LSODA",
                        max_step=MAX_STEP_MIN, rtol=1e-6, atol=1e-6)
        if not sol.success:
            raise RuntimeError(f"fluid model integration failed on [{a:g}, {b:g}] min: {sol.message}")
        keep = slice(0, None) if not ts else slice(1, None)
        ts.append(sol.t[keep])
        ys.append(np.maximum(sol.y[:, keep], 0.0))
        y = np.maximum(sol.y[:, -1], 0.0)
    t = np.concatenate(ts)
    yy = np.concatenate(ys, axis=1)
    n_t = yy[:-1].sum(axis=0)
    departures = np.array([stage_rate(float(v)) for v in n_t]) * yy[-2]
    lam_t = np.array([rate(min(v, duration_min - 1e-9)) for v in t])
    final_rate = rate(duration_min - 1e-9)
    outcome, ns, nu = _verdict(model, float(n_t[-1]), float(yy[-1, -1]), final_rate, budget_n)
    return Trajectory(t, n_t, yy[-1], lam_t, departures, outcome, final_rate, ns, nu, budget_n, m_stages)
