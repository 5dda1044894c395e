"""The tuning file: its schema, its checks, and what a checked tuning
resolves to (its settings and runs, each run a sweep point and so a run plan).

A tuning file (YAML) names ``scenarios``, fixed overrides (``set``),
``seeds`` and ``systems``: a system -> a grid (a policy parameter -> the
values it takes; an empty grid means the defaults only), or a list of grids
(their union: one parameter at a time, then a finer product where the first
looks promising, within a run budget). Every parameter and value is checked
as ``basin run --set policy_params.X=...`` checks it, before any run. A
grid's points are the product of its lists; the defaults are always one more
point of the system's settings. The grid of runs is :mod:`basin.experiments.tune`'s.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from basin.catalog.files import close_names
from basin.errors import BasinInputError
from basin.experiments.scenario import _anchored, _looks_like_path, scenario_path
from basin.experiments.sweep_spec import Point, Sweep, spec_file_error
from basin.metrics.summary import RunSummary
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class
from basin.systems import build_options

#: The label of a system's default setting.
DEFAULTS = "defaults"


#: Columns of the run table that a parameter may not be named after.
FIXED_COLUMNS = ("system", "scenario", "seed", "default", "setting", "run")


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
    def grids_of(cls, value: object) -> object:
        # `hicache:` (no grid) reads as null in YAML: the defaults only; one grid is a list of one.
        if isinstance(value, dict):
            return {k: [{}] if v is None or v == [] else [v] if isinstance(v, dict) else v for k, v in value.items()}
        return value


def listed_systems(raw: Mapping[str, Any]) -> set[str]:
    """The systems a file gives a list of grids (their messages name a grid by its place)."""
    systems = raw.get("systems")
    return {k for k, v in systems.items() if isinstance(v, list) and v} if isinstance(systems, dict) else set()


def tune_file_error(path: Path, exc: ValidationError, listed: set[str]) -> BasinInputError:
    def locate(parts: list[str]) -> list[str]:
        if len(parts) > 2 and parts[0] == "systems" and parts[1] not in listed and parts[2] == "0":
            del parts[2]  # a single grid is read as a list of one: name it as the file gives it
        return parts

    return spec_file_error(path, exc, TuneSpec, locate=locate, too_short={
        "scenarios": "list at least one scenario", "seeds": "list at least one seed",
        "systems": "name at least one system", "": "list at least one value"})


def grids_of(spec: TuneSpec, listed: set[str], system: str) -> list[tuple[str, dict[str, list[Any]]]]:
    """The system's grids, each with the field that gave it."""
    grids = spec.systems[system]
    if system not in listed:
        return [(f"systems.{system}", grids[0])]
    return [(f"systems.{system}.{i}", g) for i, g in enumerate(grids)]


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


def setting_label(values: Sequence[tuple[str, Any]], defaults: Mapping[str, Any]) -> str:
    changed = [f"{k}={_format(v)}" for k, v in values if v != defaults.get(k)]
    return ", ".join(changed) or DEFAULTS


def lookup(data: Mapping[str, Any], dotted: str) -> Any:
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


def check_grid(path: Path, field: str, system: str, grid: Mapping[str, Sequence[Any]]) -> None:
    """Refuse a grid any point of which ``basin run`` would refuse: a wrong
    value is named by its field and value; a clash between values (``u_low``
    above ``u_high``) by the setting that holds it."""
    for param, values in grid.items():
        where = f"{path}: field '{field}.{param}'"
        if param.split(".")[0] in FIXED_COLUMNS or param in {f.name for f in fields(RunSummary)}:
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


def scenario_entries(path: Path, spec: TuneSpec) -> dict[str, str]:
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


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)
