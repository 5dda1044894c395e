"""Model architectures (``profiles/models/``): the figures a roofline needs
to cost a forward pass and size the KV cache, each file citing its config."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from basin.catalog.files import named_file
from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR
from basin.yamlfile import load_yaml, validation_message

Precision = Literal["fp8", "bf16"]
#: Bytes per element of each precision.
PRECISION_BYTES: dict[str, int] = {"fp8": 1, "bf16": 2}


class LinearState(BaseModel):
    """Recurrent state of one linear-attention layer: value heads of ``key x value`` elements."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value_heads: int = Field(gt=0)
    key_head_dim: int = Field(gt=0)
    value_head_dim: int = Field(gt=0)
    bytes: int = Field(gt=0)


class ModelSpec(BaseModel):
    """One model's architecture. ``full_attention_layers`` below ``layers``
    makes it hybrid (the rest are linear attention, with a fixed-size state
    per request instead of a KV cache); ``kv_latent_dim`` replaces
    ``2 x kv_heads x head_dim`` cached values for latent attention (MLA)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    layers: int = Field(gt=0)
    full_attention_layers: int | None = Field(default=None, ge=0)
    hidden_size: int = Field(gt=0)
    attention_heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    kv_latent_dim: int | None = Field(default=None, gt=0)
    params_b: float = Field(gt=0)
    active_params_b: float = Field(gt=0)
    experts: int | None = Field(default=None, gt=0)
    experts_per_token: int | None = Field(default=None, gt=0)
    routed_expert_params_b: float | None = Field(default=None, ge=0)
    linear_state: LinearState | None = None
    weight_precision: Precision = "bf16"
    kv_precision: Precision = "bf16"

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.active_params_b > self.params_b:
            raise ValueError(f"active_params_b ({self.active_params_b:g}) exceeds params_b ({self.params_b:g})")
        if self.full_attention_layers is not None and self.full_attention_layers > self.layers:
            raise ValueError(f"full_attention_layers ({self.full_attention_layers}) exceeds layers ({self.layers})")
        moe = (self.experts, self.experts_per_token, self.routed_expert_params_b)
        if any(v is not None for v in moe) and any(v is None for v in moe):
            raise ValueError("a mixture of experts needs all of experts, experts_per_token and "
                             "routed_expert_params_b (or none of them for a dense model)")
        if self.experts is not None and self.experts_per_token is not None and self.experts_per_token > self.experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) exceeds experts ({self.experts})")
        if self.routed_expert_params_b is not None and self.routed_expert_params_b >= self.params_b:
            raise ValueError("routed_expert_params_b must be below params_b (attention and embeddings are not experts)")
        if self.linear_layers > 0 and self.linear_state is None:
            raise ValueError("a hybrid model (full_attention_layers < layers) needs linear_state")
        return self

    @property
    def attention_layers(self) -> int:
        return self.layers if self.full_attention_layers is None else self.full_attention_layers

    @property
    def linear_layers(self) -> int:
        return self.layers - self.attention_layers

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * PRECISION_BYTES[self.weight_precision]

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """KV bytes one token holds across a tensor-parallel group of ``tp``:
        heads are split over the GPUs, but a head (or MLA's latent) that
        cannot be split is replicated on every GPU that needs it."""
        if self.kv_latent_dim is not None:
            per_layer = float(self.kv_latent_dim) * tp
        else:
            per_layer = 2.0 * self.kv_heads * self.head_dim * max(1.0, tp / self.kv_heads)
        return self.attention_layers * per_layer * PRECISION_BYTES[self.kv_precision]

    @property
    def state_bytes_per_request(self) -> float:
        """Fixed recurrent state a request holds in the linear-attention layers."""
        s = self.linear_state
        if s is None:
            return 0.0
        return float(self.linear_layers * s.value_heads * s.key_head_dim * s.value_head_dim * s.bytes)

    @property
    def expert_bytes_per_token(self) -> float:
        """Weight bytes of the routed experts one token activates, over all layers."""
        if self.experts is None or self.experts_per_token is None or self.routed_expert_params_b is None:
            return 0.0
        return self.routed_expert_params_b * 1e9 / self.experts * self.experts_per_token \
            * PRECISION_BYTES[self.weight_precision]

    @property
    def always_read_bytes(self) -> float:
        """Weight bytes every decode step reads whatever the batch: all but the routed experts."""
        return (self.params_b - (self.routed_expert_params_b or 0.0)) * 1e9 * PRECISION_BYTES[self.weight_precision]


def model_names() -> list[str]:
    folder = PROFILE_DIR / "models"
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_")) if folder.is_dir() else []


def load_model(name_or_path: str) -> ModelSpec:
    """A model of the catalogue by name, or a YAML file of the same fields."""
    path = named_file("models", name_or_path)
    try:
        return ModelSpec.model_validate(load_yaml(path))
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None
