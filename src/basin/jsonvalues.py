"""JSON output of figures: JSON has no NaN or infinity.

By default an unmeasured or unbounded figure is written as null rather than
as a number it is not. Where a reader must tell the cases apart (the
gateway's ``/admin/state``: an unbounded budget is not an unknown one),
``nonfinite="string"`` writes them as ``"nan"``, ``"inf"`` and ``"-inf"``.
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

#: How non-finite floats are written: ``"null"`` (None) or ``"string"`` ("nan", "inf", "-inf").
NonFinite = Literal["null", "string"]
_MODES = ("null", "string")


@overload
def json_value(value: dict[str, Any], *, nonfinite: NonFinite = "null") -> dict[str, Any]: ...


@overload
def json_value(value: object, *, nonfinite: NonFinite = "null") -> object: ...


def json_value(value: object, *, nonfinite: NonFinite = "null") -> object:
    """``value`` ready for strict JSON: non-finite floats as None (or as strings, see
    :data:`NonFinite`), also inside dicts, lists and tuples (tuples become lists)."""
    if nonfinite not in _MODES:
        raise ValueError(f"nonfinite must be one of {', '.join(_MODES)}, got {nonfinite!r}")
    return _convert(value, nonfinite == "string")


def json_values(values: dict[str, object], *, nonfinite: NonFinite = "null") -> dict[str, object]:
    """:func:`json_value` of each value of a mapping (e.g. ``dataclasses.asdict`` of a record)."""
    if nonfinite not in _MODES:
        raise ValueError(f"nonfinite must be one of {', '.join(_MODES)}, got {nonfinite!r}")
    as_string = nonfinite == "string"
    return {k: _convert(v, as_string) for k, v in values.items()}


def _convert(value: object, as_string: bool) -> object:
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if not as_string:
            return None
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _convert(v, as_string) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_convert(v, as_string) for v in value]
    return value
