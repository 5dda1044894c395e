"""Named hit curves: the paper's shape, the simulator's fitted table, or a CSV file.

``simulator`` is the table :func:`basin.experiments.classify.profile_hit_curve`
fitted from our simulator the way the paper's Fig. 6b curve comes from its
real runs: every 2-minute window of the calibration scenario ``trap-1p1d``
without a surge, with +33% and with +100%, seeds 0-3 (720 windows), binned by
0.1 of the working-set ratio, medians made monotone. It is kept here as data
so the model needs no simulator run to use it; ``basin model fit-curve``
re-measures it and prints the rows to paste here after an engine change
(docs/fluid-model.md).
"""

from __future__ import annotations

from pathlib import Path

from basin.errors import BasinInputError
from basin.model.hitcurve import HitCurve, PaperHitCurve, TableHitCurve, load_table_csv

#: ``(ratio, hit_rate)`` rows of the simulator's cliff (see the module docstring).
SIMULATOR_TABLE: tuple[tuple[float, float], ...] = (
    (0.555, 0.943), (0.647, 0.937), (0.771, 0.923), (0.856, 0.900), (0.952, 0.897), (1.050, 0.876),
    (1.146, 0.876), (1.234, 0.870), (1.344, 0.847), (1.448, 0.847), (1.538, 0.819), (1.635, 0.770),
    (1.740, 0.743), (1.865, 0.597), (1.913, 0.585), (2.021, 0.585), (2.136, 0.435), (2.261, 0.435),
    (2.440, 0.237), (2.526, 0.211), (2.640, 0.193), (2.740, 0.170), (2.972, 0.059), (3.076, 0.050),
    (3.147, 0.049), (4.954, 0.049),
)

SIMULATOR_LABEL = ("simulator cliff: every 2-minute window of trap-1p1d without a surge, +33% and +100%, "
                   "seeds 0-3 (basin model fit-curve)")

#: Names accepted by ``--curve`` besides a CSV path.
CURVE_NAMES = ("paper", "simulator")


def simulator_curve() -> TableHitCurve:
    return TableHitCurve(tuple(x for x, _ in SIMULATOR_TABLE), tuple(h for _, h in SIMULATOR_TABLE),
                         label=SIMULATOR_LABEL)


def named_curve(spec: str) -> HitCurve:
    """``paper``, ``simulator`` or a path to a ``ratio,hit_rate`` CSV file."""
    if spec == "paper":
        return PaperHitCurve()
    if spec == "simulator":
        return simulator_curve()
    if spec.endswith(".csv") or Path(spec).exists():
        return load_table_csv(spec)
    raise BasinInputError(
        f"unknown hit curve '{spec}': use one of {', '.join(CURVE_NAMES)} or a CSV file with columns ratio,hit_rate")
