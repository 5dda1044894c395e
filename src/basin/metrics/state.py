"""The run state label: healthy, recovering, overloaded or trapped (paper section 7.1).

The label looks at the last two full 20-minute windows, W1 then W2:

* both degraded, not improving, and both with a hit rate at least 0.10 below
  the pre-trigger rate: **trapped** (reuse collapsed and stays collapsed);
* W2 degraded and not improving otherwise: **overloaded** (degraded, but the
  cache still works: plain lack of capacity, not the metastable trap);
* W2 degraded and improving on W1, or W1 degraded and W2 no longer:
  **recovering**;
* neither degraded: **healthy**.

"Improving" compares the windows' severities (see
:attr:`basin.metrics.windows.WindowStats.severity`: how many times over its
threshold the worst criterion is): W2 improves when its severity is at least
25% below W1's. A single dimensionless measure lets a window whose TTFT falls
but whose parked queue grows count as not improving. A degradation that
starts only in W2 is not improving either (it got worse).

The windows must end at least 35 minutes after the trigger so that the surge
itself is over; a run too short for that still gets a label, flagged with
``windows_too_early``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from basin.metrics._tables import Table
from basin.metrics.hitrate import minutes_hit_rate
from basin.metrics.windows import WindowStats

_MINUTE_S = 60.0


class RunState(str, Enum):
    """State of a run at its end."""

    HEALTHY = "healthy"
    RECOVERING = "recovering"
    OVERLOADED = "overloaded"
    TRAPPED = "trapped"
    #: Fewer than two full windows: the rule cannot be applied.
    UNDETERMINED = "undetermined"


@dataclass(frozen=True, slots=True)
class LabelRule:
    """Parameters of the state label (defaults: paper section 7.1)."""

    #: W2 improves on W1 when its severity is at least this share lower.
    min_improvement: float = 0.25
    #: Reuse is lost when a window's hit rate is at least this far below the pre-trigger rate.
    min_hit_rate_drop: float = 0.10
    #: Both windows must end at least this long after the trigger.
    min_end_after_trigger_s: float = 2100.0
    #: Minutes at the run's start left out of the pre-trigger hit rate (cold cache of warm sessions).
    warmup_s: float = 300.0
    #: Shortest pre-trigger period worth skipping the warm-up for; shorter ones use [0, trigger).
    min_reference_s: float = 300.0


@dataclass(frozen=True, slots=True)
class StateLabel:
    """A state and the facts it rests on."""

    state: RunState
    #: One sentence saying which rule decided.
    reason: str
    #: ``1 - severity(W2) / severity(W1)``; NaN when W1 has no measured criterion.
    improvement: float
    #: Both final windows are at least ``min_hit_rate_drop`` below ``hit_rate_pre``.
    reuse_lost: bool
    hit_rate_pre: float
    #: The final windows end less than ``min_end_after_trigger_s`` after the trigger.
    windows_too_early: bool


def pre_trigger_hit_rate(timeseries: Table, *, trigger_s: float | None, window_s: float = 1200.0,
                         rule: LabelRule = LabelRule()) -> float:
    """Hit rate of the healthy reference period the final windows are compared with.

    With a trigger: minutes ``[warmup, trigger)``, skipping the warm-up in which
    warm-start sessions refill a cold cache; if that leaves less than
    ``min_reference_s``, the whole ``[0, trigger)``. Without a trigger (a run
    with no surge): the first window after the warm-up, ``[warmup, window_s)``.
    NaN when the period is empty or has no prefill.
    """
    if trigger_s is None:
        start_s, end_s = rule.warmup_s, window_s
    elif trigger_s - rule.warmup_s >= rule.min_reference_s:
        start_s, end_s = rule.warmup_s, trigger_s
    else:
        start_s, end_s = 0.0, trigger_s
    return minutes_hit_rate(timeseries, start_s / _MINUTE_S, end_s / _MINUTE_S)


def label_run(windows: tuple[WindowStats, ...], *, hit_rate_pre: float, trigger_s: float | None,
              rule: LabelRule = LabelRule()) -> StateLabel:
    """Label a run from its windows (see the module docstring for the rules)."""
    nan = float("nan")
    if len(windows) < 2:
        return StateLabel(RunState.UNDETERMINED, f"only {len(windows)} full window(s); the label needs two",
                          nan, False, hit_rate_pre, True)
    w1, w2 = windows[-2], windows[-1]
    improvement = 1.0 - w2.severity / w1.severity if w1.severity > 0 else nan
    # The slack keeps an improvement of exactly 25% (up to float error) on the improving side.
    improving = w1.degraded and improvement >= rule.min_improvement - 1e-12
    limit = hit_rate_pre - rule.min_hit_rate_drop + 1e-12
    reuse_lost = bool(w1.hit_rate <= limit and w2.hit_rate <= limit)
    too_early = w1.end_s < (trigger_s or 0.0) + rule.min_end_after_trigger_s

    if not w1.degraded and not w2.degraded:
        state, reason = RunState.HEALTHY, "neither final window is degraded"
    elif not w2.degraded:
        state, reason = RunState.RECOVERING, "the last window is no longer degraded"
    elif improving:
        state, reason = RunState.RECOVERING, f"both final windows degraded, severity improved by {improvement:.0%}"
    elif w1.degraded and reuse_lost:
        state, reason = RunState.TRAPPED, (
            f"both final windows degraded, improving by less than {rule.min_improvement:.0%}, with hit rates "
            f"{w1.hit_rate:.2f} and {w2.hit_rate:.2f} against {hit_rate_pre:.2f} before the trigger")
    else:
        if not w1.degraded:
            why = "degradation began in the last window"
        elif hit_rate_pre != hit_rate_pre:  # NaN: nothing to compare the final hit rates with
            why = "no pre-trigger hit rate to compare with, so reuse loss cannot be shown"
        else:
            why = (f"hit rate stayed within {rule.min_hit_rate_drop:.2f} of the pre-trigger rate "
                   f"{hit_rate_pre:.2f} in at least one final window")
        state, reason = RunState.OVERLOADED, f"degraded without improvement; {why}"
    return StateLabel(state, reason, improvement, reuse_lost, hit_rate_pre, too_early)
