"""Scenario files: everything a run needs, in one validated YAML document.

A scenario names a deployment, a workload and its transforms, the arrival
process (base rate, surge, rate changes, warm start), the run's length and
measurement window, interventions, the control policy and the seed. Any field
can be overridden from the command line with ``--set key.path=value``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from basin.catalog import RouterName
from basin.errors import BasinInputError
from basin.paths import SCENARIO_DIR
from basin.yamlfile import validation_message


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


class ArrivalSpec(_Model):
    #: Base session arrival rate; or give ``base_fraction_of_critical`` to
    #: take it from the deployment's profiled critical rate.
    base_per_min: float | None = Field(default=None, gt=0)
    base_fraction_of_critical: float | None = Field(default=None, gt=0)
    warm_sessions: int = Field(default=0, ge=0)
    rate_changes: tuple[RateChangeSpec, ...] = ()
    #: Workload for the surge's extra ("burst") sessions; default: the main one.
    burst_workload: WorkloadSpec | None = None

    @model_validator(mode="after")
    def _one_base(self) -> ArrivalSpec:
        if (self.base_per_min is None) == (self.base_fraction_of_critical is None):
            raise ValueError("give exactly one of base_per_min or base_fraction_of_critical")
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
    seed: int = 0

    @property
    def trigger_min(self) -> float | None:
        return self.surge.start_min if self.surge.factor != 1.0 else None


def scenario_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise BasinInputError(f"{path}: scenario file not found")
        return path
    candidate = SCENARIO_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
    raise BasinInputError(f"unknown scenario '{name_or_path}': use one of {known} or a path to a YAML file")


def _parse_set(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise BasinInputError(f"--set '{item}': expected key.path=value, e.g. --set surge.factor=2.0")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = _parse_set(item)
        node = data
        for part in path[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = {}
                node[part] = nxt
            if not isinstance(nxt, dict):
                raise BasinInputError(f"--set '{item}': '{part}' is not a section of the scenario")
            node = nxt
        node[path[-1]] = value
    return data


def load_scenario(name_or_path: str, overrides: list[str] | None = None) -> Scenario:
    path = scenario_path(name_or_path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise BasinInputError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise BasinInputError(f"{path}: expected a mapping of scenario fields at the top level")
    data = apply_overrides(data, list(overrides or []))
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None

