"""The emulator's settings: one frozen, validated model built from the flags."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from basin.catalog import Deployment, HardwareProfile, load_deployment, load_hardware, with_host_ratio
from basin.emulate.calls import DEFAULT_MAX_TOKENS, MetricsStyle
from basin.errors import BasinInputError
from basin.hostport import split_host_port


class EmulatorConfig(BaseModel):
    """What ``basin emulate`` serves and how fast its clock runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    deployment: str = Field(description="A deployment file name or path, or a shape such as 2P4D-h200")
    host_ratio: float | None = Field(default=None, ge=0, description="Host tier as a multiple of the GPU "
                                     "prefix cache (default: the deployment's own)")
    speed: float = Field(default=1.0, gt=0, le=100_000, description="Simulated seconds per wall second")
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=30000, ge=0, le=65535)
    metrics_style: MetricsStyle = "sglang"
    seed: int = Field(default=0, ge=0, description="Seeds the text of the answers")
    default_max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, gt=0,
                                    description="Output tokens of a call that names no max_tokens")
    model: str | None = Field(default=None, description="Model id served (default basin-emulate/DEPLOYMENT)")
    reserve_at_prefill_completion: bool = Field(default=False, description="Reserve decode KV at prefill "
                                                "completion (the BASIN engine change) instead of before prefill")

    @property
    def model_id(self) -> str:
        return self.model or f"basin-emulate/{self.deployment}"

    def resolve(self) -> tuple[HardwareProfile, Deployment]:
        """The deployment (with ``host_ratio`` applied) and its hardware, from the catalogue."""
        deployment = with_host_ratio(load_deployment(self.deployment), self.host_ratio)
        return load_hardware(deployment.hardware), deployment


def emulator_config(**fields: Any) -> EmulatorConfig:
    """An :class:`EmulatorConfig` from flag values (None: the default); bad values name the flag."""
    given = {k: v for k, v in fields.items() if v is not None}
    try:
        return EmulatorConfig(**given)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "(settings)"
            flag = "--" + name.replace("_", "-")
            lines.append(f"{flag} {err.get('input')!r}: {err['msg']}")
        raise BasinInputError("; ".join(lines)) from None


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (or a bare ``PORT`` on 127.0.0.1), as ``--listen`` takes it."""
    address = split_host_port(value)
    if address is None:
        raise BasinInputError(f"--listen {value!r}: expected HOST:PORT such as 127.0.0.1:30000")
    return address
