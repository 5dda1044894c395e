"""Tuning: every baseline swept over its own key parameters on the main
scenarios, and reported both at its defaults and at its best setting, so that
a comparison against BASIN is not one against baselines at published
defaults only.

A tuning file (YAML) names ``scenarios``, fixed overrides (``set``),
``seeds`` and ``systems``: a system -> a grid (a policy parameter -> the
values it takes; an empty grid means the defaults only), or a list of grids
(their union: one parameter at a time, then a finer product where the first
looks promising, within a run budget). Every parameter and value is checked
as ``basin run --set policy_params.X=...`` checks it, before any run. A
grid's points are the product of its lists; the defaults are always one more
point of the system's settings.

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

import csv
import dataclasses
import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from basin.catalog.files import close_names
from basin.errors import BasinInputError
from basin.experiments.executors import check_executor
from basin.experiments.scenario import _anchored, _looks_like_path, scenario_path
from basin.experiments.store import STORE_DIR, RunStore
from basin.experiments.sweep import compute_pending
from basin.experiments.sweep_grid import resolve_sweep
from basin.experiments.sweep_spec import Point, Sweep, SweepSpec, is_finite, spec_file_error
from basin.experiments.sweep_table import write_rows
from basin.jsonvalues import json_value
from basin.metrics.summary import RunSummary
from basin.plotting import new_figure, save_figure
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class, policy_names
from basin.systems import build_options
from basin.yamlfile import load_mapping

TABLE_FILE = "tune.parquet"
BEST_FILE = "best.csv"
PLOT_FILE = "tune-goodput.png"
RECORD_FILE = "tune.json"
#: The label of a system's default setting.
DEFAULTS = "defaults"
#: The selection rule, as the output and the docs state it.
RULE = ("best = the one parameter setting per system that maximises the mean, over scenarios, of its goodput "
        "(mean over seeds) relative to the best goodput any system and setting reached in that scenario; "
        "oracle = the setting best in one scenario alone (not deployable)")
#: Columns of the run table that a parameter may not be named after.
_FIXED_COLUMNS = ("system", "scenario", "seed", "default", "setting", "run")


# -------------------------------------------------------------------- the file
class TuneSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1)
    description: str = ""
    #: Shipped scenario names, or files relative to the tuning file.
    scenarios: tuple[str, ...] = Field(min_length=1)
    #: Fixed overrides of every run, as ``--set`` gives them (not policy parameters).
    set_: dict[str, Any] = Field(default_factory=dict, alias="set")
    seeds: tuple[Annotated[int, Field(ge=0)], ...] = Field(default=(0,), min_length=1)
    #: System -> its grids (parameter -> values; a file's single grid is read as a list of one; an
    #: empty grid: the defaults only).
    systems: dict[str, list[dict[str, Annotated[list[Any], Field(min_length=1)]]]] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _file_safe(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError("use letters, digits, '.', '_' and '-' only (the name labels the outputs)")
        return value

    @field_validator("systems", mode="before")
    @classmethod
    def _grids(cls, value: object) -> object:
        # `hicache:` (no grid) reads as null in YAML: the defaults only; one grid is a list of one.
        if isinstance(value, dict):
            return {k: [{}] if v is None or v == [] else [v] if isinstance(v, dict) else v for k, v in value.items()}
        return value


def _listed(raw: Mapping[str, Any]) -> set[str]:
    """The systems a file gives a list of grids (their messages name a grid by its place)."""
    systems = raw.get("systems")
    return {k for k, v in systems.items() if isinstance(v, list) and v} if isinstance(systems, dict) else set()


def _file_error(path: Path, exc: ValidationError, listed: set[str]) -> BasinInputError:
    def locate(parts: list[str]) -> list[str]:
        if len(parts) > 2 and parts[0] == "systems" and parts[1] not in listed and parts[2] == "0":
            del parts[2]  # a single grid is read as a list of one: name it as the file gives it
        return parts

    return spec_file_error(path, exc, TuneSpec, locate=locate, too_short={
        "scenarios": "list at least one scenario", "seeds": "list at least one seed",
        "systems": "name at least one system", "": "list at least one value"})


def _grids(spec: TuneSpec, listed: set[str], system: str) -> list[tuple[str, dict[str, list[Any]]]]:
    """The system's grids, each with the field that gave it."""
    grids = spec.systems[system]
    if system not in listed:
        return [(f"systems.{system}", grids[0])]
    return [(f"systems.{system}.{i}", g) for i, g in enumerate(grids)]


# ------------------------------------------------------------------- settings
@dataclass(frozen=True, slots=True)
class Setting:
    """One parameter setting of a system: the resolved value of each of its
    grid's parameters (defaults filled in), in the grid's order."""

    system: str
    values: tuple[tuple[str, Any], ...]
    default: bool
    #: ``defaults``, or the parameters that differ from them (``margin=0.2``).
    label: str

    def params(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True, slots=True)
class TuneRun:
    """One run of the tuning: a system's setting on a scenario and seed."""

    setting: Setting
    scenario: str
    seed: int
    point: Point

    @property
    def system(self) -> str:
        return self.setting.system

    @property
    def key(self) -> str:
        return self.point.key


@dataclass(frozen=True, slots=True)
class Tuning:
    """A checked tuning file and every run it asks for."""

    path: Path
    spec: TuneSpec
    #: Scenario labels (a shipped name, or a file's stem), in the file's order.
    scenarios: tuple[str, ...]
    #: Label -> the argument the sweeps were given (a name, or an absolute path).
    scenario_args: Mapping[str, str]
    systems: tuple[str, ...]
    #: System -> its settings, the defaults first, then each grid's points in order.
    settings: Mapping[str, tuple[Setting, ...]]
    #: Every run once (keyed by its resolved config), in table order.
    runs: tuple[TuneRun, ...]
    #: The in-memory sweeps the runs come from (the store records each run's).
    sweeps: tuple[Sweep, ...]
    #: Every grid parameter, in first-seen order: the table's parameter columns.
    param_columns: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.12g}"
    return value if isinstance(value, str) else json.dumps(value)


def _label(values: Sequence[tuple[str, Any]], defaults: Mapping[str, Any]) -> str:
    changed = [f"{k}={_format(v)}" for k, v in values if v != defaults.get(k)]
    return ", ".join(changed) or DEFAULTS


def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"thunderagent.capacity_scale": 2}`` as ``{"thunderagent": {"capacity_scale": 2}}``."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def check_setting(system: str, setting: Mapping[str, Any]) -> None:
    """Refuse a setting ``basin run`` would refuse: a parameter ``system`` does
    not have (nested parts included), a wrong type or a value out of range,
    by the same checks (the system's parameter class and its build options)."""
    cls = policy_class(system)
    options = build_options(system)
    values = _nested(setting)
    known = [*cls.Params.names(), *options]
    for name in values:
        if name not in known:
            close = close_names(name, known)
            raise PolicyParamError(system, name, "unknown"
                                   + (f"; did you mean {' or '.join(close)}?" if close else "")
                                   + f" (parameters: {', '.join(known) or '(none)'})")
    for name in options:
        if name in values and not isinstance(values[name], str):
            raise PolicyParamError(system, name, f"expected text, got {values[name]!r}")
    cls.Params.from_mapping({k: v for k, v in values.items() if k not in options})


def _check_grid(path: Path, field: str, system: str, grid: Mapping[str, Sequence[Any]]) -> None:
    """Refuse a grid any point of which ``basin run`` would refuse: a wrong
    value is named by its field and value; a clash between values (``u_low``
    above ``u_high``) by the setting that holds it."""
    for param, values in grid.items():
        where = f"{path}: field '{field}.{param}'"
        if param.split(".")[0] in _FIXED_COLUMNS or param in {f.name for f in fields(RunSummary)}:
            raise BasinInputError(f"{where}: '{param}' names a column of the run table; a policy has no such "
                                  "parameter")
        texts = [json.dumps(v, sort_keys=True) for v in values]
        dupes = sorted({t for t in texts if texts.count(t) > 1})
        if dupes:
            raise BasinInputError(f"{where}: the value(s) {', '.join(dupes)} appear twice; list each value once")
    names = list(grid)
    for combo in itertools.product(*grid.values()):
        try:
            check_setting(system, dict(zip(names, combo)))
        except PolicyParamError as exc:
            for param, value in zip(names, combo):
                try:
                    check_setting(system, {param: value})
                except PolicyParamError as alone:
                    if alone.field == param.split(".")[-1]:
                        raise BasinInputError(f"{path}: field '{field}.{param}': value {value!r}: "
                                              f"{alone}") from None
            shown = ", ".join(f"{k}={_format(v)}" for k, v in zip(names, combo))
            raise BasinInputError(f"{path}: field '{field}': the setting {shown}: {exc}; choose values that "
                                  "hold in every combination of the grid") from None


def _scenario_entries(path: Path, spec: TuneSpec) -> dict[str, str]:
    """Label -> sweep argument of each scenario (files read relative to the tuning file)."""
    here = path.resolve().parent
    out: dict[str, str] = {}
    for i, entry in enumerate(spec.scenarios):
        arg = _anchored(entry, here) if _looks_like_path(entry) else entry
        try:
            resolved = scenario_path(arg)
        except BasinInputError as exc:
            raise BasinInputError(f"{path}: field 'scenarios.{i}': {exc}") from None
        label = Path(entry).stem if _looks_like_path(entry) else entry
        if label in out:
            raise BasinInputError(f"{path}: field 'scenarios.{i}': scenario '{label}' is listed twice; list each "
                                  "once")
        out[label] = str(resolved.resolve()) if _looks_like_path(entry) else arg
    return out


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def load_tuning(file: str | os.PathLike[str]) -> Tuning:
    """Read and check a tuning file and resolve every run (no run)."""
    # Lazy: this import loads 38 modules; only this path uses it.
    from basin.experiments.plan import resolved_params

    path = Path(file)
    raw = load_mapping(path, "tuning", "tuning fields (name, scenarios, set, seeds, systems)")
    listed = _listed(raw)
    try:
        spec = TuneSpec.model_validate(raw)
    except ValidationError as exc:
        raise _file_error(path, exc, listed) from None
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
        for where, grid in _grids(spec, listed, system):
            _check_grid(path, where, system, grid)
    scenario_args = _scenario_entries(path, spec)

    by_cell: dict[tuple[str, tuple[tuple[str, Any], ...], str, int], Point] = {}
    settings: dict[str, dict[tuple[tuple[str, Any], ...], Setting]] = {}
    sweeps: list[Sweep] = []
    for system, grids in spec.systems.items():
        names = list(dict.fromkeys(k for grid in grids for k in grid))
        defaults_of: dict[str, Any] = {}
        for label, arg in scenario_args.items():
            seeds = {"seed": list(spec.seeds)}
            base = SweepSpec(name=_safe(f"{spec.name}.{system}.{label}.defaults"), scenario=arg, set=spec.set_,
                             axes=seeds, systems=(system,))
            parts = [resolve_sweep(path, base)]
            for i, grid in enumerate(g for g in grids if g):
                axes = {f"policy_params.{k}": list(v) for k, v in grid.items()} | seeds
                parts.append(resolve_sweep(path, SweepSpec(name=_safe(f"{spec.name}.{system}.{label}.{i}"),
                                                           scenario=arg, set=spec.set_, axes=axes,
                                                           systems=(system,))))
            sweeps += parts
            for i, sweep in enumerate(parts):
                for p in sweep.points:
                    resolved = resolved_params(system, p.params)
                    values = tuple((k, _lookup(resolved, k)) for k in names)
                    if i == 0 and not defaults_of:
                        defaults_of = dict(values)
                    mine = settings.setdefault(system, {})
                    if values not in mine:
                        mine[values] = Setting(system, values, i == 0 or values == tuple(defaults_of.items()),
                                               _label(values, defaults_of))
                    by_cell.setdefault((system, values, label, p.scenario.seed), p)
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


# ------------------------------------------------------------------ selection
@dataclass(frozen=True, slots=True)
class Outcome:
    """One run as the selection sees it."""

    system: str
    #: The setting's identity (its label).
    setting: str
    scenario: str
    seed: int
    default: bool
    goodput_per_h: float


@dataclass(frozen=True, slots=True)
class ScenarioChoice:
    """A system in one scenario: at its defaults, at its best setting, and at
    the setting best in this scenario alone (the oracle). Goodputs are means
    over seeds."""

    scenario: str
    default_goodput: float
    best_goodput: float
    oracle_setting: str
    oracle_goodput: float
    #: The best goodput any system and setting reached here.
    reference_goodput: float

    @property
    def ratio(self) -> float:
        return self.best_goodput / self.default_goodput if self.default_goodput > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Choice:
    """A system's default and best setting, with their scores (the mean
    relative goodput of the selection rule) and the per-scenario figures."""

    system: str
    default_setting: str
    best_setting: str
    default_score: float
    best_score: float
    scenarios: tuple[ScenarioChoice, ...]
    settings_tried: int


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if is_finite(v)]
    return sum(kept) / len(kept) if kept else math.nan


def select(outcomes: Sequence[Outcome]) -> dict[str, Choice]:
    """Each system's best setting by the rule of this module (:data:`RULE`).

    The reference of a scenario is the highest seed-mean goodput of any
    system and setting there; a scenario whose reference is not positive
    (nothing was served by anyone) is left out of every mean. A setting is
    eligible only if it ran on every scenario its system ran on. Ties go to
    the defaults, then to the setting seen first, so a setting that only
    equals the defaults never replaces them."""
    cells: dict[tuple[str, str, str], list[float]] = {}
    order: dict[str, list[str]] = {}
    defaults: dict[str, str] = {}
    scenarios: list[str] = []
    for o in outcomes:
        cells.setdefault((o.system, o.setting, o.scenario), []).append(o.goodput_per_h)
        mine = order.setdefault(o.system, [])
        if o.setting not in mine:
            mine.append(o.setting)
        if o.default:
            defaults.setdefault(o.system, o.setting)
        if o.scenario not in scenarios:
            scenarios.append(o.scenario)
    for system in order:
        if system not in defaults:
            raise BasinInputError(f"system '{system}': no run is marked as its defaults")
    goodput = {cell: _mean(values) for cell, values in cells.items()}
    reference = {sc: max((g for (_, _, s), g in goodput.items() if s == sc and is_finite(g)), default=math.nan)
                 for sc in scenarios}
    scored = [sc for sc in scenarios if is_finite(reference[sc]) and reference[sc] > 0]

    out: dict[str, Choice] = {}
    for system, names in order.items():
        own = [sc for sc in scenarios if any((system, n, sc) in goodput for n in names)]
        eligible = [n for n in names if all((system, n, sc) in goodput for sc in own)]

        def score(name: str, system: str = system, own: list[str] = own) -> float:
            return _mean([goodput[(system, name, sc)] / reference[sc] for sc in own if sc in scored])

        default = defaults[system]
        best, best_score = default, score(default)
        for name in [default, *[n for n in eligible if n != default]]:
            value = score(name)
            if is_finite(value) and (not is_finite(best_score) or value > best_score):
                best, best_score = name, value
        per: list[ScenarioChoice] = []
        for sc in own:
            oracle, top = default, -math.inf
            for name in [default, *[n for n in names if n != default]]:
                g = goodput.get((system, name, sc), math.nan)
                if is_finite(g) and g > top:
                    oracle, top = name, g
            per.append(ScenarioChoice(sc, goodput.get((system, default, sc), math.nan),
                                      goodput.get((system, best, sc), math.nan), oracle,
                                      goodput.get((system, oracle, sc), math.nan), reference[sc]))
        out[system] = Choice(system, default, best, score(default), best_score, tuple(per), len(names))
    return out


# --------------------------------------------------------------------- running
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


def table_rows(tuning: Tuning, store: RunStore) -> list[dict[str, Any]]:
    """One row per run: its system, each grid parameter's value, scenario,
    seed, the default flag, the setting's label, its store key and its run
    summary (without the windows; the state by name)."""
    rows = []
    for r in tuning.runs:
        summary = store.summary(r.key).to_dict()
        summary.pop("windows", None)
        summary.pop("system", None)
        params = r.setting.params()
        rows.append({"system": r.system, **{c: params.get(c) for c in tuning.param_columns},
                     "scenario": r.scenario, "seed": r.seed, "default": r.setting.default,
                     "setting": r.setting.label, "run": r.key, **summary})
    return rows


def _states(rows: Sequence[Mapping[str, Any]]) -> str:
    return "/".join(str(r["state"]) for r in rows)


def best_rows(tuning: Tuning, rows: Sequence[Mapping[str, Any]], choices: Mapping[str, Choice],
              by_label: Mapping[tuple[str, str], Setting]) -> list[dict[str, Any]]:
    """A row per system and scenario: goodput at the defaults and at the best
    setting, their ratio, the best setting's values, the scores and the
    scenario's oracle."""
    out = []
    for c in choices.values():
        best = by_label[(c.system, c.best_setting)]
        for sc in c.scenarios:
            at = {name: [r for r in rows if r["system"] == c.system and r["scenario"] == sc.scenario
                         and r["setting"] == label] for name, label in (("default", c.default_setting),
                                                                        ("best", c.best_setting))}
            out.append({
                "system": c.system, "scenario": sc.scenario,
                "goodput_default": sc.default_goodput, "goodput_best": sc.best_goodput,
                "ratio_best_default": sc.ratio, "best_setting": c.best_setting,
                **{f"best.{k}": v for k, v in best.values},
                "state_default": _states(at["default"]), "state_best": _states(at["best"]),
                "completed_default": _mean([r["completed_fraction"] for r in at["default"]]),
                "completed_best": _mean([r["completed_fraction"] for r in at["best"]]),
                "score_default": c.default_score, "score_best": c.best_score,
                "oracle_setting": sc.oracle_setting, "goodput_oracle": sc.oracle_goodput,
                "goodput_reference": sc.reference_goodput, "settings_tried": c.settings_tried,
            })
    return out


def write_best(tuning: Tuning, rows: Sequence[Mapping[str, Any]], choices: Mapping[str, Choice],
               by_label: Mapping[tuple[str, str], Setting], path: Path) -> Path:
    """``best.csv``, written whole or not at all."""
    data = best_rows(tuning, rows, choices, by_label)
    names = list(dict.fromkeys(k for r in data for k in r))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=names)
            writer.writeheader()
            for r in data:
                writer.writerow({k: _csv_cell(r.get(k)) for k in names})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _csv_cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.6g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return "" if value is None else value


def draw_goodput(tuning: Tuning, choices: Mapping[str, Choice], path: Path) -> Path:
    """One panel per scenario: each system's goodput at its defaults and at
    its best setting, side by side (the best bar labelled with the ratio)."""
    n = len(tuning.scenarios)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = new_figure(4.2 * cols, 3.4 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    systems = [s for s in tuning.systems if s in choices]
    x = np.arange(len(systems))
    for ax, scenario in zip(axes, tuning.scenarios):
        at = [next(sc for sc in choices[s].scenarios if sc.scenario == scenario) for s in systems]
        default = [sc.default_goodput for sc in at]
        best = [sc.best_goodput for sc in at]
        ax.bar(x - 0.2, default, 0.4, label="defaults", color="#b8c4d6")
        bars = ax.bar(x + 0.2, best, 0.4, label="best setting", color="#2d5f9a")
        for bar, sc in zip(bars, at):
            if is_finite(sc.ratio) and abs(sc.ratio - 1) >= 0.005:
                ax.annotate(f"x{sc.ratio:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
        ax.set_title(scenario, fontsize=10)
        ax.set_xticks(x, systems, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("goodput (sessions/h)", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
    for ax in axes[n:]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper right", ncols=2, fontsize=8)
    fig.suptitle(f"{tuning.name}: defaults vs the best single setting per system", fontsize=11)
    return save_figure(fig, path)


def _write_record(tuning: Tuning, out_dir: Path, outcome: TuneOutcome, executor: str) -> None:
    # Lazy: this import loads 38 modules; only this path uses it.
    from basin.experiments.plan import provenance, resolved_params, write_provenance

    first = {r.scenario: r for r in tuning.runs if r.setting.default}
    scenarios = [(tuning.scenario_args[label], first[label].point.scenario, list(first[label].point.overrides))
                 for label in tuning.scenarios if label in first]
    systems = {s: {"defaults": resolved_params(s, next(r for r in tuning.runs if r.system == s
                                                        and r.setting.default).point.params),
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


__all__ = ["BEST_FILE", "DEFAULTS", "PLOT_FILE", "RULE", "TABLE_FILE", "Choice", "Outcome", "ScenarioChoice",
           "Setting", "TuneOutcome", "TuneRun", "TuneSpec", "Tuning", "check_setting", "load_tuning",
           "pending_runs", "run_tuning", "select", "table_rows"]
