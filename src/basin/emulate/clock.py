"""Wall time to simulated time and back: ``--speed K`` runs K simulated
seconds per wall second. Pure arithmetic, so the driver and its tests agree."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimClock:
    """Simulated time ``(wall - origin) * speed``; ``origin`` is the wall time of simulated 0."""

    origin_wall_s: float
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {self.speed!r}")

    def sim_at(self, wall_s: float) -> float:
        return max(0.0, (wall_s - self.origin_wall_s) * self.speed)

    def wall_at(self, sim_s: float) -> float:
        return self.origin_wall_s + sim_s / self.speed
