"""A sweep's grid: every point of a checked sweep file as a run plan.

Each point is one scenario (the file's ``set``, a case, one value of each
axis and derived axis applied, in that order) under one system, resolved to a
:class:`~basin.experiments.plan.RunPlan` whose key is its store key. Every
point is checked before the first run (its scenario, every system's
parameters), and the sweep's plots are checked against the grid.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from basin.catalog import require_critical_rate
from basin.errors import BasinInputError
from basin.experiments.plan import base_rate_per_min, deployment_for, params_for, resolve_plan
from basin.experiments.runner import check_runnable
from basin.experiments.scenario import (
    Scenario,
    _anchored,
    _looks_like_path,
    _problem,
    apply_overrides,
    resolve_file_paths,
    scenario_dict,
)
from basin.experiments.sweep_plots import check_plots
from basin.experiments.sweep_spec import (
    _PATH_KEYS,
    CASE,
    DerivedAxis,
    Point,
    Sweep,
    SweepSpec,
    check_spec,
    spec_file_error,
    value_text,
)
from basin.yamlfile import load_mapping


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
    apply_overrides(data, [f"{k}={value_text(v)}" for k, v, _ in items])
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
    checked_spec = check_spec(path, spec)
    scenario_arg, scenario_file, systems = checked_spec.scenario_arg, checked_spec.scenario_file, checked_spec.systems
    here = path.resolve().parent
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
                           *(f"{k}={value_text(v)}" for k, v, _ in combo)]) or "(no axes)"
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
            overrides = tuple(f"{k}={value_text(v)}" for k, v, _ in [*fixed_case, *combo, *extra])
            for system in systems:
                plan = resolve_plan(sc, system, params_for(sc, [system], strict=False).given[system],
                                    argument=scenario_arg, overrides=overrides, keep_tables=True)
                points.append(Point(len(points), {**coords, "system": system, "seed": sc.seed}, plan))
    coord_columns = tuple(dict.fromkeys(c for p in points for c in p.coords))
    axis_values: dict[str, tuple[Any, ...]] = {CASE: tuple(spec.cases)} if spec.cases else {}
    axis_values.update({k: tuple(v) for k, v in spec.axes.items()})
    axis_values.update({n: a.values for n, a in derived})
    axis_values["system"] = systems
    axis_values.setdefault("seed", tuple(dict.fromkeys(p.plan.seed for p in points)))
    sweep = Sweep(path, spec, scenario_arg, tuple(points), coord_columns, axis_values, tuple(systems),
                  tuple(warnings), tuple(notes))
    check_plots(sweep)
    return sweep
