"""The catalogue: hardware, deployments, cache capacities, critical rates and
cliff profiles, as validated views of the data files under ``profiles/``.

It sits at the base of the package: every part that needs a deployment reads
it here, and nothing imports the simulator for it.
"""

from basin.catalog.capacity import effective_cache_tokens
from basin.catalog.critical import CriticalRate, critical_rate, require_critical_rate
from basin.catalog.deployments import (
    ROUTERS,
    CacheCapacity,
    Deployment,
    RouterName,
    cache_capacity,
    load_deployment,
    with_host_ratio,
)
from basin.catalog.hardware import DecodeProfile, HardwareProfile, PrefillProfile, SchedulePolicy, load_hardware

__all__ = [
    "ROUTERS", "CacheCapacity", "CriticalRate", "DecodeProfile", "Deployment", "HardwareProfile",
    "PrefillProfile", "RouterName", "SchedulePolicy", "cache_capacity", "critical_rate", "effective_cache_tokens",
    "load_deployment", "load_hardware", "require_critical_rate", "with_host_ratio",
]
