"""Prefix hit rate over calls and minutes."""

from __future__ import annotations

import numpy as np
import pytest

from basin.metrics import binned_hit_rate, calls_hit_rate, hit_rate, hit_rate_per_minute, minutes_hit_rate
from test_metrics_builders import make_calls, make_timeseries


def test_hit_rate_counts_gpu_and_loaded_tokens_weighted_by_prompt() -> None:
    # 900 + 50 hits of 1000, and 0 + 1000 of 9000: token-weighted 1950 / 10000, not the mean of rates.
    assert hit_rate(np.array([1000, 9000]), np.array([900, 0]), np.array([50, 1000])) == pytest.approx(0.195)


def test_hit_rate_of_nothing_is_nan() -> None:
    assert np.isnan(hit_rate(np.zeros(0), np.zeros(0), np.zeros(0)))
    assert np.isnan(hit_rate(np.zeros(3), np.zeros(3), np.zeros(3)))


def test_calls_hit_rate_with_a_mask() -> None:
    calls = make_calls([
        {"prompt_tokens": 1000, "cached_tokens": 1000, "loaded_tokens": 0},
        {"prompt_tokens": 1000, "cached_tokens": 0, "loaded_tokens": 500},
        {"prompt_tokens": 2000, "cached_tokens": 0, "loaded_tokens": 0},
    ])
    assert calls_hit_rate(calls) == pytest.approx(1500 / 4000)
    assert calls_hit_rate(calls, np.array([True, True, False])) == pytest.approx(0.75)


def test_per_minute_and_over_minutes() -> None:
    ts = make_timeseries(4, prompt_tokens=np.array([1000, 0, 2000, 1000]),
                         cached_tokens=np.array([500, 0, 2000, 0]), loaded_tokens=np.array([0, 0, 0, 250]))
    np.testing.assert_allclose(hit_rate_per_minute(ts), [0.5, np.nan, 1.0, 0.25])
    assert minutes_hit_rate(ts, 0, 3) == pytest.approx(2500 / 3000)
    assert minutes_hit_rate(ts, 2, 4) == pytest.approx(2250 / 3000)
    assert np.isnan(minutes_hit_rate(ts, 1, 2))
    assert np.isnan(minutes_hit_rate(ts, 3, 3))
    np.testing.assert_allclose(binned_hit_rate(ts, np.array([0, 2, 4])), [0.5, 2250 / 3000])
