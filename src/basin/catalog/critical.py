"""Critical session rates, one per deployment and workload, each with its
origin, from ``profiles/critical-rates.yaml``."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR
from basin.yamlfile import load_yaml, validation_message

CRITICAL_RATES_FILE = PROFILE_DIR / "critical-rates.yaml"


class CriticalRate(BaseModel):
    """The highest steady arrival rate a deployment serves healthily with a workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    deployment: str
    workload: str
    per_min: float = Field(gt=0)
    #: Where the number comes from: a measurement (with its command) or a citation.
    origin: str = Field(min_length=1)


@lru_cache(maxsize=4)
def _rates(path: Path) -> dict[tuple[str, str], CriticalRate]:
    try:
        rates = TypeAdapter(list[CriticalRate]).validate_python(load_yaml(path) or [])
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None
    table: dict[tuple[str, str], CriticalRate] = {}
    for rate in rates:
        key = (rate.deployment, rate.workload)
        if key in table:
            raise BasinInputError(f"{path}: two critical rates for deployment '{rate.deployment}' "
                                  f"with workload '{rate.workload}'; keep one")
        table[key] = rate
    return table


def critical_rate(deployment: str, workload: str, path: Path = CRITICAL_RATES_FILE) -> CriticalRate | None:
    """The critical rate of ``deployment`` (its name) with ``workload``, or None."""
    return _rates(path).get((deployment, workload))


def require_critical_rate(deployment: str, workload: str, needed_for: str,
                          path: Path = CRITICAL_RATES_FILE) -> CriticalRate:
    """As :func:`critical_rate`, but a missing rate is an error that says what needed it."""
    rate = critical_rate(deployment, workload, path)
    if rate is None:
        known = sorted(f"{d} with {w}" for d, w in _rates(path))
        raise BasinInputError(
            f"{needed_for} needs the critical rate of deployment '{deployment}' with workload "
            f"'{workload}', and {path} has none (it has: {', '.join(known)}); add one there, with its "
            f"origin, or give the rate directly")
    return rate
