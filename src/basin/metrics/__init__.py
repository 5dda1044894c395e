"""basin.metrics: goodput, windows, state labels and run IO from a run's tables.

A pure consumer of run records: it reads the ``calls``, ``sessions`` and
``timeseries`` tables that the simulator and the replay client both write, and
knows nothing about either, so a simulated run and a real run are measured by
one piece of code. Definitions and every choice made where the paper is
silent are in docs/metrics.md.
"""

from __future__ import annotations

from basin.metrics._tables import CALLS_COLUMNS, SESSIONS_COLUMNS, TIMESERIES_COLUMNS, Table, floats, nan_percentile
from basin.metrics.cliff import CliffPoints, cache_cliff_points, cliff_median_curve
from basin.metrics.hitrate import binned_hit_rate, calls_hit_rate, hit_rate, hit_rate_per_minute, minutes_hit_rate
from basin.metrics.io import read_run, read_summary, read_table, write_run, write_summary, write_table
from basin.metrics.late import L_LATE_HIGH_S, l_late_s, late_ttft_medians_s
from basin.metrics.latency import binned_median_ttft_s, call_queue_wait_s, call_ttft_s
from basin.metrics.sessions import GoodputRule, SessionMetrics, SessionOutcomes, session_metrics, session_outcomes
from basin.metrics.state import LabelRule, RunState, StateLabel, label_run, pre_trigger_hit_rate
from basin.metrics.summary import RunSummary, summarize_run
from basin.metrics.windows import DegradationRule, WindowStats, window_stats

__all__ = [
    "CALLS_COLUMNS", "SESSIONS_COLUMNS", "TIMESERIES_COLUMNS", "Table", "floats", "nan_percentile",
    "CliffPoints", "cache_cliff_points", "cliff_median_curve",
    "binned_hit_rate", "calls_hit_rate", "hit_rate", "hit_rate_per_minute", "minutes_hit_rate",
    "read_run", "read_summary", "read_table", "write_run", "write_summary", "write_table",
    "L_LATE_HIGH_S", "l_late_s", "late_ttft_medians_s",
    "binned_median_ttft_s", "call_queue_wait_s", "call_ttft_s",
    "GoodputRule", "SessionMetrics", "SessionOutcomes", "session_metrics", "session_outcomes",
    "LabelRule", "RunState", "StateLabel", "label_run", "pre_trigger_hit_rate",
    "RunSummary", "summarize_run",
    "DegradationRule", "WindowStats", "window_stats",
]
