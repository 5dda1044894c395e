"""Systems over scenarios (the paper's Fig. 14): run every (scenario, system,
seed) in parallel, relate each goodput to the best system of its scenario and
each median slowdown to the lowest, and draw the comparison.

Besides the run summary, each run reports two things the summary does not:
the wait of new sessions until their first token (arrival to the first call's
first token, the wait a non-parking system imposes inside the engine; a
session whose first call never finished counts with the time it had waited by
the run's end), and the hit rate and new-session wait in 5-minute bins, for the
time-series figure (the paper's Fig. 13).
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from basin.errors import BasinInputError
from basin.experiments.plan import PlanResult, RunPlan, deployment_for, resolve_plan
from basin.experiments.runner import ScenarioRun, check_runnable, run_plans
from basin.experiments.scenario import load_scenario
from basin.jsonvalues import json_values
from basin.plotting import save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BIN_MIN = 5.0
DOC_BEGIN = "<!-- compare:begin -->"
DOC_END = "<!-- compare:end -->"


@dataclass(frozen=True, slots=True)
class ScenarioInfo:
    name: str
    shape: str        # "1P3D"
    kind: str         # "x5 surge", "tools x3", "GPU only"
    duration_min: float
    surge: tuple[float, float] | None


def describe(scenario_name: str, overrides: Sequence[str] = ()) -> ScenarioInfo:
    sc = load_scenario(scenario_name, list(overrides))
    dep = deployment_for(sc)
    if dep.host_ratio == 0:
        kind = "GPU only"
    elif sc.workload.tool_time != 1.0:
        kind = f"tools x{sc.workload.tool_time:g}"
    elif sc.workload.output != 1.0:
        kind = f"outputs x{sc.workload.output:g}" + (f", x{sc.surge.factor:g} surge" if sc.surge.factor != 1.0 else "")
    elif sc.surge.factor != 1.0:
        kind = f"x{sc.surge.factor:g} surge"
    else:
        kind = "steady"
    surge = (sc.surge.start_min, sc.surge.end_min) if sc.trigger_min is not None else None
    return ScenarioInfo(sc.name, dep.shape, kind, sc.duration_min, surge)


@dataclass(frozen=True, slots=True)
class CompareBin:
    """One 5-minute bin of the time-series figure (Fig. 13)."""

    #: Minute the bin starts at (it covers ``BIN_MIN`` minutes).
    start_min: float
    #: Share of prompt tokens served from the prefix cache, of calls whose first token falls in the bin.
    hit_rate: float
    #: Median wait, arrival to first token, of new sessions arriving in the bin.
    first_token_wait_p50_s: float


@dataclass(slots=True)
class CompareRow:
    scenario: str
    system: str
    shape: str
    kind: str
    seeds: tuple[int, ...]
    goodput_per_h: float
    completed_fraction: float
    shed_fraction: float
    state: str
    hit_rate_pre: float
    hit_rate_final: float
    first_call_wait_p50_s: float
    first_call_wait_p90_s: float
    first_token_wait_p50_s: float
    first_token_wait_p90_s: float
    slowdown_p50: float
    ttft_p90_s: float
    itl_violating_share: float
    active_sessions_final: float
    goodput_pct_of_best: float = math.nan
    slowdown_pct_of_lowest: float = math.nan
    #: Per seed, for the record.
    goodput_by_seed: tuple[float, ...] = ()
    state_by_seed: tuple[str, ...] = ()
    borrowed_tokens: int = 0
    #: The 5-minute bins of Fig. 13, labelled.
    bins: list[CompareBin] = field(default_factory=list)


def _first_token_waits(calls: dict, sessions: dict, duration_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(arrival, wait) of non-warm, non-shed sessions: arrival to the first
    token of their first call, censored at the run's end."""
    arrival = sessions["arrival_s"]
    keep = ~(sessions["warm"].astype(bool) | sessions["shed"].astype(bool))
    first = np.full(len(arrival), np.nan)
    idx = calls["call_index"] == 0
    first[calls["session_uid"][idx].astype(int)] = calls["first_token_s"][idx]
    wait = np.where(np.isnan(first), duration_s - arrival, first - arrival)
    return arrival[keep], wait[keep]


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def compare_plan(scenario: str, overrides: Sequence[str], system: str, seed: int, tables: str | None = None,
                 switch_on_min: float | None = None) -> RunPlan:
    """The plan of one comparison run: ``scenario`` (a name or a path) with
    ``overrides`` and ``seed`` under ``system`` with the parameters it has
    (:func:`run_compare` checked them all before the first run); its tables
    to the folder ``tables``; with ``switch_on_min``, started under HiCache
    and switched on then (:func:`basin.experiments.plan.switched_scenario`)."""
    sc = load_scenario(scenario, [*overrides, f"seed={seed}"])
    return resolve_plan(sc, system, strict=False, switch_on_min=switch_on_min, argument=scenario,
                        overrides=tuple(overrides), tables=tables, measure=first_token_figures)


def first_token_figures(run: ScenarioRun) -> dict[str, object]:
    """What a comparison reads from a run's tables besides its summary (in
    the worker, so that no table crosses the process boundary): new
    sessions' wait to their first token, and the 5-minute bins of Fig. 13."""
    s = run.summary
    calls, sessions = run.result.calls, run.result.sessions
    arrivals, all_waits = _first_token_waits(calls, sessions, s.duration_s)
    waits = all_waits[arrivals < s.measure_end_s]
    bins = []
    n_bins = int(run.scenario.duration_min // BIN_MIN)
    issued = calls["first_token_s"]
    prompt = calls["prompt_tokens"].astype(float)
    hit = (calls["cached_tokens"] + calls["loaded_tokens"]).astype(float)
    for b in range(n_bins):
        lo, hi = b * BIN_MIN * 60.0, (b + 1) * BIN_MIN * 60.0
        sel = (issued >= lo) & (issued < hi)
        rate = float(hit[sel].sum() / prompt[sel].sum()) if prompt[sel].sum() > 0 else math.nan
        w = all_waits[(arrivals >= lo) & (arrivals < hi)]
        bins.append((b * BIN_MIN, rate, float(np.median(w)) if len(w) else math.nan))
    return {"first_token_wait_p50_s": _pct(waits, 50), "first_token_wait_p90_s": _pct(waits, 90), "bins": bins}


def result_row(scenario: str, result: PlanResult) -> dict[str, object]:
    """One run's figures as :func:`aggregate` reads them, keyed by the
    scenario as given and the system as compared."""
    s = result.summary
    return {
        "scenario": scenario, "system": result.label, "seed": result.seed,
        "goodput_per_h": s.goodput_per_h, "completed_fraction": s.completed_fraction,
        "shed_fraction": s.shed_fraction, "state": s.state.value, "hit_rate_pre": s.hit_rate_pre,
        "hit_rate_final": s.hit_rate_final, "first_call_wait_p50_s": s.first_call_wait_p50_s,
        "first_call_wait_p90_s": s.first_call_wait_p90_s,
        "slowdown_p50": s.slowdown_p50, "ttft_p90_s": s.ttft_p90_s,
        "itl_violating_share": s.itl_violating_share, "active_sessions_final": s.active_sessions_final,
        "borrowed_tokens": result.borrowed_tokens, **(result.measured or {}),
    }


_MEAN_FIELDS = ("goodput_per_h", "completed_fraction", "shed_fraction", "hit_rate_pre", "hit_rate_final",
                "first_call_wait_p50_s", "first_call_wait_p90_s", "first_token_wait_p50_s",
                "first_token_wait_p90_s", "slowdown_p50", "ttft_p90_s", "itl_violating_share",
                "active_sessions_final")


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def aggregate(results: list[dict[str, object]], infos: dict[str, ScenarioInfo],
              systems: Sequence[str]) -> list[CompareRow]:
    """Rows per (scenario, system), averaged over seeds, with the relative figures."""
    rows: list[CompareRow] = []
    for sc, info in infos.items():
        for system in systems:
            runs = sorted((r for r in results if r["scenario"] == sc and r["system"] == system),
                          key=lambda r: r["seed"])  # type: ignore[arg-type,return-value]
            if not runs:
                continue
            means = {f: _nanmean([float(r[f]) for r in runs]) for f in _MEAN_FIELDS}  # type: ignore[arg-type]
            states = tuple(str(r["state"]) for r in runs)
            n_bins = len(runs[0]["bins"])  # type: ignore[arg-type]
            bins = []
            for b in range(n_bins):
                bins.append(CompareBin(runs[0]["bins"][b][0],  # type: ignore[index]
                                       _nanmean([r["bins"][b][1] for r in runs]),  # type: ignore[index]
                                       _nanmean([r["bins"][b][2] for r in runs])))  # type: ignore[index]
            rows.append(CompareRow(
                scenario=sc, system=system, shape=info.shape, kind=info.kind,
                seeds=tuple(int(r["seed"]) for r in runs),  # type: ignore[call-overload]
                state=max(set(states), key=states.count) if len(set(states)) == 1 else "/".join(states),
                goodput_by_seed=tuple(float(r["goodput_per_h"]) for r in runs),  # type: ignore[arg-type]
                state_by_seed=states,
                borrowed_tokens=int(np.mean([int(r["borrowed_tokens"]) for r in runs])),  # type: ignore[call-overload]
                bins=bins, **means,
            ))
    for sc in infos:
        group = [r for r in rows if r.scenario == sc]
        best = max((r.goodput_per_h for r in group if not math.isnan(r.goodput_per_h)), default=math.nan)
        low = min((r.slowdown_p50 for r in group if not math.isnan(r.slowdown_p50)), default=math.nan)
        for r in group:
            r.goodput_pct_of_best = 100.0 * r.goodput_per_h / best if best and best > 0 else math.nan
            r.slowdown_pct_of_lowest = 100.0 * r.slowdown_p50 / low if low and low > 0 else math.nan
    return rows


def run_folders(scenarios: Sequence[str]) -> dict[str, str]:
    """A folder name per scenario argument: its name, made unique (two files
    may share a name; a path is never a folder name)."""
    out: dict[str, str] = {}
    for arg in scenarios:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", load_scenario(arg).name) or "scenario"
        name, n = base, 2
        while name in out.values():
            name, n = f"{base}-{n}", n + 1
        out[arg] = name
    return out


def run_compare(scenarios: Sequence[str], systems: Sequence[str], overrides: Sequence[str] = (),
                seeds: Sequence[int] | None = None, workers: int | None = None,
                progress: Callable[[int, int], None] | None = None,
                tables_dir: Path | None = None,
                switch_on_min: float | None = None) -> tuple[list[CompareRow], dict[str, ScenarioInfo]]:
    """Run every system on every scenario (and seed) over a process pool;
    with ``tables_dir``, each run's tables go to
    ``tables_dir/<scenario>/<system>/seed-<n>/``. Rows and infos are keyed by
    the scenario as given (a name or a path). With ``switch_on_min`` every
    run starts under HiCache and its system is switched on at that minute
    (:func:`switched_scenario`); rows keep the system's name."""
    if not scenarios:
        raise BasinInputError("compare needs at least one scenario")
    for name in scenarios:  # parameters and deployments of every scenario, before the first run
        check_runnable(load_scenario(name, list(overrides)), systems)
    infos = {name: describe(name, overrides) for name in scenarios}
    folders = run_folders(scenarios)
    plans, names = [], []
    for name in scenarios:
        sc_seeds = list(seeds) if seeds else [load_scenario(name, list(overrides)).seed]
        for system in systems:
            for seed in sc_seeds:
                tables = None if tables_dir is None else str(tables_dir / folders[name] / system / f"seed-{seed}")
                plans.append(compare_plan(name, overrides, system, seed, tables, switch_on_min))
                names.append(name)
    results = [result_row(name, r) for name, r in zip(names, run_plans(plans, workers=workers, progress=progress))]
    return aggregate(results, infos, systems), infos


# ------------------------------------------------------------------ output
def row_dicts(rows: Sequence[CompareRow]) -> list[dict[str, object]]:
    return [json_values(asdict(r)) for r in rows]


def rows_csv(rows: Sequence[CompareRow]) -> str:
    """The rows as CSV, one line per (scenario, system); the per-seed figures
    joined by ``;`` and the bins left out (they are in compare.json)."""
    buf = io.StringIO()
    dicts = row_dicts(rows)
    fields = [k for k in (dicts[0] if dicts else {}) if k != "bins"]
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for d in dicts:
        writer.writerow({k: ";".join(str(x) for x in v) if isinstance(v, list)
                         else ("" if v is None else v) for k, v in d.items() if k in fields})
    return buf.getvalue()


def _fmt(x: float, digits: int = 0, unit: str = "") -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.{digits}f}{unit}"


def _dur(seconds: float) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def markdown(rows: Sequence[CompareRow], infos: dict[str, ScenarioInfo], command: str = "") -> str:
    systems = list(dict.fromkeys(r.system for r in rows))
    lookup = {(r.scenario, r.system): r for r in rows}
    lines = []
    if command:
        lines += [f"Produced by `{command}`.", ""]
    head = "| system | " + " | ".join(f"{i.shape} {i.kind}" for i in infos.values()) + " |"
    lines += ["Goodput in sessions/h, and as a percentage of the best system in the scenario:", "",
              head, "|" + " --- |" * (len(infos) + 1)]
    for system in systems:
        cells = []
        for sc in infos:
            r = lookup.get((sc, system))
            cells.append("-" if r is None else f"{r.goodput_per_h:.0f} ({r.goodput_pct_of_best:.0f}%)")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += ["", "Median slowdown of completed sessions (including the first-call wait), and as a "
              "percentage of the lowest in the scenario:", "", head, "|" + " --- |" * (len(infos) + 1)]
    for system in systems:
        cells = []
        for sc in infos:
            r = lookup.get((sc, system))
            cells.append("-" if r is None else f"{_fmt(r.slowdown_p50, 2)} ({_fmt(r.slowdown_pct_of_lowest)}%)")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += ["", "Per scenario: end state, completed share of measured sessions, prefix hit rate "
              "before the surge and in the last 20-minute window, first-call wait at admission "
              "(p50 / p90), new sessions' wait to their first token (p50 / p90), p90 TTFT, sessions "
              "active at the end, and prefill tokens computed on decode instances (borrowing).", ""]
    for sc, info in infos.items():
        lines += [f"**{sc}** ({info.shape}, {info.kind})", "",
                  "| system | state | completed | hit before / end | admission wait p50 / p90 | "
                  "wait to first token p50 / p90 | TTFT p90 | active at end | borrowed |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for system in systems:
            r = lookup.get((sc, system))
            if r is None:
                continue
            borrowed = f"{r.borrowed_tokens / 1e6:.0f}M" if r.borrowed_tokens else "-"
            lines.append(
                f"| {system} | {r.state} | {100 * r.completed_fraction:.0f}% | "
                f"{_fmt(r.hit_rate_pre, 2)} / {_fmt(r.hit_rate_final, 2)} | "
                f"{_dur(r.first_call_wait_p50_s)} / {_dur(r.first_call_wait_p90_s)} | "
                f"{_dur(r.first_token_wait_p50_s)} / {_dur(r.first_token_wait_p90_s)} | "
                f"{_dur(r.ttft_p90_s)} | {_fmt(r.active_sessions_final)} | {borrowed} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


_DOC_PATTERN = re.compile(re.escape(DOC_BEGIN) + r".*?" + re.escape(DOC_END), re.S)


def check_doc(doc: Path) -> None:
    """Refuse, before any run, a ``--doc`` file that exists without the markers
    (a missing file is created with them)."""
    if doc.is_dir():
        raise BasinInputError(f"--doc {doc}: is a folder; name a Markdown file")
    if doc.exists() and not _DOC_PATTERN.search(doc.read_text(encoding="utf-8")):
        raise BasinInputError(f"--doc {doc}: no '{DOC_BEGIN}' ... '{DOC_END}' markers to fill; add the two lines "
                              "where the tables should go, or name a new file")


def fill_doc(doc: Path, body: str) -> None:
    """Replace what lies between the compare markers of ``doc`` with ``body``."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else f"{DOC_BEGIN}\n{DOC_END}\n"
    pattern = _DOC_PATTERN
    if not pattern.search(text):
        raise BasinInputError(f"{doc}: no '{DOC_BEGIN}' ... '{DOC_END}' markers to fill")
    doc.write_text(pattern.sub(lambda _: f"{DOC_BEGIN}\n{body}{DOC_END}", text), encoding="utf-8")


_MARKERS = {"x5 surge": "o", "GPU only": "^"}


def _marker(kind: str) -> str:
    if kind.startswith("tools"):
        return "s"
    return _MARKERS.get(kind, "D")


def plot_compare(rows: Sequence[CompareRow], out_png: str | os.PathLike[str]) -> None:
    """Fig. 14: (a) goodput as % of the best per scenario, (b) median slowdown
    as % of the lowest. One marker per scenario (shape: scenario kind; 1P3D
    filled on the left, 1P1D hollow on the right); a bar at each system's
    worst scenario."""
    # Lazy: matplotlib takes 0.1-0.3 s to import; only this path uses it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    systems = list(dict.fromkeys(r.system for r in rows))
    shapes = list(dict.fromkeys(r.shape for r in rows))
    fig = Figure(figsize=(max(7.0, 1.25 * len(systems) + 2.0), 7.5), layout="constrained", dpi=120)
    FigureCanvasAgg(fig)
    ax_g, ax_s = fig.subplots(2, 1, sharex=True)
    x = np.arange(len(systems))
    colors = {shape: f"C{i}" for i, shape in enumerate(shapes)}
    for ax, attr, worst in ((ax_g, "goodput_pct_of_best", min), (ax_s, "slowdown_pct_of_lowest", max)):
        bars = []
        for _, system in enumerate(systems):
            vals = [getattr(r, attr) for r in rows if r.system == system and not math.isnan(getattr(r, attr))]
            bars.append(worst(vals) if vals else np.nan)
        ax.bar(x, bars, 0.7, color="0.88", edgecolor="0.6", zorder=1)
        for j, v in enumerate(bars):
            if not math.isnan(v):
                ax.text(j - 0.33, v, f"{v:.0f}", ha="left", va="bottom", fontsize=8, color="0.3")
        for r in rows:
            v = getattr(r, attr)
            if math.isnan(v):
                continue
            k = shapes.index(r.shape)
            offset = (k - (len(shapes) - 1) / 2) * 0.22
            filled = k == 0
            ax.plot(systems.index(r.system) + offset, v, _marker(r.kind), ms=7, zorder=3,
                    color=colors[r.shape], markerfacecolor=colors[r.shape] if filled else "white",
                    markeredgewidth=1.5)
        ax.grid(True, axis="y", alpha=0.3)
    ax_g.set_ylabel("goodput, % of best")
    ax_g.set_ylim(0, 110)
    ax_s.set_ylabel("median slowdown, % of lowest")
    ax_s.set_ylim(bottom=0)
    ax_s.set_xticks(x, systems, rotation=20, ha="right")
    handles = [Line2D([], [], ls="", marker=_marker(k), color="0.3", markerfacecolor="0.3", label=k)
               for k in dict.fromkeys(r.kind for r in rows)]
    handles += [Line2D([], [], ls="", marker="o", color=colors[s],
                       markerfacecolor=colors[s] if i == 0 else "white", label=s) for i, s in enumerate(shapes)]
    handles.append(Line2D([], [], ls="", marker="s", color="0.6", markerfacecolor="0.88", ms=10,
                          label="worst scenario"))
    fig.legend(handles=handles, fontsize=8, ncols=len(handles), loc="outside upper center")
    save_figure(fig, out_png)


def plot_bins(rows: Sequence[CompareRow], info: ScenarioInfo, out_png: str | os.PathLike[str],
              key: str | None = None) -> Figure:
    """Fig. 13 for one scenario: hit rate of calls and median new-session wait
    (arrival to first token) in 5-minute bins, per system. ``key`` is the
    scenario as the rows name it (the argument given: a name or a path);
    default: the scenario's name."""
    # Lazy: matplotlib takes 0.1-0.3 s to import; only this path uses it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.0, 4.0), layout="constrained", dpi=120)
    FigureCanvasAgg(fig)
    ax_h, ax_w = fig.subplots(1, 2)
    key = info.name if key is None else key
    mine = [r for r in rows if r.scenario == key]
    if not mine:
        raise ValueError(f"plot_bins: no rows of scenario '{key}' (rows name {sorted({r.scenario for r in rows})})")
    for i, r in enumerate(mine):
        t = np.array([b.start_min + BIN_MIN / 2 for b in r.bins])
        ax_h.plot(t, [b.hit_rate for b in r.bins], color=f"C{i}", lw=1.4, marker="o", ms=3, label=r.system)
        wait = np.array([b.first_token_wait_p50_s for b in r.bins], dtype=float)
        ax_w.plot(t, np.maximum(wait, 0.1), color=f"C{i}", lw=1.4, marker="o", ms=3, label=r.system)
    for ax in (ax_h, ax_w):
        if info.surge:
            ax.axvspan(*info.surge, color="0.88", zorder=0)
        ax.set_xlabel("time (min)")
        ax.grid(True, alpha=0.3)
    ax_h.set_ylabel("prefix hit rate of calls")
    ax_h.set_ylim(0, 1.02)
    ax_w.set_ylabel("median wait of new sessions to first token (s)")
    ax_w.set_yscale("log")
    ax_w.legend(fontsize=8, ncols=2)
    fig.suptitle(f"{info.name}: {info.shape}, {info.kind}")
    save_figure(fig, out_png)
    return fig
