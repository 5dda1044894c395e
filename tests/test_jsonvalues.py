"""Figures in JSON output: non-finite values become null, others stay."""

import math

from basin.jsonvalues import json_value, json_values


def test_non_finite_floats_become_none_also_inside_lists():
    assert json_values({"a": math.nan, "b": math.inf, "c": 1.5, "d": "x", "e": (1.0, -math.inf)}) == {
        "a": None, "b": None, "c": 1.5, "d": "x", "e": [1.0, None]}
    assert json_value(3) == 3 and json_value([math.nan]) == [None]
