"""L_late: persistent late latency (paper section 4).

The paper defines L_late as "the maximum reported window-median TTFT in the
final 30 minutes" and reads a value above 10 s as persistent high latency,
without naming the window. We use 2-minute windows aligned to the run's end
(15 of them in the final 30 minutes), the same width as the paper's cache-cliff
windows: short enough that a degradation lasting a few minutes shows, long
enough (hundreds of calls at the paper's loads) that one slow call does not.
The 20-minute windows of the state label would hide a late relapse; per-minute
medians would make the maximum chase noise.
"""

from __future__ import annotations

import numpy as np

from basin.metrics._tables import Table
from basin.metrics.latency import binned_median_ttft_s

#: A run whose L_late exceeds this has persistent high latency.
L_LATE_HIGH_S = 10.0


def late_ttft_medians_s(calls: Table, *, duration_s: float, final_s: float = 1800.0,
                        bin_s: float = 120.0) -> tuple[np.ndarray, np.ndarray]:
    """Median TTFT per ``bin_s`` window over the final ``final_s`` of the run.

    Returns ``(bin_start_s, median_s)``; windows are aligned to the run's end,
    and a window without a first token has a NaN median.
    """
    n_bins = int(np.floor(final_s / bin_s + 1e-9))
    edges = duration_s - bin_s * np.arange(n_bins, -1, -1, dtype=np.float64)
    medians, _ = binned_median_ttft_s(calls, edges)
    return edges[:-1], medians


def l_late_s(calls: Table, *, duration_s: float, final_s: float = 1800.0, bin_s: float = 120.0) -> float:
    """Largest 2-minute median TTFT in the final 30 minutes (seconds); NaN without calls there."""
    _, medians = late_ttft_medians_s(calls, duration_s=duration_s, final_s=final_s, bin_s=bin_s)
    finite = medians[np.isfinite(medians)]
    return float(finite.max()) if finite.size else float("nan")
