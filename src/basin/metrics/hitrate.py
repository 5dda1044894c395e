"""Prefix hit rate: the share of prompt tokens the engine did not recompute.

A token counts as a hit when its KV came from the GPU prefix cache
(``cached_tokens``) or from a lower tier that was loaded back (``loaded_tokens``:
host memory or lent decode memory). Both avoid the recomputation whose growth
drives the trap, so both count; the paper's hit rates (0.95 healthy, about 0.3
trapped) are of this kind. The rate over a group is a ratio of token sums, not
a mean of per-call rates, so a long prompt weighs by its cost.
"""

from __future__ import annotations

import numpy as np

from basin.metrics._tables import Table, binned_sum, floats, ratio, require_columns

_TOKEN_COLUMNS = ("prompt_tokens", "cached_tokens", "loaded_tokens")


def hit_rate(prompt_tokens: np.ndarray, cached_tokens: np.ndarray, loaded_tokens: np.ndarray) -> float:
    """``(cached + loaded) / prompt`` summed over a group; NaN for no prompt tokens."""
    prompt = float(np.sum(prompt_tokens, dtype=np.float64))
    hits = float(np.sum(cached_tokens, dtype=np.float64) + np.sum(loaded_tokens, dtype=np.float64))
    return ratio(hits, prompt)


def calls_hit_rate(calls: Table, mask: np.ndarray | None = None) -> float:
    """Hit rate over the calls selected by ``mask`` (all calls when None)."""
    require_columns(calls, "calls", _TOKEN_COLUMNS)
    sel = slice(None) if mask is None else np.asarray(mask, dtype=bool)
    return hit_rate(floats(calls, "prompt_tokens")[sel], floats(calls, "cached_tokens")[sel],
                    floats(calls, "loaded_tokens")[sel])


def binned_hit_rate(timeseries: Table, edges_min: np.ndarray) -> np.ndarray:
    """Hit rate over the timeseries minutes in each bin ``[edges[i], edges[i+1])``.

    The timeseries counts every prefill that finished, including those of calls
    still decoding at the run's end, which the calls table (finished calls
    only) misses; window and pre-trigger hit rates therefore come from here.
    NaN for a bin without prompt tokens.
    """
    require_columns(timeseries, "timeseries", ("minute", *_TOKEN_COLUMNS))
    minute = floats(timeseries, "minute")
    prompt = binned_sum(minute, floats(timeseries, "prompt_tokens"), edges_min)
    hits = binned_sum(minute, floats(timeseries, "cached_tokens") + floats(timeseries, "loaded_tokens"), edges_min)
    out = np.full(prompt.shape, np.nan)
    np.divide(hits, prompt, out=out, where=prompt > 0)
    return out


def minutes_hit_rate(timeseries: Table, start_min: float, end_min: float) -> float:
    """Hit rate over the prefills finished in timeseries minutes ``[start_min, end_min)``."""
    if not end_min > start_min:
        return float("nan")
    return float(binned_hit_rate(timeseries, np.array([start_min, end_min]))[0])


def hit_rate_per_minute(timeseries: Table) -> np.ndarray:
    """Hit rate of each timeseries row; NaN in minutes without a finished prefill."""
    require_columns(timeseries, "timeseries", _TOKEN_COLUMNS)
    prompt = floats(timeseries, "prompt_tokens")
    hits = floats(timeseries, "cached_tokens") + floats(timeseries, "loaded_tokens")
    out = np.full(prompt.shape, np.nan)
    np.divide(hits, prompt, out=out, where=prompt > 0)
    return out
