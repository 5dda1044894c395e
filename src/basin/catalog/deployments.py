"""Deployments: how many prefill and decode instances of which hardware,
the host tier and the router, read from ``profiles/deployments/`` or given as
a shape such as ``2P4D-h200``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from basin.catalog.calibrated import CalibratedProfile, is_calibrated
from basin.catalog.capacity import effective_cache_tokens
from basin.catalog.files import close_names, named_file
from basin.catalog.hardware import HardwareProfile, load_hardware
from basin.catalog.roofline import describe, hardware_name
from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR
from basin.yamlfile import load_yaml, validation_message

RouterName = Literal["cache-aware", "affinity", "least-loaded"]
ROUTERS: tuple[str, ...] = ("cache-aware", "affinity", "least-loaded")
#: ``pd``: prefill and decode disaggregated (xPyD); ``colocated``: servers
#: whose prefill and decode share compute and one KV pool (docs/colocated.md).
Topology = Literal["pd", "colocated"]


class Deployment(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    hardware: str
    prefill_instances: int = Field(ge=1)
    decode_instances: int = Field(ge=1)
    host_ratio: float = Field(ge=0)
    router: RouterName = "cache-aware"
    topology: Topology = "pd"

    @model_validator(mode="after")
    def _colocated_servers(self) -> Deployment:
        if self.topology == "colocated":
            if self.prefill_instances != self.decode_instances:
                raise ValueError("a colocated deployment has as many prefill as decode instances (its servers): "
                                 f"got {self.prefill_instances} and {self.decode_instances}")
            if self.host_ratio:
                raise ValueError("a colocated deployment has no host tier: set host_ratio to 0")
        return self

    @property
    def shape(self) -> str:
        if self.topology == "colocated":
            return f"{self.prefill_instances}C"
        return f"{self.prefill_instances}P{self.decode_instances}D"


class DescribedDeployment(BaseModel):
    """A deployment file that names a model, a GPU and tensor parallelism
    instead of a hardware profile; its profile is derived
    (:mod:`basin.catalog.roofline`) and named ``MODEL@GPU[/tpN]``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    model: str
    gpu: str
    tp: int = Field(default=1, ge=1)
    prefill_instances: int = Field(ge=1)
    decode_instances: int = Field(ge=1)
    host_ratio: float = Field(ge=0)
    router: RouterName = "cache-aware"

    def deployment(self) -> Deployment:
        describe(self.model, self.gpu, self.tp)  # an unknown model or GPU, or no room for the cache: now
        return Deployment(name=self.name, hardware=hardware_name(self.model, self.gpu, self.tp),
                          prefill_instances=self.prefill_instances, decode_instances=self.decode_instances,
                          host_ratio=self.host_ratio, router=self.router)


@dataclass(frozen=True, slots=True)
class CacheCapacity:
    """Prefix-cache capacity of a deployment, totals over its prefill instances."""

    gpu_tokens: int
    host_tokens: int
    gpu_tokens_per_instance: int
    host_tokens_per_instance: int

    @property
    def effective_tokens(self) -> int:
        return effective_cache_tokens(self.gpu_tokens, self.host_tokens)


def cache_capacity(deployment: Deployment, hardware: HardwareProfile) -> CacheCapacity:
    gpu = hardware.prefill.prefix_cache_tokens
    host = int(deployment.host_ratio * gpu)
    n = deployment.prefill_instances
    return CacheCapacity(gpu * n, host * n, gpu, host)


_SHAPE = re.compile(r"^(\d+)[pP](\d+)[dD](?:-(.+))?$")
#: ``2C-h100``: two colocated servers.
_COLOCATED_SHAPE = re.compile(r"^(\d+)[cC](?:-(.+))?$")


def load_deployment(name_or_path: str) -> Deployment:
    """A deployment by file name, path, or shape such as ``2P4D-h200`` (any
    xPyD; the hardware may be a derived ``MODEL@GPU[/tpN]`` or a calibrated
    profile's name). A file names either ``hardware`` or ``model``, ``gpu``
    and ``tp``, or is a calibrated profile (:mod:`basin.catalog.calibrated`).
    ``NC-HW`` (``1C-h100-nvl``) is N colocated servers of hardware HW, with no
    host tier."""
    colocated = _COLOCATED_SHAPE.match(name_or_path)
    if colocated and not (PROFILE_DIR / "deployments" / f"{name_or_path}.yaml").exists():
        n, hw = colocated.groups()
        try:
            load_hardware(hw or "h200")
        except BasinInputError as exc:
            raise BasinInputError(f"deployment shape '{name_or_path}': {exc}") from None
        return Deployment(name=name_or_path, hardware=hw or "h200", prefill_instances=int(n),
                          decode_instances=int(n), host_ratio=0.0, topology="colocated")
    match = _SHAPE.match(name_or_path)
    if match and not (PROFILE_DIR / "deployments" / f"{name_or_path}.yaml").exists():
        p, d, hw = match.groups()
        hardware = hw or "h200"
        try:
            load_hardware(hardware)  # fail early on an unknown profile
        except BasinInputError as exc:
            shipped = sorted(f.stem for f in (PROFILE_DIR / "deployments").glob("*.yaml"))
            shape = f"{p}p{d}d-"  # only a shipped deployment of this very shape is a likely meaning
            close = [c for c in close_names(name_or_path, shipped) if c.lower().startswith(shape)]
            if close:
                raise BasinInputError(f"deployment '{name_or_path}': not a shipped deployment (did you mean "
                                      f"{' or '.join(close)}?) and, read as a shape, {exc}") from None
            raise BasinInputError(f"deployment shape '{name_or_path}': {exc}") from None
        return Deployment(name=name_or_path, hardware=hardware, prefill_instances=int(p),
                          decode_instances=int(d), host_ratio=2.0)
    path = named_file("deployments", name_or_path)
    data = load_yaml(path)
    if is_calibrated(data):
        return _calibrated_deployment(path, name_or_path, data)
    try:
        if isinstance(data, dict) and "hardware" not in data and ("model" in data or "gpu" in data):
            return DescribedDeployment.model_validate(data).deployment()
        return Deployment.model_validate(data)
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None
    except BasinInputError as exc:
        raise BasinInputError(f"{path}: {exc}") from None


def _calibrated_deployment(path: Path, name_or_path: str, data: object) -> Deployment:
    """The deployment a calibrated profile file describes. Its hardware is the
    same file: by name when it was found by name (the user profile folder),
    else by its absolute path, so that any process can read it again. Found
    by name, the deployment is named so too (whatever the file's ``name``
    says), as BASIN's cliff profiles and critical rates look it up by name."""
    try:
        profile = CalibratedProfile.model_validate(data)
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None
    by_name = Path(name_or_path).suffix not in (".yaml", ".yml")
    shape = profile.deployment
    return Deployment(name=name_or_path if by_name else profile.name,
                      hardware=name_or_path if by_name else str(path.resolve()),
                      prefill_instances=shape.prefill_instances, decode_instances=shape.decode_instances,
                      host_ratio=shape.host_ratio, router=shape.router, topology=shape.topology)


def with_host_ratio(deployment: Deployment, host_ratio: float | None) -> Deployment:
    """The deployment with another host tier (None keeps its own). A
    colocated deployment has none: its one pool holds cache and requests."""
    if host_ratio is None or host_ratio == deployment.host_ratio:
        return deployment
    if deployment.topology == "colocated":
        raise BasinInputError(f"host ratio {host_ratio:g}: deployment {deployment.name} is colocated "
                              f"({deployment.shape}: one KV pool for cache and running requests, no host tier); "
                              "leave the host ratio out or give a PD shape such as 1P1D-HARDWARE")
    return deployment.model_copy(update={"host_ratio": host_ratio})
