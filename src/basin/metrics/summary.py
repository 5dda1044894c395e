"""One run's headline numbers: the record sweeps, reports and plots compare.

:func:`summarize_run` is the single entry point from the three run tables to a
:class:`RunSummary`; everything it reports is defined in the sibling modules
and in docs/metrics.md. The summary is JSON-serialisable with NaN written as
``null`` (JSON has no NaN), and reads back equal.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from basin.errors import BasinInputError
from basin.jsonvalues import json_value
from basin.metrics._tables import (
    CALLS_COLUMNS,
    SESSIONS_COLUMNS,
    TIMESERIES_COLUMNS,
    Table,
    floats,
    require_columns,
)
from basin.metrics.late import l_late_s as compute_l_late_s
from basin.metrics.sessions import GoodputRule, SessionFigures, session_metrics
from basin.metrics.state import LabelRule, RunState, label_run, pre_trigger_hit_rate
from basin.metrics.windows import DegradationRule, WindowStats, window_stats


@dataclass(frozen=True, slots=True)
class RunSummary(SessionFigures):
    """Headline metrics of one run (times in seconds, rates per hour): the
    session figures over the measured arrivals (non-warm, arriving in
    ``[0, measure_end_s)``; :class:`~basin.metrics.sessions.SessionFigures`),
    then the run's own."""

    system: str
    duration_s: float
    measure_end_s: float
    #: Start of the surge; None for a run without one.
    trigger_s: float | None
    #: The ITL SLO the producer counted ``itl_violations`` against (recorded, not re-applied).
    itl_slo_s: float

    # State of the run at its end.
    state: RunState
    state_reason: str
    #: ``1 - severity(last) / severity(second to last)`` of the final windows.
    state_improvement: float
    #: The final windows end less than 35 min after the trigger (label computed anyway).
    state_windows_too_early: bool
    hit_rate_pre: float
    #: Hit rate of the last full window.
    hit_rate_final: float
    #: Median TTFT of the last full window.
    ttft_p50_final_s: float
    #: Active (admitted, unfinished) sessions at the end of the last minute.
    active_sessions_final: float
    l_late_s: float
    windows: tuple[WindowStats, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: the state as its name, NaN as None."""
        out = asdict(self)
        # The run's identity first, as written before the session figures became the base class.
        out = {**{name: out[name] for name in _LEADING}, **out}
        out["state"] = self.state.value
        # ``degraded`` is derived (a property) but written for readers of the JSON; from_dict ignores it.
        out["windows"] = [{**asdict(w), "degraded": w.degraded} for w in self.windows]
        return json_value(out)

    def to_json(self, *, indent: int | None = 2) -> str:
        """Strict JSON (``allow_nan=False``): any stray NaN is a bug, not a number."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        """Inverse of :meth:`to_dict`."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        missing = names - set(data)
        if unknown or missing:
            raise BasinInputError(
                f"run summary: unknown field(s) {sorted(unknown)}, missing field(s) {sorted(missing)}")
        values = {f.name: _none_to_nan(data[f.name], f.type) for f in fields(cls)}
        values["state"] = RunState(values["state"])
        values["windows"] = tuple(
            WindowStats(**{f.name: _none_to_nan(w[f.name], f.type) for f in fields(WindowStats)})
            for w in data["windows"])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> RunSummary:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))


#: The fields :meth:`RunSummary.to_dict` writes first.
_LEADING = ("system", "duration_s", "measure_end_s", "trigger_s", "itl_slo_s")


def _none_to_nan(value: Any, annotation: object) -> Any:
    # Annotations are strings (postponed evaluation); only plain floats stored NaN as None.
    return float("nan") if value is None and annotation == "float" else value


def summarize_run(calls: Table, sessions: Table, timeseries: Table, *, system: str, trigger_s: float | None,
                  duration_s: float, measure_end_s: float, itl_slo_s: float = 0.05,
                  goodput_rule: GoodputRule = GoodputRule(),
                  degradation_rule: DegradationRule = DegradationRule(),
                  label_rule: LabelRule = LabelRule()) -> RunSummary:
    """Compute every headline metric of one run from its three tables.

    ``measure_end_s`` bounds the arrivals the session metrics cover (90 min
    of a 2 h run); ``trigger_s`` is the surge start (None without a surge).
    """
    require_columns(calls, "calls", CALLS_COLUMNS)
    require_columns(sessions, "sessions", SESSIONS_COLUMNS)
    n_minutes = require_columns(timeseries, "timeseries", TIMESERIES_COLUMNS)
    if not 0 < measure_end_s <= duration_s:
        raise BasinInputError(f"measure_end_s={measure_end_s} must lie in (0, duration_s={duration_s}]")

    sm = session_metrics(sessions, calls, measure_end_s=measure_end_s, run_end_s=duration_s, rule=goodput_rule)
    windows = window_stats(calls, sessions, timeseries, duration_s=duration_s, rule=degradation_rule)
    hit_pre = pre_trigger_hit_rate(timeseries, trigger_s=trigger_s, window_s=degradation_rule.window_s,
                                   rule=label_rule)
    label = label_run(windows, hit_rate_pre=hit_pre, trigger_s=trigger_s, rule=label_rule)

    active = floats(timeseries, "active_sessions")
    minute = floats(timeseries, "minute")
    active_final = float(active[np.argmax(minute)]) if n_minutes else float("nan")
    last = windows[-1] if windows else None
    nan = float("nan")
    return RunSummary(
        system=system,
        duration_s=float(duration_s),
        measure_end_s=float(measure_end_s),
        trigger_s=None if trigger_s is None else float(trigger_s),
        itl_slo_s=float(itl_slo_s),
        **sm.figures(),
        state=label.state,
        state_reason=label.reason,
        state_improvement=label.improvement,
        state_windows_too_early=label.windows_too_early,
        hit_rate_pre=hit_pre,
        hit_rate_final=last.hit_rate if last else nan,
        ttft_p50_final_s=last.ttft_p50_s if last else nan,
        active_sessions_final=active_final,
        l_late_s=compute_l_late_s(calls, duration_s=duration_s),
        windows=windows,
    )
