"""Session outcomes and goodput (paper section 7.1).

A session is *good* when it completed, its slowdown is at most 4 and at least
95% of its decode steps met the ITL SLO. Goodput counts good sessions among
the measured arrivals (non-warm sessions arriving in the measurement window)
and divides by the window's length in hours. Dividing by the arrival window,
not by the run length, is what makes "sessions/h" comparable to the arrival
rate: a healthy 3.3 sessions/min run has 198 arrivals an hour, of which the
paper counts about 138 good; the remaining 30 minutes of the run only give
late arrivals time to finish.

Shed and rejected sessions are failures (not completed, never good); a session
still running or waiting at the run's end is a failure too. Warm-start sessions
were injected mid-trajectory to start the run in steady operation and are
excluded: their slowdown has no meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from basin.errors import BasinInputError
from basin.metrics._tables import SECONDS_PER_HOUR, Table, bools, floats, nan_percentile, ratio, require_columns
from basin.metrics.latency import call_ttft_s


@dataclass(frozen=True, slots=True)
class GoodputRule:
    """What makes a completed session good (defaults: paper section 7.1)."""

    #: Largest slowdown (elapsed / unloaded reference) a good session may have.
    max_slowdown: float = 4.0
    #: Largest share of a session's decode steps that may miss the ITL SLO.
    max_itl_violation_share: float = 0.05


@dataclass(frozen=True, slots=True)
class SessionOutcomes:
    """Per-session outcome arrays, aligned with the rows of the sessions table."""

    #: Non-warm and arriving in the measurement window: the population of the session metrics.
    measured: np.ndarray
    #: Finished (finite ``finished_s``) and not shed.
    completed: np.ndarray
    #: ``(finished_s - arrival_s) / reference_s``; NaN unless completed.
    slowdown: np.ndarray
    #: At most ``max_itl_violation_share`` of the decode steps missed the ITL SLO.
    itl_ok: np.ndarray
    #: Completed, slowdown within the limit and ITL within the allowance.
    good: np.ndarray
    #: Shed (or rejected) by a policy.
    shed: np.ndarray
    #: ``first_admitted_s - arrival_s``; for a session never admitted, the time
    #: it had waited by the run's end (a lower bound); NaN for shed sessions.
    first_call_wait_s: np.ndarray
    #: Admitted at some point (finite ``first_admitted_s``).
    started: np.ndarray


def session_outcomes(sessions: Table, *, measure_end_s: float, run_end_s: float,
                     measure_start_s: float = 0.0, rule: GoodputRule = GoodputRule()) -> SessionOutcomes:
    """Classify every session of a run (vectorised over the sessions table).

    ``run_end_s`` censors the first-call wait of sessions that were never
    admitted: they waited at least until the run ended, and dropping them would
    make the longest waits vanish from the percentiles.
    """
    require_columns(sessions, "sessions", ("session_uid", "warm", "arrival_s", "first_admitted_s",
                                           "finished_s", "shed", "reference_s", "decode_steps",
                                           "itl_violations"))
    arrival = floats(sessions, "arrival_s")
    admitted = floats(sessions, "first_admitted_s")
    finished = floats(sessions, "finished_s")
    reference = floats(sessions, "reference_s")
    shed = bools(sessions, "shed")
    warm = bools(sessions, "warm")

    measured = ~warm & (arrival >= measure_start_s) & (arrival < measure_end_s)
    completed = np.isfinite(finished) & ~shed
    bad_reference = completed & measured & ~(np.isfinite(reference) & (reference > 0))
    if bad_reference.any():
        uids = np.asarray(sessions["session_uid"])[bad_reference][:5]
        raise BasinInputError(
            f"sessions table, column 'reference_s': completed sessions {list(uids.tolist())} have no positive "
            "unloaded reference time, so their slowdown is undefined; the producer must compute it"
        )
    slowdown = np.full(arrival.shape, np.nan)
    np.divide(finished - arrival, reference, out=slowdown, where=completed & (reference > 0))

    steps = floats(sessions, "decode_steps")
    violations = floats(sessions, "itl_violations")
    # A tiny slack absorbs float error in limit * steps (0.05 * 60 = 3.0000000000000004).
    itl_ok = violations <= rule.max_itl_violation_share * steps + 1e-9
    good = completed & (slowdown <= rule.max_slowdown) & itl_ok

    started = np.isfinite(admitted)
    wait = np.where(started, admitted - arrival, run_end_s - arrival)
    wait = np.where(shed, np.nan, wait)
    return SessionOutcomes(measured=measured, completed=completed, slowdown=slowdown, itl_ok=itl_ok,
                           good=good, shed=shed, first_call_wait_s=wait, started=started)


@dataclass(frozen=True, slots=True)
class SessionFigures:
    """The session-level figures of one run's measured arrivals: what
    :class:`SessionMetrics` computes and :class:`~basin.metrics.summary.RunSummary` reports."""

    n_measured: int
    n_completed: int
    n_good: int
    n_shed: int
    #: Good measured sessions per hour of the measurement window.
    goodput_per_h: float
    completed_fraction: float
    shed_fraction: float
    #: Percentiles over measured, non-shed sessions (censored at the run's end).
    first_call_wait_p50_s: float
    first_call_wait_p90_s: float
    #: Percentiles over measured, completed sessions.
    slowdown_p50: float
    slowdown_p90: float
    #: Percentiles over the finished calls of measured sessions.
    ttft_p50_s: float
    ttft_p90_s: float
    #: Share of measured sessions with decode steps that exceed the ITL allowance.
    itl_violating_share: float


#: The fields of :class:`SessionFigures`, in order.
SESSION_FIGURES: tuple[str, ...] = tuple(SessionFigures.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class SessionMetrics(SessionFigures):
    """Session-level metrics over the measured arrivals of one run, with the
    window they cover."""

    measure_start_s: float
    measure_end_s: float

    def figures(self) -> dict[str, Any]:
        """The :class:`SessionFigures` part, by field name."""
        return {name: getattr(self, name) for name in SESSION_FIGURES}


def session_metrics(sessions: Table, calls: Table, *, measure_end_s: float, run_end_s: float,
                    measure_start_s: float = 0.0, rule: GoodputRule = GoodputRule()) -> SessionMetrics:
    """Goodput, completion, shedding and latency percentiles of the measured sessions."""
    if not measure_end_s > measure_start_s:
        raise BasinInputError(f"measurement window [{measure_start_s}, {measure_end_s}) s is empty")
    out = session_outcomes(sessions, measure_start_s=measure_start_s, measure_end_s=measure_end_s,
                           run_end_s=run_end_s, rule=rule)
    m = out.measured
    n_measured = int(m.sum())
    n_good = int((out.good & m).sum())
    n_completed = int((out.completed & m).sum())
    n_shed = int((out.shed & m).sum())

    require_columns(calls, "calls", ("session_uid",))
    measured_uids = np.asarray(sessions["session_uid"])[m]
    ttft = call_ttft_s(calls)[np.isin(np.asarray(calls["session_uid"]), measured_uids)]

    decoded = m & (floats(sessions, "decode_steps") > 0)
    window_h = (measure_end_s - measure_start_s) / SECONDS_PER_HOUR
    return SessionMetrics(
        measure_start_s=float(measure_start_s),
        measure_end_s=float(measure_end_s),
        n_measured=n_measured,
        n_completed=n_completed,
        n_good=n_good,
        n_shed=n_shed,
        goodput_per_h=n_good / window_h,
        completed_fraction=ratio(n_completed, n_measured),
        shed_fraction=ratio(n_shed, n_measured),
        first_call_wait_p50_s=nan_percentile(out.first_call_wait_s[m], 50),
        first_call_wait_p90_s=nan_percentile(out.first_call_wait_s[m], 90),
        slowdown_p50=nan_percentile(out.slowdown[m], 50),
        slowdown_p90=nan_percentile(out.slowdown[m], 90),
        ttft_p50_s=nan_percentile(ttft, 50),
        ttft_p90_s=nan_percentile(ttft, 90),
        itl_violating_share=ratio(int((decoded & ~out.itl_ok).sum()), int(decoded.sum())),
    )
