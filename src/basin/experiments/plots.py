"""Figures of runs: the per-minute story of a surge, the cache cliff, and a
cliff profile's ramps (:func:`plot_profile`).

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from basin.cliff import reference_hit
from basin.metrics import CliffPoints, cache_cliff_points, cliff_median_curve, floats, hit_rate_per_minute
from basin.metrics.actions import derived_action_columns
from basin.metrics.sessions import session_outcomes
from basin.plotting import new_figure as _new_figure
from basin.plotting import save_figure as _save
from basin.runtables import ACTIVE_TAG_PREFIX, SECONDS_PER_MINUTE, Table

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from basin.catalog.cliff_profiles import CliffProfile
    from basin.experiments.scenario import InterventionSpec

#: The cliff plot's x axis: the recorded ``cache_capacity_tokens`` is the
#: device (GPU) prefix cache summed over prefill instances, host tier excluded.
CLIFF_X_LABEL = "working set / GPU prefix cache (all prefill instances, no host tier)"

#: Panels of :func:`plot_run_timeseries`, top to bottom.
TIMESERIES_PANELS: tuple[str, ...] = ("active", "hit_rate", "ttft", "uncached", "decode_kv")


def _tag_columns(timeseries: Table) -> list[str]:
    """The ``active_<tag>`` columns (``active_sessions`` is the total, not a tag)."""
    return sorted(c for c in timeseries if c.startswith(ACTIVE_TAG_PREFIX) and c != "active_sessions")


def _shade(ax: Axes, windows: Sequence[tuple[float, float]], *, label: bool) -> None:
    for i, (start, end) in enumerate(windows):
        ax.axvspan(start, end, color="0.85", zorder=0, label="surge" if label and i == 0 else None)


#: Line styles and markers cycled beside the ten colours: with 4, 7 and 10
#: (pairwise coprime but 4 and 10) no two of the first 20 systems share all
#: three, and neighbours (basin and basin-paper, say) differ in each.
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _system_style(i: int) -> dict[str, Any]:
    """Colour, line style and marker per system, so that systems are told
    apart without colour too and a line drawn over another still shows its
    markers (staggered, one every tenth of the axis)."""
    return {"color": f"C{i % 10}", "ls": LINE_STYLES[(i + i // 10) % 4], "marker": MARKERS[i % 7],
            "markevery": (0.013 * (i % 7), 0.1), "ms": 4.5}


#: Width of the cliff plot's bins of working set / cache.
CLIFF_BIN_WIDTH = 0.1


def intervention_marks(interventions: Sequence[InterventionSpec]) -> list[tuple[float, str]]:
    """``(minute, label)`` of each scenario intervention, for ``plot_run_timeseries``."""
    marks = []
    for iv in interventions:
        if iv.switch_policy is not None:
            what = f"switch to {iv.switch_policy}"
        elif iv.terminate_tag is not None:
            what = f"terminate {iv.terminate_tag}"
        else:
            what = f"rate {iv.set_rate_per_min:g}/min"
        marks.append((float(iv.at_min), what))
    return marks


def _mark(axes: Sequence[Axes], marks: Sequence[tuple[float, str]]) -> None:
    """A labelled vertical line per intervention: label on the top panel, line on all."""
    for at, what in marks:
        for ax in axes:
            ax.axvline(at, color="0.2", ls="-.", lw=1.0, zorder=1)
        axes[0].annotate(what, xy=(at, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                         textcoords="offset points", rotation=90, ha="left", va="top", fontsize="small")


def plot_run_timeseries(timeseries_by_system: Mapping[str, Table], out_png: str | os.PathLike[str], *,
                        shade_windows: Sequence[tuple[float, float]] = (),
                        interventions: Sequence[tuple[float, str]] = (), title: str | None = None,
                        bands_of: str | None = None, include_parked: bool = False) -> Figure:
    """One PNG of five stacked per-minute panels for one or more runs of the same scenario.

    Panels: active sessions (split by tag for a single run, the total per run
    otherwise), prefix hit rate, median TTFT (log scale), uncached prefill
    throughput, and decode KV split into memory held by decoding requests and
    memory reserved for requests still awaiting prefill or transfer (SGLang
    reserves before prefill, so a prefill backlog shows up here as idle
    reservations). ``shade_windows`` are ``(start_min, end_min)`` spans, the
    surge, shaded on every panel; ``interventions`` are ``(minute, label)``
    marks (:func:`intervention_marks`), a labelled line on every panel.
    Several runs get one colour each and one legend outside the panels, so
    eight overlaid systems stay legible. ``bands_of`` names the run whose
    action columns (:mod:`basin.metrics.actions`; lending and parking read
    from older tables) are drawn as bands at the top of the active panel;
    ``include_parked`` adds sessions parked at the router to each run's total.
    Returns the figure (already saved).
    """
    # Lazy: matplotlib takes 0.1-0.3 s to import; only this path uses it.
    from matplotlib.ticker import EngFormatter

    if not timeseries_by_system:
        raise ValueError("plot_run_timeseries needs at least one run")
    if bands_of is not None and bands_of not in timeseries_by_system:
        raise ValueError(f"plot_run_timeseries: no run of '{bands_of}' to draw action bands from")
    single = len(timeseries_by_system) == 1
    # Lazy: matplotlib takes 0.1-0.3 s to import; only this path uses it.
    from matplotlib.lines import Line2D

    fig = _new_figure(10.0 if single else 12.0, 13.0)
    axes = fig.subplots(len(TIMESERIES_PANELS), 1, sharex=True)
    ax_active, ax_hit, ax_ttft, ax_uncached, ax_kv = axes

    for i, (system, ts) in enumerate(timeseries_by_system.items()):
        style = _system_style(i)
        color = style["color"]
        # Row m holds the minute [m, m+1): draw it at the minute's middle.
        minute = floats(ts, "minute") + 0.5
        total = _sessions_per_minute(ts, include_parked)
        if single:
            ax_active.plot(minute, total, color="k", lw=1.5, label="all" + (" + parked" if include_parked else ""))
            for i, col in enumerate(_tag_columns(ts)):
                ax_active.plot(minute, floats(ts, col), color=f"C{i % 10}", lw=1.2,
                               label=col.removeprefix(ACTIVE_TAG_PREFIX))
        else:
            ax_active.plot(minute, total, lw=1.2, label=system, **style)

        ax_hit.plot(minute, hit_rate_per_minute(ts), lw=1.2, label=system, **style)

        ttft = floats(ts, "ttft_p50_s")
        ax_ttft.plot(minute, np.where(ttft > 0, ttft, np.nan), lw=1.2, label=system, **style)

        ax_uncached.plot(minute, floats(ts, "uncached_tokens") / SECONDS_PER_MINUTE, lw=1.2, label=system,
                         **style)

        capacity = floats(ts, "decode_kv_capacity_tokens")
        decoding = np.full(capacity.shape, np.nan)
        idle = np.full(capacity.shape, np.nan)
        np.divide(floats(ts, "decode_kv_decoding_tokens"), capacity, out=decoding, where=capacity > 0)
        np.divide(floats(ts, "decode_kv_reserved_idle_tokens"), capacity, out=idle, where=capacity > 0)
        if single:
            ax_kv.stackplot(minute, np.nan_to_num(decoding), np.nan_to_num(idle), colors=["C0", "C1"],
                            alpha=0.8, labels=["decoding", "reserved, awaiting prefill/transfer"])
        else:
            # Colour names the system; here thickness names the quantity.
            ax_kv.plot(minute, decoding, color=color, lw=1.6, label=f"{system}: decoding")
            ax_kv.plot(minute, idle, color=color, lw=0.8, alpha=0.6, label=f"{system}: reserved idle")

    for i, ax in enumerate(axes):
        _shade(ax, shade_windows, label=i == 0)
        ax.grid(True, alpha=0.3)
    _mark(axes, interventions)
    if bands_of is not None:
        _draw_bands(ax_active, timeseries_by_system[bands_of], bands_of)
    ax_active.set_ylabel("sessions (active + parked)" if include_parked else "active sessions")
    ax_hit.set_ylabel("prefix hit rate")
    ax_hit.set_ylim(0.0, 1.02)
    ax_ttft.set_ylabel("median TTFT (s)")
    ax_ttft.set_yscale("log")
    ax_uncached.set_ylabel("uncached prefill\n(tokens/s)")
    ax_uncached.yaxis.set_major_formatter(EngFormatter(sep=""))
    ax_kv.set_ylabel("decode KV\n(fraction of capacity)")
    ax_kv.set_ylim(0.0, 1.02)
    ax_kv.set_xlabel("time (min)")
    if single:
        ax_active.legend(loc="upper left", fontsize="small", ncols=2)
        ax_kv.legend(loc="upper left", fontsize="small", ncols=2)
    else:
        handles, labels = ax_active.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right upper", fontsize="small", title="system")
        ax_kv.legend([Line2D([], [], color="0.3", lw=1.6), Line2D([], [], color="0.3", lw=0.8, alpha=0.6)],
                     ["decoding", "reserved, awaiting prefill/transfer"], loc="upper left", fontsize="small")
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
    points, and a dashed line marks a working set equal to the cache. The
    cache is the timeseries' ``cache_capacity_tokens``: the GPU prefix cache of
    all prefill instances, without the host tier (:data:`CLIFF_X_LABEL`).
    Returns the figure (already saved).
    """
    fig = _new_figure(7.0, 5.0)
    ax = fig.subplots()
    pooled: list[CliffPoints] = []
    for i, (run, value) in enumerate(points_by_run.items()):
        pts = value if isinstance(value, CliffPoints) else cache_cliff_points(value, window_min=window_min)
        pooled.append(pts)
        style = _system_style(i)
        marker = ("o", "s", "^", "D")[i // 10 % 4]
        ax.scatter(pts.working_set_ratio, pts.hit_rate, s=14, alpha=0.6, c=style["color"], marker=marker,
                   label=run)
    if pooled:
        all_points = CliffPoints(*(np.concatenate([getattr(p, f) for p in pooled])
                                   for f in ("start_min", "working_set_ratio", "hit_rate")))
        centres, medians = cliff_median_curve(all_points, bin_width=CLIFF_BIN_WIDTH)
        ax.plot(*_broken_at_gaps(centres, medians, CLIFF_BIN_WIDTH), color="k", lw=2.0, marker="o", ms=3,
                label=f"binned median (bins of {CLIFF_BIN_WIDTH:g} with >= 3 windows)")
    ax.axvline(1.0, color="0.3", ls="--", lw=1.2, label="working set = cache")
    ax.set_xlabel(CLIFF_X_LABEL)
    ax.set_ylabel(f"prefix hit rate ({window_min}-min windows)")
    ax.set_ylim(0.0, 1.02)
    ax.set_xlim(left=0.0)
    ax.grid(True, alpha=0.3)
    if len(points_by_run) > 3:  # many runs: the legend beside the axes, not over the points
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    else:
        ax.legend(loc="lower left", fontsize="small")
    if title:
        ax.set_title(title)
    _save(fig, out_png)
    return fig


def _broken_at_gaps(x: np.ndarray, y: np.ndarray, step: float) -> tuple[np.ndarray, np.ndarray]:
    """``x, y`` with a NaN wherever consecutive bins are not neighbours, so a
    line is drawn only across bins that hold samples, never over empty ranges."""
    if x.size < 2:
        return x, y
    gap = np.flatnonzero(np.diff(x) > 1.5 * step) + 1
    return np.insert(x.astype(float), gap, np.nan), np.insert(y.astype(float), gap, np.nan)


def plot_profile(profile: CliffProfile, out_png: str | os.PathLike[str]) -> Path:
    """Two panels: hit rate against ``W / C_eff`` per window with each ramp's
    fitted curve and the profile's (lower-quartile kappa); and per step the
    arrival rate, the settled completion rate and the active sessions."""
    fig = _new_figure(12.0, 4.8)
    ax_hit, ax_steps = fig.subplots(1, 2)
    x_max = 0.0
    for i, run in enumerate(profile.runs):
        x = np.asarray(run.points_x)
        x_max = max(x_max, float(np.max(x)) if x.size else 0.0)
        ax_hit.scatter(x, run.points_hit, s=12, alpha=0.55, color=f"C{i % 10}",
                       label=f"seed {run.seed}: kappa {run.kappa:.2f}")
    # Deep in the trap the working set runs far past the cliff; the floor is
    # clear well before that, so the axis stops at 2.5 times the cliff.
    x_right = min(max(x_max, 0.1), 2.5 * profile.cliff_ratio)
    hidden = sum(int(np.sum(np.asarray(run.points_x) > x_right)) for run in profile.runs)
    grid = np.linspace(0.0, x_right, 400)
    for i, run in enumerate(profile.runs):
        ax_hit.plot(grid, reference_hit(grid, run.kappa, run.plateau_hit, run.floor_hit, profile.x_knee,
                                        profile.steepness, profile.plateau_decline, profile.decline_start),
                    color=f"C{i % 10}", lw=1.0, alpha=0.8)
    ax_hit.plot(grid, profile.hit(grid), color="k", lw=2.2,
                label=f"profile: kappa {profile.kappa:.2f} (lower quartile)")
    ax_hit.axvline(profile.cliff_ratio, color="k", ls="--", lw=1.0,
                   label=f"cliff W/C_eff = kappa x_k = {profile.cliff_ratio:.2f}")
    ax_hit.axvline(1.0, color="0.5", ls=":", lw=1.0, label="W = C_eff")
    if hidden:
        ax_hit.text(0.98, 0.97, f"{hidden} windows further right not shown", transform=ax_hit.transAxes,
                    ha="right", va="top", fontsize="small", color="0.3")
    ax_hit.set_xlabel("working set / C_eff   (C_eff = max(GPU cache, host tier))")
    ax_hit.set_ylabel(f"prefix hit rate ({profile.ramp.window_min}-min windows)")
    ax_hit.set_ylim(0.0, 1.02)
    ax_hit.set_xlim(0.0, grid[-1])
    ax_hit.grid(True, alpha=0.3)
    ax_hit.legend(loc="lower left", fontsize="small")
    ax_hit.set_title("hit rate against working set")

    ramp = profile.ramp
    edges = np.arange(ramp.steps + 1) * ramp.step_min
    rates = np.asarray(ramp.rates())
    ax_steps.stairs(rates, edges, color="0.3", lw=1.5, label="arrival rate (set)")
    mid = edges[:-1] + (ramp.settle_min + ramp.step_min) / 2.0
    ax_act = ax_steps.twinx()
    for i, run in enumerate(profile.runs):
        ax_steps.plot(mid, run.step_completions_per_min, "o-", color=f"C{i % 10}", ms=4, lw=1.0,
                      label=f"completions/min, seed {run.seed}")
        ax_act.plot(mid, run.step_active_sessions, "s:", color=f"C{i % 10}", ms=3, lw=1.0, alpha=0.7)
    ax_steps.axhline(profile.lambda_c_per_min, color="k", ls="--", lw=1.0,
                     label=f"lambda_c = {profile.lambda_c_per_min:.1f}/min (median)")
    ax_steps.set_xlabel("ramp time (min); markers: settled part of each step")
    ax_steps.set_ylabel("sessions per minute")
    ax_act.set_ylabel("active sessions (squares, dotted)")
    ax_act.set_yscale("log")
    # Lazy: matplotlib takes 0.1-0.3 s to import; only this path uses it.
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax_act.yaxis.set_major_formatter(ScalarFormatter())
    ax_act.yaxis.set_minor_formatter(NullFormatter())
    ax_steps.set_ylim(bottom=0.0)
    ax_steps.grid(True, alpha=0.3)
    ax_steps.legend(loc="upper left", fontsize="small")
    ax_steps.set_title("the ramp: arrivals, completions, active sessions")
    host = (f"host {profile.host_ratio:g}x" if profile.host_ratio > 0 else "GPU-only")
    fig.suptitle(f"cliff profile: {profile.deployment} ({profile.prefill_instances}P{profile.decode_instances}D, "
                 f"{host}, {profile.router}), {profile.workload}, {profile.repeats} ramps")
    return _save(fig, out_png)


# ------------------------------------------------ figure families (Fig. 15, 21)
#: One seed of one system: its ``(calls, sessions, timeseries)`` tables.
RunTables = tuple[Table, Table, Table]

#: Action bands drawn at the top of the sessions panel, top to bottom:
#: (column, label, colour). ``sessions_shed`` is a count, the others shares.
ACTION_BANDS: tuple[tuple[str, str, str], ...] = (
    ("policy_lending", "lends decode memory", "tab:green"),
    ("policy_ordering", "orders queues by priority", "tab:blue"),
    ("policy_admission_limited", "limits admission", "tab:orange"),
    ("sessions_shed", "sheds", "tab:red"),
)
#: Height of one band, as a fraction of the sessions panel.
BAND_HEIGHT = 0.045


def _runs_of_minutes(on: np.ndarray) -> list[tuple[int, int]]:
    """``[(first, end)]`` minute spans where ``on`` holds (end exclusive)."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for m, v in enumerate(on):
        if v and start is None:
            start = m
        elif not v and start is not None:
            spans.append((start, m))
            start = None
    if start is not None:
        spans.append((start, len(on)))
    return spans


def action_band_spans(timeseries: Table) -> dict[str, list[tuple[float, float]]]:
    """Per action column the table has, the ``(start_min, end_min)`` spans in
    which the policy took that action at some point of the minute. Minutes are
    the table's ``minute`` column (row ``m`` covers ``[m, m+1)``). A column the
    table lacks is absent (not an empty list): nothing is known of it."""
    minute = floats(timeseries, "minute")
    out: dict[str, list[tuple[float, float]]] = {}
    for column, _, _ in ACTION_BANDS:
        if column not in timeseries:
            continue
        on = np.nan_to_num(floats(timeseries, column)) > 0
        out[column] = [(float(minute[a]), float(minute[b - 1]) + 1.0) for a, b in _runs_of_minutes(on)]
    return out


def _sessions_per_minute(ts: Table, include_parked: bool) -> np.ndarray:
    """Active sessions per minute, plus those parked at the router with ``include_parked``."""
    total = floats(ts, "active_sessions")
    if include_parked and "parked_sessions" in ts:
        total = total + np.nan_to_num(floats(ts, "parked_sessions"))
    return total


def _draw_bands(ax: Axes, timeseries: Table, system: str) -> None:
    """Bands at the top of ``ax`` for ``system``'s actions, with the y axis
    raised so the curves stay below them."""
    table = {**timeseries, **derived_action_columns(timeseries)}
    spans = action_band_spans(table)
    drawn = []
    for k, (column, label, colour) in enumerate(ACTION_BANDS):
        if not spans.get(column):
            continue
        top = 1.0 - k * BAND_HEIGHT
        for i, (a, b) in enumerate(spans[column]):
            ax.axvspan(a, b, ymin=top - BAND_HEIGHT * 0.85, ymax=top, color=colour, alpha=0.85, lw=0,
                       zorder=4, label=f"{system} {label}" if i == 0 else None)
        ax.annotate(label, xy=(1.0, top - BAND_HEIGHT / 2), xycoords="axes fraction", xytext=(3, 0),
                    textcoords="offset points", va="center", ha="left", fontsize="x-small", color=colour)
        drawn.append(column)
    if not drawn:
        ax.annotate(f"{system}: no action taken", xy=(1.0, 1.0 - BAND_HEIGHT / 2), xycoords="axes fraction",
                    xytext=(3, 0), textcoords="offset points", va="center", ha="left", fontsize="x-small")
    ax.set_ylim(0.0, ax.get_ylim()[1] / _band_room(drawn))


def _band_room(drawn: Sequence[str]) -> float:
    """Share of a panel's height the curves may use below the drawn bands."""
    if not drawn:
        return 1.0
    rows = max(k for k, (c, _, _) in enumerate(ACTION_BANDS) if c in drawn) + 1
    return max(1.0 - BAND_HEIGHT * (rows + 0.5), 0.5)


def session_slowdowns(sessions: Table, *, measure_end_s: float, run_end_s: float) -> tuple[np.ndarray, int]:
    """Slowdowns of the measured sessions that completed, and how many
    measured sessions did not (still running or parked at the run's end, or
    shed): the population of the slowdown CDF."""
    out = session_outcomes(sessions, measure_end_s=measure_end_s, run_end_s=run_end_s)
    m = out.measured
    done = m & out.completed
    return out.slowdown[done], int((m & ~out.completed).sum())


def new_session_waits(calls: Table, sessions: Table, *, measure_end_s: float, run_end_s: float) -> np.ndarray:
    """Wait of each measured, non-shed new session from arrival to its first
    token; a session whose first call never finished counts with the time it
    had waited by the run's end."""
    arrival = floats(sessions, "arrival_s")
    out = session_outcomes(sessions, measure_end_s=measure_end_s, run_end_s=run_end_s)
    keep = out.measured & ~out.shed
    first = np.full(len(arrival), np.nan)
    idx = np.asarray(calls["call_index"]) == 0
    first[np.asarray(calls["session_uid"])[idx].astype(int)] = floats(calls, "first_token_s")[idx]
    wait = np.where(np.isnan(first), run_end_s - arrival, first - arrival)
    return wait[keep]


def _cdf(ax: Axes, values: np.ndarray, n_total: int, edge: float | None, **style: object) -> None:
    """Empirical CDF of ``values`` over ``n_total`` sessions; the rest jump in at ``edge``."""
    v = np.sort(values[np.isfinite(values)])
    if n_total == 0:
        return
    y = np.arange(1, v.size + 1) / n_total
    xs, ys = list(v), list(y)
    if edge is not None and v.size < n_total:
        xs += [edge, edge]
        ys += [v.size / n_total, 1.0]
    ax.step(xs, ys, where="post", **style)  # type: ignore[arg-type]


def plot_family(runs: Mapping[str, Sequence[RunTables]], out_png: str | os.PathLike[str], *,
                measure_end_s: float, run_end_s: float, shade_windows: Sequence[tuple[float, float]] = (),
                interventions: Sequence[tuple[float, str]] = (), bands_of: str | None = None,
                include_parked: bool = True, goodput_per_h: Mapping[str, float] | None = None,
                slowdown_limit: float = 4.0, title: str | None = None) -> Figure:
    """The figure of one scenario across systems (the paper's Fig. 15 and 21):
    (a) sessions per minute (active, plus parked at the router unless
    ``include_parked`` is off), (b) median TTFT per minute, (c) CDF of session
    slowdown over measured sessions, those that never completed at the right
    edge, and (d) CDF of new sessions' wait to their first token.

    ``runs`` maps each system to its seeds' tables; the time series are the
    first seed's, the CDFs pool every seed. ``bands_of`` names the system
    whose action columns (:mod:`basin.metrics.actions`) are drawn as bands at
    the top of (a). ``goodput_per_h`` adds each system's goodput to its legend
    entry. Returns the figure (already saved).
    """
    if not runs:
        raise ValueError("plot_family needs at least one run")
    if bands_of is not None and bands_of not in runs:
        raise ValueError(f"plot_family: no run of '{bands_of}' to draw action bands from "
                         f"(runs: {', '.join(runs)})")
    fig = _new_figure(13.0, 8.5)
    (ax_n, ax_t), (ax_s, ax_w) = fig.subplots(2, 2)
    slowdowns = {}
    for system, seeds in runs.items():
        if not seeds:
            raise ValueError(f"plot_family: no tables for '{system}'")
        parts = [session_slowdowns(s, measure_end_s=measure_end_s, run_end_s=run_end_s) for _, s, _ in seeds]
        slowdowns[system] = (np.concatenate([p[0] for p in parts]), sum(p[1] for p in parts))
    finite = [float(np.max(v)) for v, _ in slowdowns.values() if v.size]
    edge = 10.0 ** np.ceil(np.log10(max(max(finite, default=10.0) * 1.2, 10.0)))
    for i, (system, seeds) in enumerate(runs.items()):
        style = _system_style(i)
        label = system if goodput_per_h is None or system not in goodput_per_h else \
            f"{system} ({goodput_per_h[system]:.0f}/h)"
        _, _, ts = seeds[0]
        minute = floats(ts, "minute") + 0.5
        ax_n.plot(minute, _sessions_per_minute(ts, include_parked), lw=1.3, label=label, **style)
        ttft = floats(ts, "ttft_p50_s")
        ax_t.plot(minute, np.where(ttft > 0, ttft, np.nan), lw=1.2, **style)
        values, unfinished = slowdowns[system]
        _cdf(ax_s, values, values.size + unfinished, edge, lw=1.3, **style)
        waits = np.concatenate([new_session_waits(c, s, measure_end_s=measure_end_s, run_end_s=run_end_s)
                                for c, s, _ in seeds])
        _cdf(ax_w, np.maximum(waits, 0.01), waits.size, None, lw=1.3, **style)
    for i, ax in enumerate((ax_n, ax_t)):
        _shade(ax, shade_windows, label=i == 0)
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("time (min)")
    # The labels go where no band is drawn.
    _mark([ax_t, ax_n] if bands_of is not None else [ax_n, ax_t], interventions)
    if bands_of is not None:
        _draw_bands(ax_n, runs[bands_of][0][2], bands_of)
    else:
        ax_n.set_ylim(bottom=0.0)
    ax_n.set_ylabel("sessions (active + parked)" if include_parked else "active sessions")
    ax_n.set_title("(a) sessions", fontsize="medium")
    ax_t.set_ylabel("median TTFT (s)")
    ax_t.set_yscale("log")
    ax_t.set_title("(b) median TTFT of the minute's calls", fontsize="medium")
    ax_s.axvline(slowdown_limit, color="0.4", ls=":", lw=1.0)
    ax_s.axvline(edge, color="0.2", ls="--", lw=1.0)
    ax_s.annotate("not completed", xy=(edge, 0.02), xytext=(-3, 0), textcoords="offset points", rotation=90,
                  ha="right", va="bottom", fontsize="x-small")
    ax_s.annotate(f"good: <= {slowdown_limit:g}", xy=(slowdown_limit, 0.98), xytext=(3, 0),
                  textcoords="offset points", ha="left", va="top", fontsize="x-small")
    ax_s.set_xscale("log")
    ax_s.set_xlim(1.0, edge * 1.15)
    ax_s.set_ylim(0.0, 1.02)
    ax_s.set_xlabel("session slowdown (elapsed / unloaded, first-call wait included)")
    ax_s.set_ylabel("CDF of measured sessions")
    ax_s.set_title("(c) session slowdown", fontsize="medium")
    ax_w.set_xscale("log")
    ax_w.set_ylim(0.0, 1.02)
    ax_w.set_xlabel("wait of new session to its first token (s; below 10 ms drawn at 10 ms)")
    ax_w.set_ylabel("CDF of measured sessions")
    ax_w.set_title("(d) wait of new sessions", fontsize="medium")
    for ax in (ax_s, ax_w):
        ax.grid(True, alpha=0.3)
    handles, labels = ax_n.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small",
               title="system" if goodput_per_h is None else "system (goodput)")
    if title:
        fig.suptitle(title)
    _save(fig, out_png)
    return fig
