"""Hardware profiles: the engine costs and capacities of one GPU type, read
from ``profiles/hardware/`` (the one source of truth for them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from basin.catalog.files import named_file
from basin.errors import BasinInputError
from basin.yamlfile import load_yaml, validation_message

if TYPE_CHECKING:
    import numpy as np


#: The order a prefill instance's waiting queue is served in: ``fcfs``, first
#: come first served (SGLang's default, and what the paper's trap implies);
#: ``lpm``, SGLang's ``--schedule-policy lpm``, the longest cached prefix first
#: while few requests wait (:mod:`basin.sim.prefill` states the rules).
SchedulePolicy = Literal["fcfs", "lpm"]


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
    #: Server time for every prompt token of a call, cached ones included:
    #: its tokenizer and prefix lookup, where they share the cores that
    #: compute (a CPU server). Charged once a call, to the server's next step
    #: after it arrives. 0 where they run beside the accelerator.
    frontend_s_per_prompt_token: float = Field(default=0.0, ge=0)
    #: Whether a request waiting in the prefill queue holds its matched prefix.
    #: SGLang matches a waiting request when it schedules it and locks nothing
    #: before (False); True is the older model of this simulator, kept to
    #: compare against (docs/calibration.md, "Where a waiting request holds its
    #: prefix").
    lock_queued_prefix: bool = False
    #: How the waiting queue is ordered (:data:`SchedulePolicy`). A PD prefill
    #: instance is SGLang's and takes either; a colocated (vLLM) server has no
    #: LPM and refuses it.
    schedule_policy: SchedulePolicy = "fcfs"

    @overload
    def tokens_cost_s(self, n_tokens: float, start_position: float) -> float: ...

    @overload
    def tokens_cost_s(self, n_tokens: np.ndarray, start_position: float | np.ndarray) -> np.ndarray: ...

    def tokens_cost_s(self, n_tokens: float | np.ndarray, start_position: float | np.ndarray) -> float | np.ndarray:
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

    def batch_s(self, batch: float) -> float:
        """Step cost of the batch apart from its context: weights and per-request work."""
        sat = self.expert_saturation_batch
        if sat is None or batch <= sat:
            return self.step_base_s + self.step_per_request_s * batch
        return self.step_base_s + self.step_per_request_s * sat + self.step_per_request_beyond_s * (batch - sat)

    @overload
    def step_s(self, batch: float, context_tokens: float) -> float: ...

    @overload
    def step_s(self, batch: float, context_tokens: np.ndarray) -> np.ndarray: ...

    def step_s(self, batch: float, context_tokens: float | np.ndarray) -> float | np.ndarray:
        return self.batch_s(batch) + self.step_per_context_token_s * context_tokens


class HardwareProfile(_Frozen):
    name: str
    description: str = ""
    page_tokens: int = Field(gt=0)
    prefill: PrefillProfile
    decode: DecodeProfile
    transfer_s: float = Field(ge=0)
    itl_slo_s: float = Field(gt=0)


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A measured profile by name or path (a calibrated profile's file gives
    its ``hardware``), or a derived one named ``MODEL@GPU[/tpN]``
    (:mod:`basin.catalog.roofline`)."""
    if "@" in name_or_path:
        # Lazy: basin.catalog.roofline imports this module (an import circle).
        from basin.catalog.roofline import derived_hardware

        return derived_hardware(name_or_path)
    path = named_file("hardware", name_or_path)
    data = load_yaml(path)
    if isinstance(data, dict) and data.get("kind") == "basin-calibrated-profile":
        # Lazy: basin.catalog.calibrated imports this module (an import circle).
        from basin.catalog.calibrated import CalibratedProfile

        try:
            return CalibratedProfile.model_validate(data).hardware
        except ValidationError as exc:
            raise BasinInputError(validation_message(path, exc)) from None
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None


def hardware_origin(name_or_path: str) -> str:
    """Where a measured profile's figures come from, for listings: the shipped
    file (calibrated on the paper's testbed) or a ``basin calibrate`` file."""
    path = named_file("hardware", name_or_path)
    data = load_yaml(path)
    if isinstance(data, dict) and data.get("kind") == "basin-calibrated-profile":
        return f"calibrated profile {path} (basin calibrate, docs/calibrate.md)"
    return f"measured profile profiles/hardware/{path.stem}.yaml (docs/calibration.md)"
