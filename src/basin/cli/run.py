"""``basin run``: simulate a scenario under one or more systems."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TextIO

import typer
from rich.console import Console
from rich.table import Table

_err = Console(stderr=True)

#: The table's note on its last column (docs/metrics.md defines it).
L_LATE_NOTE = ("L_late: the largest median TTFT of the 2-minute windows in the run's last 30 minutes "
               "(above 10 s: persistent high latency; docs/metrics.md).")

#: Columns of ``summary.csv`` and of ``--csv``: the summary without its windows.
CSV_SKIP = ("windows",)


def run(
    scenario: str = typer.Argument(..., help="Scenario name (basin scenario list) or a YAML file."),
    system: Optional[list[str]] = typer.Option(None, "--system", "-s",
                                                help="Control policy to run; repeat for several; 'all' "
                                                     "for every registered policy. Default: the scenario's "
                                                     "policy."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a scenario field, "
                                                                 "e.g. --set surge.factor=2.0"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Override the scenario's seed."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for Parquet tables, plots, summary.csv "
                                                           "and provenance.json (default results/<scenario>)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, one object per system."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the summary as CSV, one row per system."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots of the time series."),
    clean: bool = typer.Option(False, "--clean", help="Remove the run folders of other systems that earlier "
                                                      "commands left in the output folder (default: keep them)."),
) -> None:
    """Run the simulator on a scenario and report goodput, state and latency per system.

    The output folder gets one folder of tables per system, summary.csv and
    provenance.json (the resolved scenario, parameters, cliff profile,
    version and command). Other systems' run folders that earlier commands
    left there are kept (and listed in summary.csv, provenance.json and the
    plots when they ran the same resolved scenario); --clean removes them.

    Example: basin run trap-1p1d --set surge.factor=2.0 --system hicache --out results/trap
    """
    from basin.experiments.plan import provenance, write_provenance
    from basin.experiments.runner import remove_stale_runs, run_plan, runnable_plans
    from basin.experiments.scenario import load_scenario, scenario_dict
    from basin.metrics.io import write_run
    from basin.systems import expand_systems

    if as_json and as_csv:
        from basin.errors import BasinInputError

        raise BasinInputError("--json and --csv both choose what is printed: give one")
    from basin.cli.outputs import check_out_dir

    check_out_dir(out)  # a file where the folder goes: refused now, not after the runs
    overrides = list(set_ or [])
    if seed is not None:
        overrides.append(f"seed={seed}")
    sc = load_scenario(scenario, overrides)
    systems = expand_systems(system or [sc.policy])  # 'all': every registered policy; unknown names refused
    # Parameters, deployment, base rate: checked before any run. Run here, one
    # after the other, for the live progress of each (a pool reports only whole runs).
    plans, split, warnings = runnable_plans(sc, systems, argument=scenario, overrides=overrides)
    for line in split.notes:
        _err.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True)
    for line in warnings:
        _err.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
    out_dir = out or Path("results") / sc.name
    check_out_dir(out_dir)
    quiet = as_json or as_csv
    runs = []
    if _err.is_terminal and not quiet:
        from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn  # a bar only here

        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), console=_err) as progress:
            for plan in plans:
                task = progress.add_task(f"{sc.name} / {plan.system}", total=sc.duration_min * 60.0)

                def on_progress(t: float, task: TaskID = task) -> None:
                    progress.update(task, completed=t)

                runs.append(run_plan(plan, on_progress))
                progress.update(task, completed=sc.duration_min * 60.0)
    else:  # a log, CI or --json/--csv: plain lines on stderr, as sweeps print (JobProgress)
        for plan in plans:
            lines = PlainProgress(f"{sc.name} / {plan.system}", sc.duration_min)
            runs.append(run_plan(plan, lines))
            lines(sc.duration_min * 60.0)
    mine = [r.system for r in runs]
    earlier = EarlierRuns(out_dir, [], [], [], {})
    if clean:
        removed = remove_stale_runs(out_dir, keep=mine)
        if removed:
            _err.print(f"[yellow]note:[/] --clean: removed run folders of an earlier command from {out_dir}: "
                       f"{', '.join(removed)}", highlight=False, soft_wrap=True)
    else:
        earlier = earlier_runs(out_dir, scenario_dict(sc), mine)
        if earlier.merged:
            _err.print(f"[yellow]note:[/] kept the runs of an earlier command on the same scenario in {out_dir}: "
                       f"{', '.join(earlier.merged)} (in summary.csv and the plots; --clean removes them)",
                       highlight=False, soft_wrap=True)
        if earlier.other:
            _err.print(f"[yellow]note:[/] kept run folders of an earlier command with other settings in {out_dir}: "
                       f"{', '.join(earlier.other)} (not in summary.csv; --clean removes them)",
                       highlight=False, soft_wrap=True)
    for r in runs:
        write_run(out_dir / r.system, r.result.calls, r.result.sessions, r.result.timeseries, r.summary)
    rows = [_row(r) for r in runs]
    (out_dir / "summary.csv").write_text(_csv([*rows, *earlier.rows]), encoding="utf-8")
    write_provenance(out_dir, provenance(
        [(scenario, sc, overrides)],
        {**{r.system: {"policy_params": r.policy_params, "cliff_profile": r.cliff} for r in runs},
         **earlier.systems},
        {"warnings": warnings, "notes": list(split.notes),
         "outputs": {"runs": [*mine, *earlier.merged], "summary_csv": "summary.csv",
                     "earlier_runs": earlier.merged, "other_runs_kept": earlier.other}}))
    if plots:  # imported here: --no-plots (every run of a sweep) needs none of it
        from basin.experiments.plots import intervention_marks, plot_cliff, plot_run_timeseries
        from basin.metrics.io import read_table

        series = {r.system: r.result.timeseries for r in runs}
        series.update({name: read_table(out_dir / name / "timeseries.parquet") for name in earlier.merged})
        shade = [(sc.surge.start_min, sc.surge.end_min)] if sc.trigger_min is not None else []
        plot_run_timeseries(series, out_dir / "timeseries.png",
                            shade_windows=shade, interventions=intervention_marks(sc.interventions),
                            title=f"{sc.name}")
        plot_cliff(series, out_dir / "cliff.png",
                   title=f"{sc.name}: hit rate against working set")
    if as_json:
        print(json.dumps(rows))
        return
    if as_csv:
        print(_csv(rows), end="")
        return
    table = Table(title=f"scenario {sc.name}", caption=L_LATE_NOTE, caption_justify="left")
    width = max(len(r.system) for r in runs)
    for col in ("system", "goodput/h", "completed", "shed", "state", "why", "hit pre", "hit end",
                "TTFT end", "active end", "L_late"):
        table.add_column(col, justify="left" if col in ("system", "state", "why") else "right",
                         no_wrap=col != "why", min_width=width if col == "system" else None)
    for r in runs:
        s = r.summary
        table.add_row(s.system, _f(s.goodput_per_h, 1), _pct(s.completed_fraction), _pct(s.shed_fraction),
                      s.state.value if hasattr(s.state, "value") else str(s.state), s.state_reason,
                      _f(s.hit_rate_pre, 2), _f(s.hit_rate_final, 2), _f(s.ttft_p50_final_s, 2, "s"),
                      _f(s.active_sessions_final, 0), _f(s.l_late_s, 1, "s"))
    console = Console()
    Console(width=max(console.width, 140)).print(table)
    _err.print(f"tables, plots, summary.csv and provenance.json in {out_dir}")


@dataclass(frozen=True)
class EarlierRuns:
    """Run folders an earlier ``basin run`` left in the output folder."""

    out_dir: Path
    #: Systems that ran the same resolved scenario: listed with this command's runs.
    merged: list[str]
    #: Their summary.csv rows (as text) and provenance entries.
    rows: list[dict[str, Any]]
    #: Folders kept that ran something else (or whose provenance is gone).
    other: list[str]
    systems: dict[str, Any]


def earlier_runs(out_dir: Path, resolved: dict[str, Any], mine: Sequence[str]) -> EarlierRuns:
    """The other systems' run folders in ``out_dir``, split by whether the
    earlier command ran the same resolved scenario (per its provenance.json
    and summary.csv); nothing is removed."""
    from basin.experiments.plan import PROVENANCE_FILE
    from basin.experiments.runner import RUN_MARKERS
    from basin.jsonvalues import json_value

    if not out_dir.is_dir():
        return EarlierRuns(out_dir, [], [], [], {})
    folders = [c.name for c in sorted(out_dir.iterdir())
               if c.is_dir() and c.name not in mine and any((c / m).exists() for m in RUN_MARKERS)]
    try:
        prov = json.loads((out_dir / PROVENANCE_FILE).read_text(encoding="utf-8"))
        with open(out_dir / "summary.csv", encoding="utf-8", newline="") as fh:
            old_rows = {row["system"]: row for row in csv.DictReader(fh)}
        (old,) = prov["scenarios"]
        same = json.dumps(old["resolved"], sort_keys=True) == json.dumps(json_value(resolved), sort_keys=True)
        systems = prov["systems"]
    except (OSError, ValueError, KeyError, TypeError):
        same, old_rows, systems = False, {}, {}
    merged = [name for name in folders if same and name in old_rows and name in systems]
    return EarlierRuns(out_dir, merged, [old_rows[name] for name in merged],
                       [name for name in folders if name not in merged], {name: systems[name] for name in merged})


class PlainProgress:
    """Simulated minutes of one run as plain stderr lines (at most one per
    ``JobProgress.LINE_INTERVAL_S``, the last always), for when stderr is not
    a terminal and a bar's redraws would be noise."""

    def __init__(self, label: str, total_min: float, stream: TextIO | None = None) -> None:
        from basin.experiments.pool import JobProgress

        self.label, self.total_min = label, total_min
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = JobProgress.LINE_INTERVAL_S
        self._start = time.monotonic()
        self._last = -math.inf
        self._finished = False

    def __call__(self, t_s: float) -> None:
        """Called with the simulated clock in seconds (``run_plan``'s progress)."""
        minute = t_s / 60.0
        now = time.monotonic()
        done = minute >= self.total_min
        if self._finished or (not done and now - self._last < self.interval_s):
            return
        self._last, self._finished = now, done
        print(f"{self.label}: {min(minute, self.total_min):.0f}/{self.total_min:g} min simulated "
              f"({100 * minute / max(self.total_min, 1e-9):.0f}%), {now - self._start:.0f} s elapsed",
              file=self.stream, flush=True)


def _row(run: Any) -> dict[str, Any]:
    """One system's JSON row: the summary without its windows, with what the policy ran with."""
    data = run.summary.to_dict()
    data.pop("windows", None)
    data["policy_params"] = run.policy_params
    data["cliff_profile"] = run.cliff
    return data


def _csv(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as CSV: nested values (parameters, profile) as JSON text."""
    buf = io.StringIO()
    fields = [k for k in rows[0] if k not in CSV_SKIP] if rows else []
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v)
                         for k, v in row.items() if k in fields})
    return buf.getvalue()


def _f(x: float, digits: int, unit: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}{unit}"


def _pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f}%"
