"""L_late: the largest 2-minute median TTFT in the final 30 minutes."""

from __future__ import annotations

import numpy as np
import pytest

from basin.metrics import l_late_s, late_ttft_medians_s
from test_metrics_builders import make_calls


def _calls(first_token_s: np.ndarray, ttft_s: np.ndarray):
    return make_calls([{"admitted_s": t - d, "first_token_s": t} for t, d in zip(first_token_s, ttft_s, strict=True)])


def test_l_late_is_the_worst_two_minute_median_in_the_final_half_hour() -> None:
    duration_s = 7200.0
    t = np.arange(0.5, duration_s, 1.0)          # one first token a second
    ttft = np.full(t.shape, 1.0)
    ttft[t < 5400] = 100.0                        # before the final 30 min: ignored
    ttft[(t >= 6000) & (t < 6120)] = 12.0         # one slow 2-minute window
    ttft[(t >= 6120) & (t < 6180)] = 50.0         # half of the next window: median 0.5 * (1 + 50)
    calls = _calls(t, ttft)
    assert l_late_s(calls, duration_s=duration_s) == pytest.approx(25.5)
    starts, medians = late_ttft_medians_s(calls, duration_s=duration_s)
    assert starts.size == 15 and starts[0] == 5400.0
    assert medians[(6000 - 5400) // 120] == pytest.approx(12.0)


def test_bins_are_aligned_to_the_run_end() -> None:
    # A 121-minute run: final-30-minute bins start at minute 91, so a slow call at minute 90.5 is outside.
    calls = _calls(np.array([90.5 * 60, 100 * 60]), np.array([60.0, 2.0]))
    starts, _ = late_ttft_medians_s(calls, duration_s=121 * 60.0)
    assert starts[0] == 91 * 60.0
    assert l_late_s(calls, duration_s=121 * 60.0) == pytest.approx(2.0)


def test_l_late_without_late_calls_is_nan() -> None:
    assert np.isnan(l_late_s(_calls(np.array([10.0]), np.array([1.0])), duration_s=7200.0))
