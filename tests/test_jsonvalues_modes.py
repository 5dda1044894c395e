"""The one JSON helper for figures in both its modes: non-finite values as null
(the default) or as the strings the gateway's /admin/state documents."""

import json
import math

import numpy as np
import pytest

from basin.jsonvalues import json_value, json_values

NESTED = {
    "nan": math.nan, "inf": math.inf, "neg": -math.inf, "x": 1.5, "n": 3, "flag": True, "none": None, "s": "inf",
    "list": [math.inf, 2.0], "tuple": (math.nan, -math.inf), "dict": {"deep": [{"v": math.inf}], "ok": 0.25},
    "np": np.float64("-inf"),
}


def test_string_mode_writes_nan_and_infinities_as_strings_at_any_depth():
    out = json_values(NESTED, nonfinite="string")
    assert out == {
        "nan": "nan", "inf": "inf", "neg": "-inf", "x": 1.5, "n": 3, "flag": True, "none": None, "s": "inf",
        "list": ["inf", 2.0], "tuple": ["nan", "-inf"], "dict": {"deep": [{"v": "inf"}], "ok": 0.25},
        "np": "-inf",
    }
    # The strings are what str() gives a float, so a reader can float() them back.
    assert [str(v) for v in (math.nan, math.inf, -math.inf)] == [out["nan"], out["inf"], out["neg"]]
    assert json_value(math.inf, nonfinite="string") == "inf"
    assert json.loads(json.dumps(out, allow_nan=False)) == out


def test_null_mode_is_the_default_and_reaches_nested_mappings():
    out = json_values(NESTED)
    assert out == json_values(NESTED, nonfinite="null")
    assert out["nan"] is None and out["neg"] is None and out["np"] is None
    assert out["tuple"] == [None, None] and out["dict"] == {"deep": [{"v": None}], "ok": 0.25}
    assert out["flag"] is True and out["n"] == 3 and out["s"] == "inf"
    json.dumps(json_value(NESTED), allow_nan=False)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="nonfinite"):
        json_value(1.0, nonfinite="nan")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nonfinite"):
        json_values({}, nonfinite="str")  # type: ignore[arg-type]
