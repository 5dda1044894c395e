"""The sweep file: its schema, the checks of its keys, and what a checked
sweep resolves to (its points, each a run plan).

A sweep file (YAML) names a ``scenario`` (a shipped name, or a file relative
to the sweep file), fixed overrides (``set``), ``axes`` (a scenario key -> a
list of values; ``seed`` is an axis like any other), the ``systems`` to run,
optional ``derived`` axes given relative to the deployment (a fraction of its
critical rate, or of the scenario's base rate), optional named ``cases`` (each
a set of overrides: one-at-a-time variants without a full grid) and the
``plot`` it feeds (:mod:`basin.experiments.sweep_plots`). The grid is
:mod:`basin.experiments.sweep_grid`'s, the running :mod:`basin.experiments.sweep`'s.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from basin.catalog.files import close_names
from basin.errors import BasinInputError
from basin.experiments.plan import RunPlan
from basin.experiments.scenario import _anchored, _looks_like_path, _problem, check_key, scenario_path
from basin.metrics.summary import RunSummary
from basin.systems import expand_systems

#: A summary field a plot can show besides the numeric ones: the run ended trapped.
TRAPPED = "trapped"


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
    """One run of the sweep: its coordinates and its plan (the plan's key is its store key)."""

    index: int
    #: Column -> value: every axis by its key, each derived axis by its name
    #: (and the rate it resolved to as NAME.per_min), ``system`` and ``seed``.
    coords: Mapping[str, Any]
    plan: RunPlan

    @property
    def key(self) -> str:
        return self.plan.key


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


def value_text(value: Any) -> str:
    """A value as ``--set`` reads it (JSON is YAML)."""
    return json.dumps(value)


def _check_sweep_key(path: Path, where: str, key: str) -> None:
    item = f"{key}=0"
    try:
        check_key(key.split("."), item)
    except BasinInputError as exc:
        raise BasinInputError(f"{path}: field '{where}': " + str(exc).removeprefix(f"--set '{item}': ")) from None


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


@dataclass(frozen=True, slots=True)
class CheckedSpec:
    """What checking a sweep's keys gives the grid."""

    #: The scenario as the runs name it (a shipped name, or the file's absolute path).
    scenario_arg: str
    scenario_file: Path
    #: The systems listed (None: the scenario's own policy).
    systems: tuple[str, ...] | None


def check_spec(path: Path, spec: SweepSpec) -> CheckedSpec:
    """Check a sweep's keys before its grid is made: the scenario exists,
    each key is a scenario key given in one place only, axis values and
    derived axes are well formed, the cases and systems are known."""
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
        texts = [value_text(v) for v in values]
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

    return CheckedSpec(scenario_arg, scenario_file, systems)


def is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
