"""GPUs (``profiles/gpus/``): the public spec figures a roofline needs,
each file citing its datasheet, and which measured profiles exist for it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from basin.catalog.files import named_file
from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR
from basin.yamlfile import load_yaml, validation_message


class DenseTflops(BaseModel):
    """Dense (not sparse) tensor-core peak per precision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fp8: float = Field(gt=0)
    bf16: float = Field(gt=0)


class GpuSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    hbm_gb: float = Field(gt=0)
    hbm_tb_per_s: float = Field(gt=0)
    dense_tflops: DenseTflops
    #: GPU-to-GPU bandwidth within a node (NVLink, Infinity Fabric), GB/s.
    interconnect_gb_per_s: float = Field(gt=0)
    #: GPU-to-host bandwidth a direction (the host KV tier), GB/s.
    host_link_gb_per_s: float = Field(gt=0)
    #: Model name -> measured hardware profile (profiles/hardware/) of that model on this GPU at tp 1.
    calibrated: dict[str, str] = Field(default_factory=dict)

    def flops(self, precision: str) -> float:
        return float(getattr(self.dense_tflops, precision)) * 1e12


def gpu_names() -> list[str]:
    folder = PROFILE_DIR / "gpus"
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_")) if folder.is_dir() else []


def load_gpu(name_or_path: str) -> GpuSpec:
    """A GPU of the catalogue by name, or a YAML file of the same fields."""
    if name_or_path.startswith("_"):
        raise BasinInputError(f"unknown gpu '{name_or_path}': use one of {', '.join(gpu_names())}")
    path = named_file("gpus", name_or_path)
    try:
        return GpuSpec.model_validate(load_yaml(path))
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None
