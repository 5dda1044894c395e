"""Sweeps: one scenario over a grid of overrides, each run kept in a result
store, one table of every run and the plots the sweep feeds.

A sweep is a generator of run plans and a reducer of their results:

- the file and its checks: :mod:`basin.experiments.sweep_spec`;
- the grid, every point a :class:`~basin.experiments.plan.RunPlan`:
  :mod:`basin.experiments.sweep_grid`;
- running the plans the store lacks on the one executor: this module;
- the table: :mod:`basin.experiments.sweep_table`; the plots:
  :mod:`basin.experiments.sweep_plots`.

Everything is checked before the first run: every field, every key, every
point of the grid as a scenario, every system's parameters. Each run is
stored under its plan's key, the hash of its fully resolved config
(:mod:`basin.experiments.store`), so a rerun computes nothing, an interrupted
sweep resumes, and a changed axis computes only its new points.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basin.experiments.executors import check_executor
from basin.experiments.plan import PlanResult, provenance, write_provenance
from basin.experiments.runner import run_plans
from basin.experiments.scenario import load_scenario
from basin.experiments.store import STORE_DIR, RunStore
from basin.experiments.sweep_plots import draw_plots
from basin.experiments.sweep_spec import Point, Sweep, value_text
from basin.experiments.sweep_table import TABLE_FILE, table_rows, write_table
from basin.jsonvalues import json_value

SWEEP_RECORD = "sweep.json"


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    runs_total: int
    runs_computed: int
    runs_reused: int
    table: Path
    plots: tuple[Path, ...] = ()
    wall_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"runs_total": self.runs_total, "runs_computed": self.runs_computed,
                "runs_reused": self.runs_reused, "table": str(self.table)}


def pending_points(sweep: Sweep, store: RunStore) -> list[Point]:
    """The points whose run is not in the store (each key once)."""
    seen: set[str] = set()
    out = []
    for p in sweep.points:
        if p.key not in seen and not store.has(p.key):
            seen.add(p.key)
            out.append(p)
    return out


def run_sweep(sweep: Sweep, out_dir: Path, *, executor: str = "local", workers: int | None = None,
              address: str | None = None, progress: Callable[[int, int], None] | None = None,
              plots: bool = True) -> SweepOutcome:
    """Compute the runs the store lacks, then write the table, the plots and
    the sweep's provenance from the store."""
    check_executor(executor, address)
    start = time.perf_counter()
    store = RunStore(out_dir / STORE_DIR)
    store.clean_stale()
    computed = compute_pending([sweep], store, executor=executor, workers=workers, address=address,
                               progress=progress)
    table = write_table(sweep, store, out_dir / TABLE_FILE)
    drawn: list[Path] = []
    if plots and sweep.spec.plot:
        drawn = draw_plots(sweep, table_rows(sweep, store), out_dir)
    wall = time.perf_counter() - start
    outcome = SweepOutcome(len(sweep.points), computed, len(sweep.points) - computed, out_dir / TABLE_FILE,
                           tuple(drawn), wall)
    _write_record(sweep, out_dir, outcome, executor, table)
    return outcome


def compute_pending(sweeps: Sequence[Sweep], store: RunStore, *, executor: str = "local",
                    workers: int | None = None, address: str | None = None,
                    progress: Callable[[int, int], None] | None = None) -> int:
    """Run the plans of ``sweeps`` the store lacks (each key once, across
    them all, on one executor), keeping each in the store as it finishes, so
    several sweeps share one pool and one progress display. Returns the count
    computed."""
    todo: dict[str, tuple[Sweep, Point]] = {}
    for sweep in sweeps:
        for p in pending_points(sweep, store):
            todo.setdefault(p.key, (sweep, p))
    pending = list(todo.values())

    def keep(index: int, result: PlanResult) -> None:
        sweep, point = pending[index]
        assert result.tables is not None  # a sweep's plans keep their tables
        record = point.plan.provenance(result, {"sweep": {"file": str(sweep.path.resolve()), "name": sweep.name},
                                                "point": dict(point.coords), "run_key": point.key,
                                                "wall_s": result.wall_s, "executor": executor})
        store.put(point.key, result.tables, result.summary, point.plan.config, record)

    run_plans([p.plan for _, p in pending], keep, executor=executor, workers=workers, address=address,
              progress=progress)
    return len(pending)


def _write_record(sweep: Sweep, out_dir: Path, outcome: SweepOutcome, executor: str, table: Path) -> None:
    base_overrides = [f"{k}={value_text(v)}" for k, v in sweep.spec.set_.items()]

    base = load_scenario(sweep.scenario_arg, [])
    data = provenance([(sweep.scenario_arg, base, base_overrides)], {},
                      {"sweep": {"file": str(sweep.path.resolve()), "name": sweep.name,
                                 "text": sweep.path.read_text(encoding="utf-8"),
                                 "systems": list(sweep.systems), "store": STORE_DIR,
                                 "runs": [p.key for p in sweep.points]},
                       "executor": executor, "warnings": list(sweep.warnings), "notes": list(sweep.notes),
                       "outputs": {"table": table.name, "plots": [p.name for p in outcome.plots]},
                       **outcome.as_json(), "table": table.name, "wall_s": outcome.wall_s})
    write_provenance(out_dir, data)
    tmp = out_dir / f".{SWEEP_RECORD}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(json_value({"name": sweep.name, **outcome.as_json(), "table": table.name,
                                          "plots": [p.name for p in outcome.plots]}), indent=1) + "\n",
                   encoding="utf-8")
    os.replace(tmp, out_dir / SWEEP_RECORD)
