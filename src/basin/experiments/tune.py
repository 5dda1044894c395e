"""Tuning: every baseline swept over its own key parameters on the main
scenarios, and reported both at its defaults and at its best setting, so that
a comparison against BASIN is not one against baselines at published
defaults only.

A tuning is a generator of run plans and a reducer of their results: the
file and its checks are :mod:`basin.experiments.tune_spec`'s, the table and
the selection :mod:`basin.experiments.tune_report`'s, the plot
:mod:`basin.experiments.tune_plots`'; this module makes the runs and runs
them.

Each (system, scenario) pair is one in-memory sweep (:mod:`basin.experiments.sweep`):
the grid's parameters and the seeds are its axes, and a second sweep of the
seeds alone gives the defaults. Their runs share one result store, one
executor and one progress display, so a rerun computes nothing and an
interrupted tuning resumes.

Selection (:func:`select`): a system's *best* setting is the one setting that
maximises the mean over scenarios of its goodput (averaged over seeds)
relative to the best goodput any system and setting reached in that
scenario; one deployable setting, not a per-scenario oracle. The *oracle* of
a scenario is the setting best in that scenario alone, reported beside it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from basin.catalog.files import close_names
from basin.errors import BasinInputError
from basin.experiments.executors import check_executor
from basin.experiments.plan import provenance, resolved_params, write_provenance
from basin.experiments.store import STORE_DIR, RunStore
from basin.experiments.sweep import compute_pending
from basin.experiments.sweep_grid import resolve_sweep
from basin.experiments.sweep_spec import Point, Sweep, SweepSpec
from basin.experiments.sweep_table import write_rows
from basin.experiments.tune_plots import PLOT_FILE, draw_goodput
from basin.experiments.tune_report import BEST_FILE, RULE, TABLE_FILE, Choice, Outcome, select, table_rows, write_best
from basin.experiments.tune_spec import (
    Setting,
    TuneRun,
    TuneSpec,
    Tuning,
    check_grid,
    grids_of,
    listed_systems,
    lookup,
    safe_name,
    scenario_entries,
    setting_label,
    tune_file_error,
)
from basin.jsonvalues import json_value
from basin.policy.registry import policy_names
from basin.yamlfile import load_mapping

RECORD_FILE = "tune.json"


def load_tuning(file: str | os.PathLike[str]) -> Tuning:
    """Read and check a tuning file and resolve every run (no run)."""
    path = Path(file)
    raw = load_mapping(path, "tuning", "tuning fields (name, scenarios, set, seeds, systems)")
    listed = listed_systems(raw)
    try:
        spec = TuneSpec.model_validate(raw)
    except ValidationError as exc:
        raise tune_file_error(path, exc, listed) from None
    for key in spec.set_:
        head = key.split(".")[0]
        if head in ("policy", "policy_params", "seed"):
            fix = {"policy": "list the systems under 'systems:'",
                   "seed": "list the seeds under 'seeds:'"}.get(head, "give a system's parameters under "
                                                                    "'systems: NAME: {PARAM: [VALUE]}'")
            raise BasinInputError(f"{path}: field 'set.{key}': a tuning sets this elsewhere; {fix}")
    if len(set(spec.seeds)) != len(spec.seeds):
        raise BasinInputError(f"{path}: field 'seeds': a seed appears twice; list each once")
    registered = policy_names()
    for system in spec.systems:
        if system not in registered:
            close = close_names(system, registered)
            raise BasinInputError(f"{path}: field 'systems.{system}': unknown system"
                                  + (f"; did you mean {' or '.join(close)}?" if close else "")
                                  + f" (systems: {', '.join(registered)})")
        for where, grid in grids_of(spec, listed, system):
            check_grid(path, where, system, grid)
    scenario_args = scenario_entries(path, spec)

    by_cell: dict[tuple[str, tuple[tuple[str, Any], ...], str, int], Point] = {}
    settings: dict[str, dict[tuple[tuple[str, Any], ...], Setting]] = {}
    sweeps: list[Sweep] = []
    for system, grids in spec.systems.items():
        names = list(dict.fromkeys(k for grid in grids for k in grid))
        defaults_of: dict[str, Any] = {}
        for label, arg in scenario_args.items():
            seeds = {"seed": list(spec.seeds)}
            base = SweepSpec(name=safe_name(f"{spec.name}.{system}.{label}.defaults"), scenario=arg, set=spec.set_,
                             axes=seeds, systems=(system,))
            parts = [resolve_sweep(path, base)]
            for i, grid in enumerate(g for g in grids if g):
                axes = {f"policy_params.{k}": list(v) for k, v in grid.items()} | seeds
                parts.append(resolve_sweep(path, SweepSpec(name=safe_name(f"{spec.name}.{system}.{label}.{i}"),
                                                           scenario=arg, set=spec.set_, axes=axes,
                                                           systems=(system,))))
            sweeps += parts
            for i, sweep in enumerate(parts):
                for p in sweep.points:
                    resolved = resolved_params(system, p.plan.param_dict())
                    values = tuple((k, lookup(resolved, k)) for k in names)
                    if i == 0 and not defaults_of:
                        defaults_of = dict(values)
                    mine = settings.setdefault(system, {})
                    if values not in mine:
                        mine[values] = Setting(system, values, i == 0 or values == tuple(defaults_of.items()),
                                               setting_label(values, defaults_of))
                    by_cell.setdefault((system, values, label, p.plan.seed), p)
    runs: list[TuneRun] = []
    seen: set[str] = set()
    for system, mine in settings.items():
        for values, setting in mine.items():
            for label in scenario_args:
                for seed in spec.seeds:
                    point = by_cell[(system, values, label, seed)]
                    if point.key not in seen:
                        seen.add(point.key)
                        runs.append(TuneRun(setting, label, seed, point))
    # A grid point equal to the defaults is the defaults' run: its own copy (the same policy, but a key of its
    # own, as the scenario then spells the values out) is left out rather than computed twice.
    chosen = {id(r.point) for r in runs}
    sweeps = [dataclasses.replace(s, points=tuple(p for p in s.points if id(p) in chosen)) for s in sweeps]
    warnings = list(dict.fromkeys(w for s in sweeps for w in s.warnings))
    notes = list(dict.fromkeys(n for s in sweeps for n in s.notes))
    columns = tuple(dict.fromkeys(k for grids in spec.systems.values() for grid in grids for k in grid))
    return Tuning(path, spec, tuple(scenario_args), dict(scenario_args), tuple(spec.systems),
                  {s: tuple(m.values()) for s, m in settings.items()}, tuple(runs), tuple(sweeps), columns,
                  tuple(warnings), tuple(notes))


def pending_runs(tuning: Tuning, store: RunStore) -> list[TuneRun]:
    """The runs the store lacks."""
    return [r for r in tuning.runs if not store.has(r.key)]


@dataclass(frozen=True, slots=True)
class TuneOutcome:
    runs_total: int
    runs_computed: int
    runs_reused: int
    out_dir: Path
    table: Path
    best: Path
    plot: Path | None
    choices: Mapping[str, Choice]
    #: System -> its best setting's grid parameters (empty for a system without a grid).
    best_params: Mapping[str, Mapping[str, Any]]
    wall_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return json_value({
            "out": str(self.out_dir), "table": str(self.table), "best": str(self.best),
            "plot": str(self.plot) if self.plot is not None else None,
            "provenance": str(self.out_dir / "provenance.json"),
            "runs_total": self.runs_total, "runs_computed": self.runs_computed, "runs_reused": self.runs_reused,
            "rule": RULE,
            "best_params": {s: dict(p) for s, p in self.best_params.items()},
            "best_setting": {s: c.best_setting for s, c in self.choices.items()},
            "score": {s: {"default": c.default_score, "best": c.best_score} for s, c in self.choices.items()},
        })


def run_tuning(tuning: Tuning, out_dir: Path, *, executor: str = "local", workers: int | None = None,
               address: str | None = None, progress: Callable[[int, int], None] | None = None,
               plots: bool = True) -> TuneOutcome:
    """Compute the runs the store lacks (the sweeps' own machinery), then
    write the run table, the selection, the plot and the provenance."""
    check_executor(executor, address)
    start = time.perf_counter()
    store = RunStore(out_dir / STORE_DIR)
    store.clean_stale()
    computed = compute_pending(tuning.sweeps, store, executor=executor, workers=workers, address=address,
                               progress=progress)
    rows = table_rows(tuning, store)
    table = write_rows(rows, out_dir / TABLE_FILE)
    choices = select([Outcome(r["system"], r["setting"], r["scenario"], r["seed"], r["default"],
                              float(r["goodput_per_h"]) if r["goodput_per_h"] is not None else math.nan)
                      for r in rows])
    by_label = {(s.system, s.label): s for sets in tuning.settings.values() for s in sets}
    best_params = {c.system: by_label[(c.system, c.best_setting)].params() for c in choices.values()}
    best = write_best(tuning, rows, choices, by_label, out_dir / BEST_FILE)
    plot = draw_goodput(tuning, choices, out_dir / PLOT_FILE) if plots else None
    outcome = TuneOutcome(len(tuning.runs), computed, len(tuning.runs) - computed, out_dir, table, best, plot,
                          choices, best_params, time.perf_counter() - start)
    _write_record(tuning, out_dir, outcome, executor)
    return outcome


def _write_record(tuning: Tuning, out_dir: Path, outcome: TuneOutcome, executor: str) -> None:
    first = {r.scenario: r for r in tuning.runs if r.setting.default}
    scenarios = [(tuning.scenario_args[label], first[label].point.plan.scenario,
                  list(first[label].point.plan.overrides))
                 for label in tuning.scenarios if label in first]
    systems = {s: {"defaults": resolved_params(s, next(r for r in tuning.runs if r.system == s
                                                        and r.setting.default).point.plan.param_dict()),
                   "grids": list(tuning.spec.systems[s]), "best_setting": outcome.choices[s].best_setting,
                   "best_params": dict(outcome.best_params[s])} for s in tuning.systems}
    data = provenance(scenarios, systems,
                      {"tune": {"file": str(tuning.path.resolve()), "name": tuning.name,
                                "text": tuning.path.read_text(encoding="utf-8"), "store": STORE_DIR,
                                "runs": [r.key for r in tuning.runs]},
                       "rule": RULE, "executor": executor, "warnings": list(tuning.warnings),
                       "notes": list(tuning.notes),
                       "outputs": {"table": outcome.table.name, "best": outcome.best.name,
                                   "plots": [outcome.plot.name] if outcome.plot is not None else []},
                       "runs_total": outcome.runs_total, "runs_computed": outcome.runs_computed,
                       "runs_reused": outcome.runs_reused, "wall_s": outcome.wall_s})
    write_provenance(out_dir, data)
    tmp = out_dir / f".{RECORD_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(json_value({"name": tuning.name, **outcome.as_json()}), indent=1) + "\n",
                   encoding="utf-8")
    os.replace(tmp, out_dir / RECORD_FILE)


__all__ = ["BEST_FILE", "PLOT_FILE", "RULE", "TABLE_FILE", "TuneOutcome", "load_tuning", "pending_runs",
           "run_tuning"]
