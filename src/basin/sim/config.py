"""Hardware profiles and deployments: validated views of the YAML data files
under ``profiles/`` (the one source of truth for engine costs and capacities)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR

RouterName = Literal["cache-aware", "affinity", "least-loaded"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PrefillProfile(_Frozen):
    prefix_cache_tokens: int = Field(gt=0)
    chunk_tokens: int = Field(gt=0)
    step_overhead_s: float = Field(ge=0)
    linear_tokens_per_s: float = Field(gt=0)
    attention_s_per_token_position: float = Field(ge=0)
    load_tokens_per_s: float = Field(gt=0)
    load_threshold_tokens: int = Field(ge=0)
    state_slots: int | None = Field(default=None, gt=0)

    def tokens_cost_s(self, n_tokens: int, start_position: int) -> float:
        """Compute time of ``n_tokens`` new tokens placed after ``start_position``
        earlier tokens (attention cost grows with position)."""
        return n_tokens * (1.0 / self.linear_tokens_per_s
                           + self.attention_s_per_token_position * (start_position + n_tokens / 2.0))


class DecodeProfile(_Frozen):
    kv_tokens: int = Field(gt=0)
    reserve_output_tokens: int = Field(ge=0)
    step_base_s: float = Field(gt=0)
    step_per_request_s: float = Field(ge=0)
    step_per_context_token_s: float = Field(ge=0)
    max_running_requests: int = Field(gt=0)
    #: Batch size from which every expert is read anyway: beyond it a request
    #: costs only ``step_per_request_beyond_s`` (None: no saturation).
    expert_saturation_batch: int | None = Field(default=None, gt=0)
    step_per_request_beyond_s: float = Field(default=0.0, ge=0)

    def batch_s(self, batch: int) -> float:
        """Step cost of the batch apart from its context: weights and per-request work."""
        sat = self.expert_saturation_batch
        if sat is None or batch <= sat:
            return self.step_base_s + self.step_per_request_s * batch
        return self.step_base_s + self.step_per_request_s * sat + self.step_per_request_beyond_s * (batch - sat)

    def step_s(self, batch: int, context_tokens: int) -> float:
        return self.batch_s(batch) + self.step_per_context_token_s * context_tokens


class HardwareProfile(_Frozen):
    name: str
    description: str = ""
    page_tokens: int = Field(gt=0)
    prefill: PrefillProfile
    decode: DecodeProfile
    transfer_s: float = Field(ge=0)
    itl_slo_s: float = Field(gt=0)


class Deployment(_Frozen):
    name: str
    hardware: str
    prefill_instances: int = Field(ge=1)
    decode_instances: int = Field(ge=1)
    host_ratio: float = Field(ge=0)
    router: RouterName = "cache-aware"
    critical_rate_per_min: float | None = Field(default=None, gt=0)

    @property
    def shape(self) -> str:
        return f"{self.prefill_instances}P{self.decode_instances}D"


def load_yaml(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except FileNotFoundError:
        raise BasinInputError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise BasinInputError(f"{path}: not valid YAML ({exc})") from None


def validation_message(path: object, exc: ValidationError) -> str:
    """One readable line per problem: file, field path, what was expected."""
    lines = [f"{path}: invalid"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  field '{loc}': {err['msg']}{shown}")
    return "\n".join(lines)


def _named_file(kind: str, name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = PROFILE_DIR / kind / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in (PROFILE_DIR / kind).glob("*.yaml"))
    raise BasinInputError(
        f"unknown {kind[:-1]} '{name_or_path}': use one of {', '.join(known)} or a path to a YAML file"
    )


def load_hardware(name_or_path: str) -> HardwareProfile:
    path = _named_file("hardware", name_or_path)
    try:
        return HardwareProfile.model_validate(load_yaml(path))
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None


_SHAPE = re.compile(r"^(\d+)[pP](\d+)[dD](?:-(.+))?$")


def load_deployment(name_or_path: str) -> Deployment:
    """A deployment by file name, path, or shape such as ``2P4D-h200`` (any xPyD)."""
    match = _SHAPE.match(name_or_path)
    if match and not (PROFILE_DIR / "deployments" / f"{name_or_path}.yaml").exists():
        p, d, hw = match.groups()
        hardware = hw or "h200"
        load_hardware(hardware)  # fail early on an unknown profile
        return Deployment(name=name_or_path, hardware=hardware, prefill_instances=int(p),
                          decode_instances=int(d), host_ratio=2.0)
    path = _named_file("deployments", name_or_path)
    try:
        return Deployment.model_validate(load_yaml(path))
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None
