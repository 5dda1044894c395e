"""Sweeps: one scenario over a grid of overrides, each run kept in a result
store, one table of every run and the plot the sweep feeds.

A sweep file (YAML) names a ``scenario`` (a shipped name, or a file relative
to the sweep file), fixed overrides (``set``), ``axes`` (a scenario key -> a
list of values; ``seed`` is an axis like any other), the ``systems`` to run,
optional ``derived`` axes given relative to the deployment (a fraction of its
critical rate, or of the scenario's base rate), optional named ``cases`` (each
a set of overrides: one-at-a-time variants without a full grid) and the
``plot`` it feeds
(:mod:`basin.experiments.sweep_plots`). Everything is checked before the first
run: every field, every key, every point of the grid as a scenario, every
system's parameters.

Each run is stored under the hash of its fully resolved config
(:mod:`basin.experiments.store`), so a rerun computes nothing, an interrupted
sweep resumes, and a changed axis computes only its new points.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import basin
from basin.catalog import load_hardware, require_critical_rate
from basin.catalog.files import close_names
from basin.diskcache import source_digest
from basin.errors import BasinInputError
from basin.experiments.executors import check_executor, execute
from basin.experiments.scenario import (
    Scenario,
    _anchored,
    _looks_like_path,
    _problem,
    apply_overrides,
    check_key,
    load_scenario,
    resolve_file_paths,
    scenario_dict,
    scenario_path,
)
from basin.experiments.store import STORE_DIR, RunStore, code_digest, run_key
from basin.jsonvalues import json_value
from basin.metrics.summary import RunSummary
from basin.runtables import Table
from basin.systems import expand_systems
from basin.yamlfile import load_mapping

#: A summary field a plot can show besides the numeric ones: the run ended trapped.
TRAPPED = "trapped"
TABLE_FILE = "sweep.parquet"
SWEEP_RECORD = "sweep.json"
#: Keys whose two spellings are one thing (the base rate): a sweep gives it once.
_BASE_RATE_KEYS = ("arrivals.base_per_min", "arrivals.base_fraction_of_critical")
#: Scenario keys a value of which is a path, read relative to the sweep file.
_PATH_KEYS = ("deployment", "workload.name", "arrivals.burst_workload.name", "policy_params.profile")


def numeric_summary_fields() -> tuple[str, ...]:
    """The run summary's number fields (what a plot can show), in its order."""
    return tuple(f.name for f in fields(RunSummary)
                 if str(f.type).replace(" ", "") in ("float", "int", "float|None", "int|None", "bool"))


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class DerivedAxis(_Model):
    """An axis given relative to the deployment: each value times a reference
    rate (sessions per minute) is written to ``sets``."""

    values: tuple[Annotated[float, Field(gt=0)], ...] = Field(min_length=1)
    #: The reference: ``critical`` (the deployment's critical rate with the
    #: scenario's workload: its cliff profile's lambda_c), ``base`` (the
    #: scenario's base rate with ``set`` and ``axes`` applied, before any
    #: derived axis) or a rate in sessions per minute.
    of: Literal["critical", "base"] | Annotated[float, Field(gt=0)] = "critical"
    #: The scenario key that receives the rate; ``arrivals.rate_changes`` sets
    #: the rate from ``at_min`` on (a post-surge rate).
    sets: str = "arrivals.base_per_min"
    #: For ``arrivals.rate_changes``: the minute the rate starts (default: the surge's end).
    at_min: float | None = Field(default=None, ge=0)


#: The run states a frontier may count as failing (every state but healthy).
RunStateName = Literal["trapped", "overloaded", "recovering", "undetermined"]
#: The column holding a sweep's case.
CASE = "case"


class PlotSpec(_Model):
    """One figure of the sweep (the kinds are in :mod:`basin.experiments.sweep_plots`)."""

    kind: Literal["heatmap", "line", "frontier", "relative"]
    #: A numeric run-summary field, or ``trapped`` (trapped in k of n seeds).
    #: A frontier always shows the failing share (``trapped``).
    field: str = "goodput_per_h"
    x: str
    #: The heatmap's second axis; the frontier's and relative plot's bar axis
    #: (a line plot draws one line per system instead).
    y: str | None = None
    #: Frontier: a third axis, one panel per value.
    group: str | None = None
    #: Frontier: the states that count as not recovered.
    fails: tuple[RunStateName, ...] | None = None
    #: Frontier: the largest share of seeds that may fail at a value of x that still holds.
    max_trapped: float | None = Field(default=None, ge=0, lt=1)
    #: Relative: the value of x every other value is divided by.
    reference: Any = None
    #: File name inside the output folder; its suffix picks the format (default: NAME-KIND-FIELD.png).
    out: str | None = None
    title: str | None = None


class SweepSpec(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    scenario: str = Field(min_length=1)
    set_: dict[str, Any] = Field(default_factory=dict, alias="set")
    axes: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(default_factory=dict)
    systems: tuple[str, ...] = ()
    derived: dict[str, DerivedAxis] = Field(default_factory=dict)
    #: Named sets of overrides, applied after ``set``: an axis named ``case``.
    cases: dict[str, dict[str, Any]] | None = None
    plot: tuple[PlotSpec, ...] = ()

    @field_validator("name")
    @classmethod
    def _file_safe(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError("use letters, digits, '.', '_' and '-' only (the name names the plots and the "
                             "default output folder)")
        return value

    @field_validator("plot", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, dict) else value

    @field_validator("systems", mode="before")
    @classmethod
    def _one_system(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value  # `systems: all` or `systems: basin`


# ----------------------------------------------------------------- points
@dataclass(frozen=True, slots=True)
class Point:
    """One run of the sweep: its coordinates, its scenario, its store key."""

    index: int
    #: Column -> value: every axis by its key, each derived axis by its name
    #: (and the rate it resolved to as NAME.per_min), ``system`` and ``seed``.
    coords: Mapping[str, Any]
    scenario: Scenario
    system: str
    params: Mapping[str, object]
    config: Mapping[str, Any]
    key: str
    overrides: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Sweep:
    """A checked sweep file and every point of its grid."""

    path: Path
    spec: SweepSpec
    scenario_arg: str
    points: tuple[Point, ...]
    #: The columns that are coordinates, in table order.
    coord_columns: tuple[str, ...]
    #: Axis name -> its values as given (derived axes included), for plots.
    axis_values: Mapping[str, tuple[Any, ...]]
    systems: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name


def spec_file_error(path: Path, exc: ValidationError, spec: type[BaseModel], *,
                    locate: Callable[[list[str]], list[str]] | None = None,
                    too_short: Mapping[str, str] | None = None) -> BasinInputError:
    """One line per problem of a sweep-like file (sweep, tuning): the field as
    the file spells it, what is wrong, a close name for a misspelt top-level
    field. ``locate`` rewrites an error's path; ``too_short`` words an empty
    list by field (key ``""``: any other field)."""
    lines = []
    known = sorted(f.alias or n for n, f in spec.model_fields.items())
    for err in exc.errors():
        parts = [str(p) for p in err["loc"]]
        loc = ".".join(locate(parts) if locate is not None else parts) or "(top level)"
        if loc.startswith("set_"):
            loc = "set" + loc[4:]
        got = err.get("input")
        shown = "" if isinstance(got, dict) or err["type"] in ("missing", "extra_forbidden") else f" (got {got!r})"
        problem = _problem(err)
        if too_short is not None and err["type"] == "too_short":
            problem = too_short.get(loc, too_short[""])
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
            close = close_names(str(err["loc"][0]), known)
            problem += (f"; did you mean {' or '.join(close)}?" if close else "") + f" (fields: {', '.join(known)})"
        lines.append(f"{path}: field '{loc}': {problem}{shown}")
    return BasinInputError("\n".join(lines))


def _value_text(value: Any) -> str:
    """A value as ``--set`` reads it (JSON is YAML)."""
    return json.dumps(value)


def _check_sweep_key(path: Path, where: str, key: str) -> None:
    item = f"{key}=0"
    try:
        check_key(key.split("."), item)
    except BasinInputError as exc:
        raise BasinInputError(f"{path}: field '{where}': " + str(exc).removeprefix(f"--set '{item}': ")) from None


def _anchor(key: str, value: Any, base: Path) -> Any:
    """A path-valued override read relative to the sweep file's folder."""
    if key in _PATH_KEYS and _looks_like_path(value):
        return _anchored(value, base)
    if key == "policy_params.predictor" and isinstance(value, str) and value.lower().startswith("ridge:") \
            and _looks_like_path(value[6:]):
        return "ridge:" + _anchored(value[6:], base)
    return value


def _base_data(scenario_file: Path) -> dict[str, Any]:
    data = load_mapping(scenario_file, "scenario", "scenario fields")
    return resolve_file_paths(data, scenario_file.resolve().parent)


def _scenario_at(path: Path, scenario_file: Path, base: Mapping[str, Any],
                 items: Sequence[tuple[str, Any, str]], where: str) -> Scenario:
    """The scenario with ``items`` (key, value, the sweep field that gave it)
    applied, or an error naming that sweep field and the point."""
    data = json.loads(json.dumps(base))  # a deep copy of plain data
    apply_overrides(data, [f"{k}={_value_text(v)}" for k, v, _ in items])
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            source = next((src for k, _, src in items if loc and (loc == k or loc.startswith(k + ".")
                                                                     or k.startswith(loc + "."))), None)
            got = err.get("input")
            shown = "" if isinstance(got, dict) or err["type"] in ("missing", "extra_forbidden") \
                else f" (got {got!r})"
            origin = f"field '{source}'" if source else f"scenario {scenario_file}"
            lines.append(f"{path}: {origin} at the run {where}: "
                         + (f"scenario field '{loc}': " if loc else "") + f"{_problem(err)}{shown}")
        raise BasinInputError("\n".join(lines)) from None


def _reference_rate(path: Path, name: str, axis: DerivedAxis, sc: Scenario) -> float:
    # Lazy: this import loads 38 modules; only this path uses it.
    from basin.experiments.plan import base_rate_per_min, deployment_for

    dep = deployment_for(sc)
    if axis.of == "critical":
        return require_critical_rate(dep, sc.workload.name, f"{path}: field 'derived.{name}'").per_min
    if axis.of == "base":
        return base_rate_per_min(sc, dep)
    return float(axis.of)


def _derived_value(name: str, axis: DerivedAxis, rate: float, sc: Scenario) -> Any:
    if axis.sets == "arrivals.rate_changes":
        at = axis.at_min if axis.at_min is not None else sc.surge.end_min
        return [{"at_min": at, "per_min": rate}]
    return rate


def load_sweep(file: str | os.PathLike[str]) -> Sweep:
    """Read and check a sweep file and resolve every point of its grid (no run)."""
    path = Path(file)
    raw = load_mapping(path, "sweep", "sweep fields (name, scenario, set, axes, systems, derived, cases, plot)")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        raise spec_file_error(path, exc, SweepSpec) from None
    return resolve_sweep(path, spec)


def resolve_sweep(path: Path, spec: SweepSpec) -> Sweep:
    """Check a sweep given as a spec and resolve every point of its grid (no
    run). ``path`` is the file it came from: relative paths are read from its
    folder and messages name it (``basin tune`` builds its specs in memory)."""
    # Lazy: this import loads 38 modules; only this path uses it.
    from basin.experiments.plan import params_for
    from basin.experiments.runner import check_runnable

    here = path.resolve().parent
    scenario_arg = _anchored(spec.scenario, here) if _looks_like_path(spec.scenario) else spec.scenario
    try:
        scenario_file = scenario_path(scenario_arg)
    except BasinInputError as exc:
        raise BasinInputError(f"{path}: field 'scenario': {exc}") from None
    scenario_arg = str(scenario_file.resolve()) if _looks_like_path(spec.scenario) else scenario_arg

    # Keys: each must exist, and each thing is given in one place only.
    given: dict[str, str] = {}
    for section, keys in (("set", list(spec.set_)), ("axes", list(spec.axes)),
                          ("derived", [d.sets for d in spec.derived.values()])):
        for i, key in enumerate(keys):
            where = f"{section}.{key}" if section != "derived" else f"derived.{list(spec.derived)[i]}.sets"
            one = _thing_given(path, where, key, "a scenario key")
            if one in given:
                same = "the base rate" if key in _BASE_RATE_KEYS else f"'{key}'"
                raise BasinInputError(f"{path}: field '{where}' and field '{given[one]}' both give {same}; "
                                      "give it in one place (a fixed value under set, or an axis)")
            given[one] = where
    for key, values in spec.axes.items():
        texts = [_value_text(v) for v in values]
        dupes = sorted({t for t in texts if texts.count(t) > 1})
        if dupes:
            raise BasinInputError(f"{path}: field 'axes.{key}': the value(s) {', '.join(dupes)} appear twice; "
                                  "list each value once")
    summary_names = {f.name for f in fields(RunSummary)}
    for name, axis in spec.derived.items():
        if name in spec.axes or name in ("system", "seed", "run", CASE) or name in summary_names or "." in name:
            raise BasinInputError(f"{path}: field 'derived.{name}': a derived axis needs a name of its own "
                                  "(not a scenario key, 'system', 'seed', 'run', 'case' or a summary field), "
                                  "e.g. base_load")
        if len(set(axis.values)) != len(axis.values):
            raise BasinInputError(f"{path}: field 'derived.{name}.values': a value appears twice; list each once")
        if axis.at_min is not None and axis.sets != "arrivals.rate_changes":
            raise BasinInputError(f"{path}: field 'derived.{name}.at_min': only an axis that sets "
                                  "arrivals.rate_changes starts at a minute; drop at_min or set that key")
    _check_cases(path, spec, given)
    try:
        systems = tuple(expand_systems(list(spec.systems))) if spec.systems else None
    except BasinInputError as exc:
        raise BasinInputError(f"{path}: field 'systems': {exc}") from None

    base = _base_data(scenario_file)
    sweep_dir = here
    fixed = [(k, _anchor(k, v, sweep_dir), f"set.{k}") for k, v in spec.set_.items()]
    axis_items = [[(k, _anchor(k, v, sweep_dir), f"axes.{k}") for v in values] for k, values in spec.axes.items()]
    derived = list(spec.derived.items())
    systems = systems or (_scenario_at(path, scenario_file, base, fixed, "with set").policy,)
    # No cases: one unnamed case without overrides (and no case column).
    cases: list[tuple[str | None, list[tuple[str, Any, str]]]] = (
        [(name, [(k, _anchor(k, v, sweep_dir), f"cases.{name}.{k}") for k, v in over.items()])
         for name, over in spec.cases.items()] if spec.cases else [(None, [])])

    points: list[Point] = []
    checked: dict[str, tuple[list[str], list[str]]] = {}
    warnings: list[str] = []
    notes: list[str] = []
    for (case, case_items), combo in itertools.product(
            cases, itertools.product(*axis_items) if axis_items else [()]):
        where = ", ".join([*([f"case={case}"] if case is not None else []),
                           *(f"{k}={_value_text(v)}" for k, v, _ in combo)]) or "(no axes)"
        fixed_case = [*fixed, *case_items]
        sc0 = _scenario_at(path, scenario_file, base, [*fixed_case, *combo], where)
        for fractions in itertools.product(*[a.values for _, a in derived]) if derived else [()]:
            extra: list[tuple[str, Any, str]] = []
            coords: dict[str, Any] = {CASE: case} if case is not None else {}
            coords.update({k: v for k, v, _ in combo})
            for (name, axis), fraction in zip(derived, fractions):
                rate = fraction * _reference_rate(path, name, axis, sc0)
                extra.append((axis.sets, _derived_value(name, axis, rate, sc0), f"derived.{name}"))
                coords[name] = fraction
                coords[f"{name}.per_min"] = rate
            at = where + "".join(f", {n}={f:g}" for (n, _), f in zip(derived, fractions))
            sc = _scenario_at(path, scenario_file, base, [*fixed_case, *combo, *extra], at) if extra else sc0
            check_id = json.dumps(scenario_dict(sc.model_copy(update={"seed": 0})), sort_keys=True)
            if check_id not in checked:
                try:
                    split, found = check_runnable(sc, list(systems))
                except BasinInputError as exc:
                    raise BasinInputError(f"{path}: at the run {at}: {exc}") from None
                checked[check_id] = (list(split.notes), found)
            run_notes, run_warnings = checked[check_id]
            warnings += [w for w in run_warnings if w not in warnings]
            notes += [n for n in run_notes if n not in notes]
            overrides = tuple(f"{k}={_value_text(v)}" for k, v, _ in [*fixed_case, *combo, *extra])
            for system in systems:
                params = dict(params_for(sc, [system], strict=False).given[system])
                config = run_config(sc, system, params)
                point_coords = {**coords, "system": system, "seed": sc.seed}
                points.append(Point(len(points), point_coords, sc, system, params, config, run_key(config),
                                    overrides))
    coord_columns = tuple(dict.fromkeys(c for p in points for c in p.coords))
    axis_values: dict[str, tuple[Any, ...]] = {CASE: tuple(spec.cases)} if spec.cases else {}
    axis_values.update({k: tuple(v) for k, v in spec.axes.items()})
    axis_values.update({n: a.values for n, a in derived})
    axis_values["system"] = systems
    axis_values.setdefault("seed", tuple(dict.fromkeys(p.scenario.seed for p in points)))
    sweep = Sweep(path, spec, scenario_arg, tuple(points), coord_columns, axis_values, tuple(systems),
                  tuple(warnings), tuple(notes))
    # Lazy: basin.experiments.sweep_plots imports this module (an import circle).
    from basin.experiments.sweep_plots import check_plots

    check_plots(sweep)
    return sweep


def _thing_given(path: Path, where: str, key: str, role: str) -> str:
    """Check a key the sweep file gives (at ``where``, as ``role``) and return the
    thing it sets: the two base-rate keys are one thing."""
    if key == "policy":
        raise BasinInputError(f"{path}: field '{where}': the systems are listed under 'systems:' "
                              f"(a list of policies), not as {role}")
    _check_sweep_key(path, where, key)
    return _BASE_RATE_KEYS[0] if key in _BASE_RATE_KEYS else key


def _check_cases(path: Path, spec: SweepSpec, given: Mapping[str, str]) -> None:
    """Each case's keys are scenario keys given nowhere else (a case may
    refine a mapping given under ``set``, as it is applied after it), and no
    two cases are the same runs."""
    if spec.cases is None:
        return
    if not spec.cases:
        raise BasinInputError(f"{path}: field 'cases': no case given; name at least one (e.g. default: {{}}) "
                              "or drop cases")
    seen: dict[str, str] = {}
    for name, over in spec.cases.items():
        if not re.fullmatch(r"[\w][\w.+=-]*", str(name)):
            raise BasinInputError(f"{path}: field 'cases.{name}': a case name is one word of letters, digits "
                                  "and '.', '_', '+', '=', '-' (it labels the table and the plots)")
        mine: dict[str, str] = {}
        for key in over:
            where = f"cases.{name}.{key}"
            if key == "seed":
                raise BasinInputError(f"{path}: field '{where}': seeds are an axis (axes: seed: [...]), "
                                      "shared by every case; drop seed from the case")
            one = _thing_given(path, where, key, "a case's key")
            if one in mine:
                raise BasinInputError(f"{path}: field '{where}' and field '{mine[one]}' both give the base rate; "
                                      "give it once")
            mine[one] = where
            other = given.get(one)
            if other is not None:
                same = "the base rate" if key in _BASE_RATE_KEYS else f"'{key}'"
                raise BasinInputError(f"{path}: field '{where}' and field '{other}' both give {same}; a case "
                                      "may not override set, an axis or a derived axis: move the key into "
                                      "every case, or out of the cases")
            nested = next((w for k, w in given.items() if not w.startswith("set.")
                           and (k.startswith(key + ".") or key.startswith(k + "."))), None)
            if nested is not None:
                raise BasinInputError(f"{path}: field '{where}' overlaps field '{nested}' (one holds the "
                                      "other); give each part in one place")
        text = json.dumps({k: over[k] for k in sorted(over)}, sort_keys=True)
        if text in seen:
            raise BasinInputError(f"{path}: field 'cases.{name}': the same overrides as case '{seen[text]}' "
                                  "(the same runs); give each case once")
        seen[text] = str(name)


def _file_digest(value: object) -> str | None:
    if isinstance(value, str) and _looks_like_path(value) and Path(value).is_file():
        return source_digest([Path(value)])
    return None


def run_config(sc: Scenario, system: str, params: Mapping[str, object]) -> dict[str, Any]:
    """Everything one run's result depends on, as plain data (hashed for its store key)."""
    # Lazy: this import loads 38 modules; only this path uses it.
    from basin.experiments.plan import base_rate_per_min, cliff_used, deployment_for, resolved_params

    dep = deployment_for(sc)
    cliff, _ = cliff_used(sc, system, params)
    if cliff is not None:  # the profile by its content, not by where the checkout lies
        origin = str(cliff.get("origin", ""))
        cliff = {**cliff, "origin": Path(origin).name, "origin_digest": _file_digest(origin)}
    files = {k: d for k, d in (("workload", _file_digest(sc.workload.name)),
                               ("burst_workload", _file_digest(sc.arrivals.burst_workload.name)
                                if sc.arrivals.burst_workload else None)) if d}
    return {
        "scenario": {k: v for k, v in scenario_dict(sc).items() if k not in ("name", "description")},
        "system": system,
        "policy_params": resolved_params(system, params),
        "cliff_profile": cliff,
        "deployment": dep.model_dump(mode="json"),
        "hardware": load_hardware(dep.hardware).model_dump(mode="json"),
        "base_rate_per_min": base_rate_per_min(sc, dep),
        "files": files,
        "basin_serve_version": basin.__version__,
        "code_digest": code_digest(),
    }


# -------------------------------------------------------------- running
@dataclass(frozen=True, slots=True)
class RunJob:
    """What a worker needs for one run (it crosses a process boundary)."""

    key: str
    scenario: Scenario
    system: str
    params: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class RunOutput:
    key: str
    tables: tuple[Table, Table, Table]
    summary: RunSummary
    policy_params: dict[str, Any]
    cliff: dict[str, Any] | None
    wall_s: float


def compute_run(job: RunJob) -> RunOutput:
    """Simulate one run (module-level: pickled to pool and Ray workers)."""
    # Lazy: this import loads 38 modules; only this path uses it.
    from basin.experiments.runner import run_scenario

    start = time.perf_counter()
    run = run_scenario(job.scenario, job.system, params=dict(job.params))
    res = run.result
    return RunOutput(job.key, (res.calls, res.sessions, res.timeseries), run.summary, run.policy_params,
                     run.cliff, time.perf_counter() - start)


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
        # Lazy: basin.experiments.sweep_plots imports this module (an import circle).
        from basin.experiments.sweep_plots import draw_plots

        drawn = draw_plots(sweep, table_rows(sweep, store), out_dir)
    wall = time.perf_counter() - start
    outcome = SweepOutcome(len(sweep.points), computed, len(sweep.points) - computed, out_dir / TABLE_FILE,
                           tuple(drawn), wall)
    _write_record(sweep, out_dir, outcome, executor, table)
    return outcome


def compute_pending(sweeps: Sequence[Sweep], store: RunStore, *, executor: str = "local",
                    workers: int | None = None, address: str | None = None,
                    progress: Callable[[int, int], None] | None = None) -> int:
    """Compute the runs of ``sweeps`` the store lacks (each key once, across
    them all, on one executor), keeping each in the store as it finishes, so
    several sweeps share one pool and one progress display. Returns the count
    computed."""
    # Lazy: this import loads 38 modules; only this path uses it.
    from basin.experiments.plan import provenance

    todo: dict[str, tuple[Sweep, Point]] = {}
    for sweep in sweeps:
        for p in pending_points(sweep, store):
            todo.setdefault(p.key, (sweep, p))

    def keep(index: int, out: RunOutput) -> None:
        sweep, point = todo[out.key]
        record = provenance([(sweep.scenario_arg, point.scenario, list(point.overrides))],
                            {point.system: {"policy_params": out.policy_params, "cliff_profile": out.cliff}},
                            {"sweep": {"file": str(sweep.path.resolve()), "name": sweep.name},
                             "point": dict(point.coords), "run_key": point.key, "wall_s": out.wall_s,
                             "executor": executor})
        store.put(out.key, out.tables, out.summary, point.config, record)

    jobs = [RunJob(p.key, p.scenario, p.system, p.params) for _, p in todo.values()]
    execute(compute_run, jobs, keep, executor=executor, workers=workers, address=address, progress=progress)
    return len(jobs)


def _write_record(sweep: Sweep, out_dir: Path, outcome: SweepOutcome, executor: str, table: Path) -> None:
    # Lazy: this import loads 38 modules; only this path uses it.
    from basin.experiments.plan import provenance, write_provenance

    base_overrides = [f"{k}={_value_text(v)}" for k, v in sweep.spec.set_.items()]

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


# ---------------------------------------------------------------- table
def table_rows(sweep: Sweep, store: RunStore) -> list[dict[str, Any]]:
    """One row per point, in the grid's order: its coordinates, its store key
    and its run summary (without the windows; the state by name)."""
    rows = []
    for p in sweep.points:
        summary = store.summary(p.key).to_dict()
        summary.pop("windows", None)
        summary.pop("system", None)
        rows.append({**{c: p.coords.get(c) for c in sweep.coord_columns}, "run": p.key, **summary})
    return rows


def _column(values: list[Any]) -> Any:
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa

    if any(isinstance(v, (dict, list, tuple)) for v in values):
        return pa.array([None if v is None else json.dumps(v, sort_keys=True) for v in values], pa.string())
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed kinds (a number and a name): kept as their YAML text
        return pa.array([None if v is None else _value_text(v) for v in values], pa.string())


def write_table(sweep: Sweep, store: RunStore, path: Path) -> Path:
    """The sweep's Parquet table, written whole or not at all."""
    return write_rows(table_rows(sweep, store), path)


def write_rows(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Rows as a Parquet table (a column per key, in first-seen order; mixed
    or nested values as their YAML text), written whole or not at all."""
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(dict.fromkeys(k for r in rows for k in r))
    arrow = pa.table({n: _column([r.get(n) for r in rows]) for n in names})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(arrow, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
