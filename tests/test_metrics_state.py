"""Run state labels on hand-made two-hour runs (six 20-minute windows, surge at minute 15)."""

from __future__ import annotations

import numpy as np
import pytest

from basin.metrics import RunState, label_run, pre_trigger_hit_rate, summarize_run, window_stats
from test_metrics_builders import make_timeseries, synthetic_run

TRIGGER_S = 900.0
HEALTHY_TTFT = [0.2, 0.2]
HEALTHY_HIT = [0.95, 0.95]


def _summary(trigger_s: float | None = TRIGGER_S, **kwargs: object):
    calls, sessions, timeseries, duration_s = synthetic_run(**kwargs)  # type: ignore[arg-type]
    return summarize_run(calls, sessions, timeseries, system="test", trigger_s=trigger_s,
                         duration_s=duration_s, measure_end_s=duration_s * 0.75)


def test_healthy() -> None:
    s = _summary(ttft_s=[0.2] * 6, hit_rate=[0.95] * 6)
    assert s.state is RunState.HEALTHY
    assert not s.state_windows_too_early


def test_trapped_when_degraded_flat_and_reuse_collapsed() -> None:
    s = _summary(ttft_s=HEALTHY_TTFT + [30.0, 60.0, 60.0, 60.0], hit_rate=HEALTHY_HIT + [0.5, 0.3, 0.3, 0.3])
    assert s.state is RunState.TRAPPED
    assert s.hit_rate_pre == pytest.approx(0.95)
    assert s.hit_rate_final == pytest.approx(0.3)
    assert s.ttft_p50_final_s == pytest.approx(60.0)
    assert s.state_improvement == pytest.approx(0.0)


def test_trapped_when_getting_worse() -> None:
    s = _summary(ttft_s=HEALTHY_TTFT + [30.0, 40.0, 50.0, 90.0], hit_rate=HEALTHY_HIT + [0.3] * 4)
    assert s.state is RunState.TRAPPED
    assert s.state_improvement < 0


def test_overloaded_when_degraded_flat_but_reuse_kept() -> None:
    s = _summary(ttft_s=HEALTHY_TTFT + [30.0, 60.0, 60.0, 60.0], hit_rate=HEALTHY_HIT + [0.9] * 4)
    assert s.state is RunState.OVERLOADED


def test_overloaded_when_only_one_final_window_lost_reuse() -> None:
    s = _summary(ttft_s=HEALTHY_TTFT + [30.0, 60.0, 60.0, 60.0], hit_rate=HEALTHY_HIT + [0.3, 0.3, 0.9, 0.3])
    assert s.state is RunState.OVERLOADED


def test_overloaded_when_degradation_starts_in_the_last_window() -> None:
    s = _summary(ttft_s=[0.2] * 5 + [60.0], hit_rate=[0.95] * 5 + [0.3])
    assert s.state is RunState.OVERLOADED
    assert "began in the last window" in s.state_reason


def test_overloaded_by_parking_wait_with_reuse_kept() -> None:
    # A gateway holds new sessions for 30 min while the engine stays fast and reuse stays high.
    s = _summary(ttft_s=[0.2] * 6, hit_rate=[0.95] * 6, wait_s=[0.0, 0.0, 600.0, 1200.0, 1800.0, 1800.0])
    assert s.state is RunState.OVERLOADED


def test_recovering_when_still_degraded_but_improving_by_a_quarter() -> None:
    s = _summary(ttft_s=HEALTHY_TTFT + [60.0, 60.0, 60.0, 45.0], hit_rate=HEALTHY_HIT + [0.3] * 4)
    assert s.state_improvement == pytest.approx(0.25)
    assert s.state is RunState.RECOVERING


def test_trapped_when_improving_by_just_under_a_quarter() -> None:
    s = _summary(ttft_s=HEALTHY_TTFT + [60.0, 60.0, 60.0, 45.3], hit_rate=HEALTHY_HIT + [0.3] * 4)
    assert s.state is RunState.TRAPPED


def test_recovering_when_the_last_window_is_no_longer_degraded() -> None:
    s = _summary(ttft_s=HEALTHY_TTFT + [60.0, 60.0, 60.0, 2.0], hit_rate=HEALTHY_HIT + [0.3, 0.3, 0.3, 0.9])
    assert s.state is RunState.RECOVERING


def test_improvement_uses_the_worst_criterion() -> None:
    # TTFT halves (60 -> 30 s: severity 12 -> 6) but the parked wait grows to 40 min (severity 8):
    # overall severity 12 -> 8 is a 33% improvement; with the wait at 60 min (severity 12) it is none.
    improving = _summary(ttft_s=HEALTHY_TTFT + [60.0, 60.0, 60.0, 30.0], hit_rate=HEALTHY_HIT + [0.3] * 4,
                         wait_s=[0.0] * 5 + [2400.0])
    assert improving.state is RunState.RECOVERING
    flat = _summary(ttft_s=HEALTHY_TTFT + [60.0, 60.0, 60.0, 30.0], hit_rate=HEALTHY_HIT + [0.3] * 4,
                    wait_s=[0.0] * 5 + [3600.0])
    assert flat.state is RunState.TRAPPED


def test_reuse_loss_needs_a_drop_of_at_least_a_tenth() -> None:
    at = _summary(ttft_s=HEALTHY_TTFT + [60.0] * 4, hit_rate=HEALTHY_HIT + [0.85] * 4)
    assert at.state is RunState.TRAPPED
    above = _summary(ttft_s=HEALTHY_TTFT + [60.0] * 4, hit_rate=HEALTHY_HIT + [0.851] * 4)
    assert above.state is RunState.OVERLOADED


def test_late_trigger_is_labelled_but_flagged() -> None:
    # Windows [80,100) and [100,120) must end >= 35 min after the trigger: a trigger at minute 70 is too late.
    kwargs = {"ttft_s": [0.2] * 4 + [60.0, 60.0], "hit_rate": [0.95] * 4 + [0.3, 0.3]}
    late = _summary(trigger_s=70 * 60.0, **kwargs)
    assert late.state is RunState.TRAPPED
    assert late.state_windows_too_early
    assert not _summary(trigger_s=65 * 60.0, **kwargs).state_windows_too_early


def test_no_trigger_compares_with_the_first_window() -> None:
    s = _summary(trigger_s=None, ttft_s=[0.2, 0.2, 0.2, 0.2, 60.0, 60.0], hit_rate=[0.9, 0.95, 0.95, 0.95, 0.3, 0.3])
    assert s.hit_rate_pre == pytest.approx(0.9)
    assert s.state is RunState.TRAPPED
    assert s.trigger_s is None


def test_pre_trigger_hit_rate_skips_the_warm_up() -> None:
    hit = np.r_[np.full(5, 0.5), np.full(10, 0.95), np.full(25, 0.3)]
    ts = make_timeseries(40, cached_tokens=hit * 1000, loaded_tokens=0)
    assert pre_trigger_hit_rate(ts, trigger_s=900.0) == pytest.approx(0.95)
    # A trigger at minute 8 leaves 3 minutes after the warm-up: use [0, 8) instead.
    assert pre_trigger_hit_rate(ts, trigger_s=480.0) == pytest.approx((5 * 0.5 + 3 * 0.95) / 8)
    # Without a trigger: the first window after the warm-up, [5, 20).
    assert pre_trigger_hit_rate(ts, trigger_s=None) == pytest.approx((10 * 0.95 + 5 * 0.3) / 15)
    assert np.isnan(pre_trigger_hit_rate(ts, trigger_s=0.0))


def test_missing_pre_trigger_rate_cannot_show_a_trap() -> None:
    calls, sessions, timeseries, duration_s = synthetic_run(ttft_s=[60.0] * 6, hit_rate=[0.3] * 6)
    ws = window_stats(calls, sessions, timeseries, duration_s=duration_s)
    label = label_run(ws, hit_rate_pre=float("nan"), trigger_s=0.0)
    assert label.state is RunState.OVERLOADED
    assert "no pre-trigger hit rate" in label.reason


def test_a_run_shorter_than_two_windows_is_undetermined() -> None:
    s = _summary(trigger_s=None, ttft_s=[0.2], hit_rate=[0.95])
    assert s.state is RunState.UNDETERMINED
