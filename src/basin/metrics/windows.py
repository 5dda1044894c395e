"""Twenty-minute windows and the degradation rule (paper section 7.1).

Windows are aligned at the run's start, ``[0, 20)``, ``[20, 40)``, ... minutes;
a partial last window is dropped, so every window sees the same amount of
time. A window is *degraded* when its median TTFT exceeds 5 s, the median
first-call wait of the sessions arriving in it exceeds 5 minutes, or at least
25% of those sessions never start. The three rules cover the three ways a
system can fail new work: slow calls on the engine, long parking at a gateway,
and turning sessions away.

"Never start" is decided at the run's end, with a grace period: a session
never started if it was shed (or rejected), or if it was still not admitted
when the run ended after waiting at least ``never_start_grace_s`` (default 5
minutes, the wait threshold). A session that arrived less than the grace
before the run's end and is still waiting is *undetermined*: it is left out of
the never-start share and of the median wait, since a healthy gateway that
parks for a minute or two would otherwise look like it turns sessions away
at the end of every run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basin.metrics._tables import SECONDS_PER_MINUTE, Table, bin_counts, binned_median, floats
from basin.metrics.hitrate import binned_hit_rate
from basin.metrics.latency import binned_median_ttft_s
from basin.metrics.sessions import session_outcomes


@dataclass(frozen=True, slots=True)
class DegradationRule:
    """Thresholds of the degraded-window rule (defaults: paper section 7.1)."""

    window_s: float = 1200.0
    #: Degraded above this median TTFT.
    max_ttft_p50_s: float = 5.0
    #: Degraded above this median first-call wait.
    max_first_call_wait_p50_s: float = 300.0
    #: Degraded at or above this share of arriving sessions that never start.
    max_never_start_share: float = 0.25
    #: A session still waiting at the run's end counts as never started only
    #: after waiting this long; before that it is undetermined.
    never_start_grace_s: float = 300.0


@dataclass(frozen=True, slots=True)
class WindowStats:
    """What one window saw and whether it was degraded."""

    start_s: float
    end_s: float
    #: Calls (any session, warm ones included) whose first token came in the window.
    n_first_tokens: int
    ttft_p50_s: float
    #: Non-warm sessions arriving in the window.
    n_arrivals: int
    #: Arrivals whose start is decided (started, shed, or waited past the grace).
    n_determined: int
    n_never_started: int
    #: Median over determined, non-shed arrivals; never-started ones count with
    #: the time they had waited by the run's end (a lower bound).
    first_call_wait_p50_s: float
    never_start_fraction: float
    #: Prefix hit rate of the prefills finished in the window (timeseries).
    hit_rate: float
    degraded_ttft: bool
    degraded_wait: bool
    degraded_never_start: bool
    #: How far past its threshold the worst criterion is: the largest of
    #: ``ttft_p50 / 5 s``, ``wait_p50 / 300 s`` and ``never_start / 0.25``
    #: (NaN parts ignored; 0 when none is measured). Degraded windows have
    #: severity >= 1; a later window improves when its severity is lower.
    severity: float

    @property
    def degraded(self) -> bool:
        """Any of the three rules fired."""
        return self.degraded_ttft or self.degraded_wait or self.degraded_never_start


def window_stats(calls: Table, sessions: Table, timeseries: Table, *, duration_s: float,
                 rule: DegradationRule = DegradationRule()) -> tuple[WindowStats, ...]:
    """Statistics of every full window of a run of ``duration_s`` seconds."""
    n_windows = int(np.floor(duration_s / rule.window_s + 1e-9))
    edges_s = np.arange(n_windows + 1, dtype=np.float64) * rule.window_s
    ttft_p50, n_first = binned_median_ttft_s(calls, edges_s)
    hit = binned_hit_rate(timeseries, edges_s / SECONDS_PER_MINUTE)

    # The measurement window here is the whole run: every non-warm arrival.
    out = session_outcomes(sessions, measure_end_s=duration_s, run_end_s=duration_s)
    arrival = floats(sessions, "arrival_s")
    pending = ~out.started & ~out.shed
    never = out.shed | (pending & (duration_s - arrival >= rule.never_start_grace_s))
    determined = out.started | never
    counted = out.measured & determined

    n_arrivals = bin_counts(arrival[out.measured], edges_s)
    n_determined = bin_counts(arrival[counted], edges_s)
    n_never = bin_counts(arrival[counted & never], edges_s)
    wait_p50, _ = binned_median(np.where(counted, arrival, np.nan), out.first_call_wait_s, edges_s)

    stats = []
    for i in range(n_windows):
        never_frac = n_never[i] / n_determined[i] if n_determined[i] > 0 else float("nan")
        parts = np.array([ttft_p50[i] / rule.max_ttft_p50_s,
                          wait_p50[i] / rule.max_first_call_wait_p50_s,
                          never_frac / rule.max_never_start_share])
        parts = parts[np.isfinite(parts)]
        stats.append(WindowStats(
            start_s=float(edges_s[i]),
            end_s=float(edges_s[i + 1]),
            n_first_tokens=int(n_first[i]),
            ttft_p50_s=float(ttft_p50[i]),
            n_arrivals=int(n_arrivals[i]),
            n_determined=int(n_determined[i]),
            n_never_started=int(n_never[i]),
            first_call_wait_p50_s=float(wait_p50[i]),
            never_start_fraction=float(never_frac),
            hit_rate=float(hit[i]),
            degraded_ttft=bool(ttft_p50[i] > rule.max_ttft_p50_s),
            degraded_wait=bool(wait_p50[i] > rule.max_first_call_wait_p50_s),
            degraded_never_start=bool(never_frac >= rule.max_never_start_share),
            severity=float(parts.max()) if parts.size else 0.0,
        ))
    return tuple(stats)

