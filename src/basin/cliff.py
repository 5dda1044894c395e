"""The cache cliff's shape: prefix hit rate against working set over cache.

One definition, used by BASIN's cliff profiles (what a stored kappa, plateau
and floor mean), the profiler's fit, the fluid model's default curve and
BASIN's own knee. The shape is the one the paper measured on real hardware
(Fig. 6b): a plateau that sags gently as the working set fills the cache,
then a sharp fall to a low-reuse floor near twice the cache. With
``x = W / C_eff`` and ``u = x / (kappa x_k)``::

    s(u) = 1 / (1 + u ** n)                         # the sharp fall, centred on the knee
    d(u) = delta * clip((u - u0) / (1 - u0), 0, 1)  # the plateau's gentle decline
    h(x) = floor + (plateau - floor) * (1 - d(u)) * s(u)

``x_k`` = 1.9 is the centre of the fall (``n`` = 16: from 90% to 10% of it
between 0.87 and 1.15 ``x_k``); the plateau is flat until the working set
fills the cache (``u0`` = 0.5) and has lost ``delta`` = 0.2 of its height
above the floor by the knee. A deployment's curve is this one stretched
along ``x`` by ``kappa`` (its cliff at ``W_c = kappa x_k C_eff``).
"""

from __future__ import annotations

import numpy as np

#: The knee: working set over effective cache where the hit rate is halfway
#: down the fall (Fig. 6b).
X_KNEE = 1.9
#: Steepness ``n`` of the fall (logistic in log working set).
REFERENCE_STEEPNESS = 16.0
#: Share of the plateau-to-floor height the plateau loses by the knee ...
PLATEAU_DECLINE = 0.2
#: ... declining linearly from this fraction of the knee on.
DECLINE_START = 0.5


def reference_shape(x: np.ndarray | float, x_knee: float = X_KNEE, steepness: float = REFERENCE_STEEPNESS,
                    decline: float = PLATEAU_DECLINE, decline_start: float = DECLINE_START) -> np.ndarray:
    """Share of the plateau-to-floor height still held at working-set ratio
    ``x``: 1 on the plateau, ``(1 - decline) / 2`` at the knee, 0 on the floor."""
    u = np.maximum(np.asarray(x, dtype=np.float64), 0.0) / x_knee
    # u ** n overflows harmlessly to inf for huge u; 1 / (1 + inf) = 0.
    with np.errstate(over="ignore"):
        fall = 1.0 / (1.0 + u ** steepness)
    sag = decline * np.clip((u - decline_start) / (1.0 - decline_start), 0.0, 1.0)
    return (1.0 - sag) * fall


def reference_hit(x: np.ndarray | float, kappa: float, plateau: float, floor: float,
                  x_knee: float = X_KNEE, steepness: float = REFERENCE_STEEPNESS,
                  decline: float = PLATEAU_DECLINE, decline_start: float = DECLINE_START) -> np.ndarray:
    """The reference curve stretched by ``kappa``: hit rate at working-set ratio ``x``."""
    shape = reference_shape(np.asarray(x, dtype=np.float64) / kappa, x_knee, steepness, decline, decline_start)
    return floor + (plateau - floor) * shape
