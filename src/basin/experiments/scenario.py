"""Scenario files: everything a run needs, in one validated YAML document.

A scenario names a deployment, a workload and its transforms, the arrival
process (base rate, surge, rate changes, warm start, or a production trace's
rate shape around the base rate as its mean), the run's length and
measurement window, interventions, the control policy and the seed. Any field
can be overridden from the command line with ``--set key.path=value``; a key
the schema does not have is refused with the valid ones. The base rate is
either ``arrivals.base_per_min`` or ``arrivals.base_fraction_of_critical``:
setting one with ``--set`` clears the other.

Relative file paths inside a scenario file (a workload file, a deployment
file, BASIN's ``policy_params.profile`` or ``predictor: ridge:FILE``) are read
relative to that file, so a scenario works from any directory; paths given
with ``--set`` are relative to the working directory, like any command-line
path.
"""

from __future__ import annotations

import types
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from basin.catalog import RouterName, SchedulePolicy
from basin.catalog.files import close_names
from basin.errors import BasinInputError
from basin.metrics.state import LabelRule
from basin.metrics.windows import DegradationRule
from basin.paths import SCENARIO_DIR
from basin.workload.arrivals import check_shape_window, shape_names
from basin.yamlfile import load_mapping, safe_load


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkloadSpec(_Model):
    #: A preset name (``basin workload list``) or a JSONL/Parquet file.
    name: str = "terminal-bench"
    #: Sessions to synthesise for synthetic presets (runs draw from this pool).
    sessions: int | None = Field(default=None, gt=0)
    tool_time: float = Field(default=1.0, gt=0)
    output: float = Field(default=1.0, gt=0)
    prompt: float = Field(default=1.0, gt=0)
    #: Cut every session to its first calls (short sessions, e.g. a burst).
    max_calls: int | None = Field(default=None, ge=1)


class SurgeSpec(_Model):
    start_min: float = Field(default=15.0, ge=0)
    end_min: float = Field(default=25.0, ge=0)
    #: Arrival-rate multiplier inside the window (1.0: no surge).
    factor: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> SurgeSpec:
        if self.end_min < self.start_min:
            raise ValueError(f"surge end_min ({self.end_min}) is before start_min ({self.start_min})")
        return self


class RateChangeSpec(_Model):
    at_min: float = Field(ge=0)
    per_min: float = Field(ge=0)


class ShapeSpec(_Model):
    """Arrivals shaped by a shipped production rate trace (docs/scenarios.md)."""

    #: A shipped rate shape (``basin.workload.arrivals.shape_names()``, e.g. ``servegen-m-large``).
    name: str
    #: Trace minute the run starts at.
    offset_min: float = Field(default=0.0, ge=0)
    #: Trace minutes played over the run (None: the run's duration_min, so trace time is run time).
    window_min: float | None = Field(default=None, gt=0)

    @field_validator("name")
    @classmethod
    def _shipped(cls, name: str) -> str:
        if name not in shape_names():
            close = close_names(name, shape_names())
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise ValueError(f"unknown arrival shape '{name}'; {hint}the shipped shapes are {', '.join(shape_names())}")
        return name


class ArrivalSpec(_Model):
    #: Base session arrival rate; or give ``base_fraction_of_critical`` to
    #: take it from the deployment's profiled critical rate.
    base_per_min: float | None = Field(default=None, gt=0)
    base_fraction_of_critical: float | None = Field(default=None, gt=0)
    warm_sessions: int = Field(default=0, ge=0)
    rate_changes: tuple[RateChangeSpec, ...] = ()
    #: Workload for the surge's extra ("burst") sessions; default: the main one.
    burst_workload: WorkloadSpec | None = None
    #: Each session arrives at its own start time in the workload (``start_s``,
    #: e.g. a ``basin gateway --record`` file) instead of on a Poisson base; a
    #: surge adds Poisson arrivals on top (docs/scenarios.md).
    from_workload: bool = False
    #: Poisson arrivals whose rate follows a shipped production trace, scaled so
    #: the base rate is the run's mean (a name, or name/offset_min/window_min).
    shape: ShapeSpec | None = None

    @field_validator("shape", mode="before")
    @classmethod
    def _shape_by_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_base(self) -> ArrivalSpec:
        if self.from_workload and self.shape is not None:
            raise ValueError("arrivals.shape shapes a Poisson base rate, and from_workload has none (every "
                             "session arrives at its recorded start time); drop one (--set arrivals.shape=null "
                             "or --set arrivals.from_workload=false)")
        if self.shape is not None and self.rate_changes:
            raise ValueError("arrivals.shape sets the rate over the whole run, so rate_changes would be "
                             "ignored; drop rate_changes (--set arrivals.rate_changes=[])")
        if self.from_workload:
            given = [k for k in ("base_per_min", "base_fraction_of_critical") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"from_workload takes every arrival from the workload's start times, so "
                                 f"{' and '.join(given)} would be ignored; drop it (--set arrivals.{given[0]}=null)")
            if self.rate_changes:
                raise ValueError("from_workload has no Poisson base rate to change; drop rate_changes")
            if self.warm_sessions:
                raise ValueError("from_workload replays the traffic from its first recorded session; "
                                 "set warm_sessions to 0")
            return self
        if (self.base_per_min is None) == (self.base_fraction_of_critical is None):
            raise ValueError("give exactly one of base_per_min or base_fraction_of_critical "
                             "(or from_workload: true for a workload with its own start times)")
        return self


class InterventionSpec(_Model):
    at_min: float = Field(ge=0)
    terminate_tag: str | None = None
    switch_policy: str | None = None
    set_rate_per_min: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_action(self) -> InterventionSpec:
        given = [v for v in (self.terminate_tag, self.switch_policy, self.set_rate_per_min) if v is not None]
        if len(given) != 1:
            raise ValueError("an intervention needs exactly one of terminate_tag, switch_policy or set_rate_per_min")
        return self


class EngineSpec(_Model):
    #: Force decode KV reservation at prefill completion (None: as the policy needs).
    reserve_at_prefill_completion: bool | None = None
    #: Queued prefill requests lock their matched prefix (None: the hardware
    #: profile's ``prefill.lock_queued_prefix``, False as SGLang does).
    lock_queued_prefix: bool | None = None
    #: The prefill waiting queue's order, fcfs or lpm (None: the hardware
    #: profile's ``prefill.schedule_policy``, fcfs as SGLang's default).
    schedule_policy: SchedulePolicy | None = None


class JudgeSpec(_Model):
    """How a run is judged, for a scenario whose clock or engine is not the paper's.

    The state label and the degraded-window rule are stated in the paper's
    time (20-minute windows ending at least 35 minutes after the surge, a
    5-minute warm-up) and its engine's latency (degraded above a 5-s median
    TTFT). A run whose tool gaps and schedule are compressed, or an engine
    whose calls are far faster, scales them here rather than in code.
    """

    #: Every time span of the label and window rules as a share of the paper's
    #: (0.25: a run compressed fourfold is judged on 5-minute windows).
    time_scale: float = Field(default=1.0, gt=0)
    #: Degraded above this median TTFT (None: the paper's 5 s).
    max_ttft_p50_s: float | None = Field(default=None, gt=0)

    def degradation_rule(self) -> DegradationRule:
        paper = DegradationRule()
        return replace(paper, window_s=paper.window_s * self.time_scale,
                       max_ttft_p50_s=self.max_ttft_p50_s if self.max_ttft_p50_s is not None else paper.max_ttft_p50_s,
                       max_first_call_wait_p50_s=paper.max_first_call_wait_p50_s * self.time_scale,
                       never_start_grace_s=paper.never_start_grace_s * self.time_scale)

    def label_rule(self) -> LabelRule:
        paper = LabelRule()
        return replace(paper, min_end_after_trigger_s=paper.min_end_after_trigger_s * self.time_scale,
                       warmup_s=paper.warmup_s * self.time_scale,
                       min_reference_s=paper.min_reference_s * self.time_scale)


class Scenario(_Model):
    name: str
    description: str = ""
    deployment: str
    #: Host tier as a multiple of the GPU prefix cache; overrides the deployment (0: GPU-only).
    host_ratio: float | None = Field(default=None, ge=0)
    #: Prefill router; overrides the deployment's (None: its own).
    router: RouterName | None = None
    workload: WorkloadSpec = WorkloadSpec()
    arrivals: ArrivalSpec
    surge: SurgeSpec = SurgeSpec()
    duration_min: float = Field(default=120.0, gt=0)
    #: Session metrics cover arrivals before this minute.
    measure_end_min: float = Field(default=90.0, gt=0)
    interventions: tuple[InterventionSpec, ...] = ()
    policy: str = "hicache"
    policy_params: dict[str, Any] = Field(default_factory=dict)
    engine: EngineSpec = EngineSpec()
    judge: JudgeSpec = JudgeSpec()
    seed: int = 0

    @model_validator(mode="after")
    def _window_inside_run(self) -> Scenario:
        # Caught here, not after a run that could not be measured.
        if self.measure_end_min > self.duration_min:
            raise ValueError(f"measure_end_min ({self.measure_end_min:g}) is after the run's end, duration_min "
                             f"({self.duration_min:g}); set measure_end_min to at most duration_min, e.g. "
                             f"--set measure_end_min={0.75 * self.duration_min:g}")
        return self

    @model_validator(mode="after")
    def _recorded_rate_is_fixed(self) -> Scenario:
        if self.arrivals.from_workload and any(iv.set_rate_per_min is not None for iv in self.interventions):
            raise ValueError("arrivals.from_workload has no Poisson base rate for an intervention's "
                             "set_rate_per_min to change; drop that intervention")
        return self

    @model_validator(mode="after")
    def _shape_fits(self) -> Scenario:
        shape = self.arrivals.shape
        if shape is None:
            return self
        if self.surge.factor != 1.0:
            raise ValueError(f"arrivals.shape takes the rate from the trace '{shape.name}', and a surge on top "
                             f"of it is not supported; set surge.factor to 1 (got {self.surge.factor:g})")
        if any(iv.set_rate_per_min is not None for iv in self.interventions):
            raise ValueError("arrivals.shape takes the rate from its trace, so an intervention's "
                             "set_rate_per_min would be ignored; drop that intervention")
        try:
            check_shape_window(shape.name, self.duration_min, shape.offset_min, shape.window_min)
        except BasinInputError as exc:
            raise ValueError(f"arrivals.shape: {exc}") from None
        return self

    @property
    def trigger_min(self) -> float | None:
        return self.surge.start_min if self.surge.factor != 1.0 else None


def scenario_names() -> list[str]:
    """The shipped scenarios, by name."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")) if SCENARIO_DIR.is_dir() else []


def scenario_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise BasinInputError(f"{path}: scenario file not found")
        return path
    candidate = SCENARIO_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = scenario_names()
    if not known:
        raise BasinInputError(f"unknown scenario '{name_or_path}': no shipped scenarios found in {SCENARIO_DIR} "
                              "(a broken install?); give a path to a YAML file")
    close = close_names(name_or_path, known)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise BasinInputError(f"unknown scenario '{name_or_path}': {hint}use one of {', '.join(known)} "
                          "or a path to a YAML file")


# ---------------------------------------------------------------- overrides
#: The two ways of giving the base rate; ``--set`` of one clears the other.
_BASE_RATE_KEYS = ("arrivals.base_per_min", "arrivals.base_fraction_of_critical")
#: What ``--set arrivals.from_workload=true`` clears: the Poisson base it replaces (its rate, changes,
#: warm start and trace shape), the pool size.
_RECORDED_CLEARS = (*_BASE_RATE_KEYS, "arrivals.warm_sessions", "arrivals.rate_changes", "arrivals.shape",
                    "workload.sessions")


def _parse_set(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise BasinInputError(f"--set '{item}': expected key.path=value, e.g. --set surge.factor=2.0")
    key, raw = item.split("=", 1)
    try:
        value = safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    path = key.strip().split(".")
    if not all(path):
        raise BasinInputError(f"--set '{item}': '{key.strip()}' is not a field path; write e.g. surge.factor=2.0")
    return path, value


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (``WorkloadSpec | None`` gives WorkloadSpec), or None."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    for option in options:
        if isinstance(option, type) and issubclass(option, BaseModel):
            return option
    return None


def _is_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict or annotation is dict


def check_key(path: list[str], item: str) -> None:
    """Refuse a ``--set`` key that names no field, listing the fields there
    (the schema is the authority, so the message never blames the file)."""
    model: type[BaseModel] = Scenario
    for i, part in enumerate(path):
        fields = model.model_fields
        here = ".".join(path[:i])
        if part not in fields:
            known = sorted(fields)
            close = close_names(part, known)
            hint = f"; did you mean {' or '.join('.'.join([*path[:i], c]) for c in close)}?" if close else ""
            raise BasinInputError(f"--set '{item}': a scenario has no field '{'.'.join(path[: i + 1])}'{hint} "
                                  f"(fields {'of ' + here if here else 'at the top'}: {', '.join(known)})")
        annotation = fields[part].annotation
        if i == len(path) - 1 or _is_mapping(annotation):
            return  # the last part, or a free mapping such as policy_params
        sub = _section_model(annotation)
        if sub is None:
            name = ".".join(path[: i + 1])
            raise BasinInputError(f"--set '{item}': '{name}' is a single value or a list, not a section; "
                                  f"set it whole, e.g. --set {name}=VALUE")
        model = sub


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` with each ``key.path=value`` applied (values read as YAML)."""
    keys: list[str] = []
    for item in overrides:
        path, value = _parse_set(item)
        check_key(path, item)
        node = data
        for depth, part in enumerate(path[:-1], start=1):
            nxt = node.get(part)
            if nxt is None:
                nxt = {}
                node[part] = nxt
            if isinstance(nxt, str) and path[:depth] == ["arrivals", "shape"]:
                nxt = {"name": nxt}  # a shape given by name, as the section it stands for
                node[part] = nxt
            if not isinstance(nxt, dict):
                raise BasinInputError(f"--set '{item}': '{part}' is not a section of the scenario")
            node = nxt
        node[path[-1]] = value
        keys.append(".".join(path))
    arrivals = data.get("arrivals")
    if isinstance(arrivals, dict):
        if "arrivals.from_workload" in keys and arrivals.get("from_workload") is True:
            # Recorded start times replace the Poisson base (its rate, changes and warm start), and every
            # recorded session runs (no pool size): --set from_workload=true clears these unless the same
            # command sets them too.
            for key in _RECORDED_CLEARS:
                section, name = key.split(".")
                if key not in keys and isinstance(data.get(section), dict):
                    data[section].pop(name, None)
        for mine, other in (_BASE_RATE_KEYS, _BASE_RATE_KEYS[::-1]):
            if mine in keys and other not in keys and arrivals.get(mine.split(".")[1]) is not None:
                arrivals.pop(other.split(".")[1], None)  # setting one way of giving the rate clears the other
    return data


# ------------------------------------------------------ paths in the file
#: Suffixes that make a value a file path rather than a name.
_FILE_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl", ".gz", ".parquet", ".csv", ".joblib", ".npz")


def _looks_like_path(value: object) -> bool:
    return isinstance(value, str) and bool(value) and (
        "/" in value or "\\" in value or value.lower().endswith(_FILE_SUFFIXES))


def _anchored(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    return value if path.is_absolute() else str((base / path).resolve())


def resolve_file_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative file paths of a scenario file made relative to ``base`` (its folder)."""
    if _looks_like_path(data.get("deployment")):
        data["deployment"] = _anchored(data["deployment"], base)
    for section in (data.get("workload"), (data.get("arrivals") or {}).get("burst_workload")):
        if isinstance(section, dict) and _looks_like_path(section.get("name")):
            section["name"] = _anchored(section["name"], base)
    params = data.get("policy_params")
    if isinstance(params, dict):
        if _looks_like_path(params.get("profile")):
            params["profile"] = _anchored(params["profile"], base)
        predictor = params.get("predictor")
        if isinstance(predictor, str) and predictor.lower().startswith("ridge:") and _looks_like_path(predictor[6:]):
            params["predictor"] = "ridge:" + _anchored(predictor[6:], base)
    return data


# ----------------------------------------------------------------- errors
def _problem(err: Any) -> str:
    """Pydantic's error as the plain words of this project."""
    kind, ctx = err["type"], err.get("ctx") or {}
    words = {
        "float_parsing": "expected a number", "float_type": "expected a number",
        "int_parsing": "expected a whole number", "int_type": "expected a whole number",
        "int_from_float": "expected a whole number", "bool_parsing": "expected true or false",
        "bool_type": "expected true or false", "string_type": "expected text",
        "missing": "required, but not given", "extra_forbidden": "not a field here",
        "model_type": "expected a section of fields (key: value lines)",
        "dict_type": "expected a section of fields (key: value lines)",
        "tuple_type": "expected a list", "list_type": "expected a list",
    }
    if kind in words:
        return words[kind]
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        op = bounds[kind]
        return f"must be {op} {ctx[{'>': 'gt', '>=': 'ge', '<': 'lt', '<=': 'le'}[op]]}"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected')}"
    return str(err["msg"]).removeprefix("Value error, ")


def _error_lines(path: Path, overrides: list[str], exc: ValidationError) -> str:
    """One line per problem: the ``--set`` that caused it where one did, else
    the file, then the field and what it expects (with the valid fields for a
    misspelt one)."""
    given = {".".join(_parse_set(item)[0]): item for item in overrides}
    lines = []
    for err in exc.errors():
        parts = [str(p) for p in err["loc"]]
        loc = ".".join(parts) or "(top level)"
        source = next((f"--set '{given[k]}'" for k in given
                       if loc == k or loc.startswith(k + ".") or k.startswith(loc + ".")), str(path))
        got = err.get("input")
        shown = "" if isinstance(got, dict) or err["type"] in ("missing", "extra_forbidden") else f" (got {got!r})"
        problem = _problem(err)
        if err["type"] == "extra_forbidden":
            model: type[BaseModel] | None = Scenario
            for part in parts[:-1]:
                annotation = model.model_fields[part].annotation if model and part in model.model_fields else None
                model = _section_model(annotation)
            if model is not None:
                known = sorted(model.model_fields)
                close = close_names(parts[-1], known)
                problem += (f"; did you mean {' or '.join(close)}?" if close else "") + f" (fields: {', '.join(known)})"
        if not parts:  # a rule across fields (the measurement window): the file as overridden
            source = str(path) + (f" with {' '.join(f'--set {o}' for o in overrides)}" if overrides else "")
            lines.append(f"{source}: {problem}")
            continue
        lines.append(f"{source}: field '{loc}': {problem}{shown}")
    return "\n".join(lines)


def load_scenario(name_or_path: str, overrides: list[str] | None = None) -> Scenario:
    """The scenario a name or file stands for, with ``overrides`` applied and
    everything checked (schema, ranges, measurement window) before any run."""
    path = scenario_path(name_or_path)
    data = load_mapping(path, "scenario", "scenario fields")
    data = resolve_file_paths(data, path.resolve().parent)
    overrides = list(overrides or [])
    data = apply_overrides(data, overrides)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise BasinInputError(_error_lines(path, overrides, exc)) from None


def scenario_dict(scenario: Scenario) -> dict[str, Any]:
    """The scenario as plain data (what a run ran with, for provenance)."""
    return scenario.model_dump(mode="json")
