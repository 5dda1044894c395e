"""Per-call latencies derived from the calls table.

TTFT is measured from the moment a call was released to the engine
(``admitted_s``), not from when the client sent it: a first call parked by
the gateway waits in the *first-call wait*, which session metrics and the
degradation rules account separately. Counting the park time in TTFT too
would charge it twice and make a gateway that parks look like a slow engine.
"""

from __future__ import annotations

import numpy as np

from basin.metrics._tables import Table, binned_median, floats, require_columns


def call_ttft_s(calls: Table) -> np.ndarray:
    """Time to first token of each call: ``first_token_s - admitted_s`` (seconds)."""
    require_columns(calls, "calls", ("admitted_s", "first_token_s"))
    return floats(calls, "first_token_s") - floats(calls, "admitted_s")


def call_queue_wait_s(calls: Table) -> np.ndarray:
    """Prefill queue wait of each call: ``prefill_start_s - admitted_s`` (seconds)."""
    require_columns(calls, "calls", ("admitted_s", "prefill_start_s"))
    return floats(calls, "prefill_start_s") - floats(calls, "admitted_s")


def binned_median_ttft_s(calls: Table, edges_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median TTFT of the calls whose first token came in each bin ``[edges[i], edges[i+1])``.

    Returns ``(median_s, n_calls)`` per bin; the median is NaN for an empty bin.
    Calls are binned by their first token, the moment their latency became
    known, so a window's median describes the engine during that window.
    """
    return binned_median(floats(calls, "first_token_s"), call_ttft_s(calls), edges_s)
