"""Figures of runs: the per-minute story of a surge, and the cache cliff.

Both figures are drawn from the recorded tables alone (via :mod:`basin.metrics`),
so a simulated run and a replayed real run plot the same way. Matplotlib is
imported inside the functions and only its object API is used (``Figure`` on
the Agg canvas, no ``pyplot``): importing this module costs nothing, no
display is needed, and sweeps may plot from worker threads without sharing
pyplot's global state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from basin.metrics import CliffPoints, cache_cliff_points, cliff_median_curve, hit_rate_per_minute
from basin.metrics._tables import ACTIVE_TAG_PREFIX, SECONDS_PER_MINUTE, Table, floats
from basin.plotting import new_figure as _new_figure
from basin.plotting import save_figure as _save

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Panels of :func:`plot_run_timeseries`, top to bottom.
TIMESERIES_PANELS: tuple[str, ...] = ("active", "hit_rate", "ttft", "uncached", "decode_kv")


def _tag_columns(timeseries: Table) -> list[str]:
    """The ``active_<tag>`` columns (``active_sessions`` is the total, not a tag)."""
    return sorted(c for c in timeseries if c.startswith(ACTIVE_TAG_PREFIX) and c != "active_sessions")


def _shade(ax: Axes, windows: Sequence[tuple[float, float]], *, label: bool) -> None:
    for i, (start, end) in enumerate(windows):
        ax.axvspan(start, end, color="0.85", zorder=0, label="surge" if label and i == 0 else None)


def plot_run_timeseries(timeseries_by_system: Mapping[str, Table], out_png: str | os.PathLike[str], *,
                        shade_windows: Sequence[tuple[float, float]] = (), title: str | None = None) -> Figure:
    """One PNG of five stacked per-minute panels for one or more runs of the same scenario.

    Panels: active sessions (split by tag for a single run, the total per run
    otherwise), prefix hit rate, median TTFT (log scale), uncached prefill
    throughput, and decode KV split into memory held by decoding requests and
    memory reserved for requests still awaiting prefill or transfer (SGLang
    reserves before prefill, so a prefill backlog shows up here as idle
    reservations). ``shade_windows`` are ``(start_min, end_min)`` spans, the
    surge, shaded on every panel. Returns the figure (already saved).
    """
    from matplotlib.ticker import EngFormatter

    if not timeseries_by_system:
        raise ValueError("plot_run_timeseries needs at least one run")
    single = len(timeseries_by_system) == 1
    fig = _new_figure(10.0, 13.0)
    axes = fig.subplots(len(TIMESERIES_PANELS), 1, sharex=True)
    ax_active, ax_hit, ax_ttft, ax_uncached, ax_kv = axes
    colors = [f"C{i % 10}" for i in range(len(timeseries_by_system))]

    for (system, ts), color in zip(timeseries_by_system.items(), colors, strict=True):
        # Row m holds the minute [m, m+1): draw it at the minute's middle.
        minute = floats(ts, "minute") + 0.5
        if single:
            ax_active.plot(minute, floats(ts, "active_sessions"), color="k", lw=1.5, label="all")
            for i, col in enumerate(_tag_columns(ts)):
                ax_active.plot(minute, floats(ts, col), color=f"C{i % 10}", lw=1.2,
                               label=col.removeprefix(ACTIVE_TAG_PREFIX))
        else:
            ax_active.plot(minute, floats(ts, "active_sessions"), color=color, lw=1.2, label=system)

        ax_hit.plot(minute, hit_rate_per_minute(ts), color=color, lw=1.2, label=system)

        ttft = floats(ts, "ttft_p50_s")
        ax_ttft.plot(minute, np.where(ttft > 0, ttft, np.nan), color=color, lw=1.2, label=system)

        ax_uncached.plot(minute, floats(ts, "uncached_tokens") / SECONDS_PER_MINUTE, color=color, lw=1.2,
                         label=system)

        capacity = floats(ts, "decode_kv_capacity_tokens")
        decoding = np.full(capacity.shape, np.nan)
        idle = np.full(capacity.shape, np.nan)
        np.divide(floats(ts, "decode_kv_decoding_tokens"), capacity, out=decoding, where=capacity > 0)
        np.divide(floats(ts, "decode_kv_reserved_idle_tokens"), capacity, out=idle, where=capacity > 0)
        if single:
            ax_kv.stackplot(minute, np.nan_to_num(decoding), np.nan_to_num(idle), colors=["C0", "C1"],
                            alpha=0.8, labels=["decoding", "reserved, awaiting prefill/transfer"])
        else:
            ax_kv.plot(minute, decoding, color=color, lw=1.2, ls="-", label=f"{system}: decoding")
            ax_kv.plot(minute, idle, color=color, lw=1.2, ls="--", label=f"{system}: reserved idle")

    for i, ax in enumerate(axes):
        _shade(ax, shade_windows, label=i == 0)
        ax.grid(True, alpha=0.3)
    ax_active.set_ylabel("active sessions")
    ax_hit.set_ylabel("prefix hit rate")
    ax_hit.set_ylim(0.0, 1.02)
    ax_ttft.set_ylabel("median TTFT (s)")
    ax_ttft.set_yscale("log")
    ax_uncached.set_ylabel("uncached prefill\n(tokens/s)")
    ax_uncached.yaxis.set_major_formatter(EngFormatter(sep=""))
    ax_kv.set_ylabel("decode KV\n(fraction of capacity)")
    ax_kv.set_ylim(0.0, 1.02)
    ax_kv.set_xlabel("time (min)")
    ax_active.legend(loc="upper left", fontsize="small", ncols=2)
    ax_kv.legend(loc="upper left", fontsize="small", ncols=2)
    if title:
        fig.suptitle(title)
    _save(fig, out_png)
    return fig


def plot_cliff(points_by_run: Mapping[str, CliffPoints | Table], out_png: str | os.PathLike[str], *,
               title: str | None = None, window_min: int = 2) -> Figure:
    """Scatter of hit rate against working set / cache capacity, one point per window (paper Fig. 6b).

    Each value of ``points_by_run`` is either precomputed :class:`CliffPoints`
    or a run's timeseries, from which ``window_min``-minute points are taken.
    A black line gives the median hit rate in 0.1-wide bins of the pooled
    points, and a dashed line marks a working set equal to the cache.
    Returns the figure (already saved).
    """
    fig = _new_figure(7.0, 5.0)
    ax = fig.subplots()
    pooled: list[CliffPoints] = []
    for i, (run, value) in enumerate(points_by_run.items()):
        pts = value if isinstance(value, CliffPoints) else cache_cliff_points(value, window_min=window_min)
        pooled.append(pts)
        ax.scatter(pts.working_set_ratio, pts.hit_rate, s=14, alpha=0.6, color=f"C{i % 10}", label=run)
    if pooled:
        all_points = CliffPoints(*(np.concatenate([getattr(p, f) for p in pooled])
                                   for f in ("start_min", "working_set_ratio", "hit_rate")))
        centres, medians = cliff_median_curve(all_points)
        ax.plot(centres, medians, color="k", lw=2.0, label="binned median")
    ax.axvline(1.0, color="0.3", ls="--", lw=1.2, label="working set = cache")
    ax.set_xlabel("working set / prefix-cache capacity")
    ax.set_ylabel(f"prefix hit rate ({window_min}-min windows)")
    ax.set_ylim(0.0, 1.02)
    ax.set_xlim(left=0.0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize="small")
    if title:
        ax.set_title(title)
    _save(fig, out_png)
    return fig
