"""JSON output of figures: JSON has no NaN or infinity, and an unmeasured
figure is written as null rather than as a number it is not."""

from __future__ import annotations

import math


def json_value(value: object) -> object:
    """``value`` with non-finite floats (also inside lists and tuples) as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value


def json_values(values: dict[str, object]) -> dict[str, object]:
    return {k: json_value(v) for k, v in values.items()}
