"""Calibrated profiles: one file, written by ``basin calibrate``, that is both
a hardware profile and a one-engine deployment of it, with the measurements
its figures were fitted from.

A single engine (vLLM, llama.cpp, SGLang without PD) serves prefill and
decode in one process, from one token budget a step and one KV pool: a
colocated server (docs/colocated.md), which is what the file's deployment
says unless it was measured as one side of a PD pair (``topology: pd``, one
prefill and one decode instance). Files written before the colocated
topology existed have no ``topology`` and stay ``1P1D``. The file is
found wherever a deployment or a hardware name is taken: by path, or by name
in the user profile folder (:func:`user_profile_dir`). Shipped names come
first, so a calibrated profile never shadows one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from basin.catalog.hardware import HardwareProfile

#: The ``kind`` field that marks a calibrated profile file.
CALIBRATED_KIND: Literal["basin-calibrated-profile"] = "basin-calibrated-profile"
CALIBRATED_VERSION = 1


def user_profile_dir() -> Path:
    """The folder of a user's own profiles: ``$BASIN_PROFILES`` if set, else
    ``$XDG_DATA_HOME/basin/profiles`` (``~/.local/share/basin/profiles``)."""
    explicit = os.environ.get("BASIN_PROFILES")
    if explicit:
        return Path(explicit).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser() / "basin" / "profiles"


class CalibratedShape(BaseModel):
    """How the simulator places the measured engine: one colocated server
    (``topology: colocated``), or one prefill and one decode instance
    (``pd``, the default of files that do not say); no host tier."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefill_instances: int = Field(default=1, ge=1)
    decode_instances: int = Field(default=1, ge=1)
    host_ratio: float = Field(default=0.0, ge=0)
    router: Literal["cache-aware", "affinity", "least-loaded"] = "cache-aware"
    topology: Literal["pd", "colocated"] = "pd"

    @model_validator(mode="after")
    def _colocated_servers(self) -> CalibratedShape:
        if self.topology == "colocated" and self.prefill_instances != self.decode_instances:
            raise ValueError("a colocated deployment has as many prefill as decode instances (its servers): "
                             f"got {self.prefill_instances} and {self.decode_instances}")
        if self.topology == "colocated" and self.host_ratio:
            raise ValueError("a colocated deployment has no host tier: set host_ratio to 0")
        return self


class CalibratedProfile(BaseModel):
    """The file ``basin calibrate`` writes. ``calibration`` holds every
    measurement and fit (with its spread and residuals) as plain data; the
    catalogue reads only ``hardware`` and ``deployment``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["basin-calibrated-profile"] = CALIBRATED_KIND
    version: int = Field(default=CALIBRATED_VERSION, ge=1, le=CALIBRATED_VERSION)
    name: str = Field(min_length=1)
    hardware: HardwareProfile
    deployment: CalibratedShape = CalibratedShape()
    calibration: dict[str, Any] = Field(default_factory=dict)


def is_calibrated(data: object) -> bool:
    """Whether a YAML document is a calibrated profile (by its ``kind``)."""
    return isinstance(data, dict) and data.get("kind") == CALIBRATED_KIND
