"""Run directories: Parquet tables and the JSON summary round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.metrics import (
    RunState,
    RunSummary,
    read_run,
    read_summary,
    read_table,
    summarize_run,
    write_run,
    write_table,
)
from test_metrics_builders import make_calls, make_sessions, make_timeseries, synthetic_run


def _assert_tables_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.dtype.kind == "f":
            assert y.dtype == np.float64, name
            np.testing.assert_array_equal(x, y, err_msg=name)  # NaN == NaN here
        else:
            assert x.dtype.kind == y.dtype.kind or (x.dtype.kind in "OU" and y.dtype == object), name
            assert x.tolist() == y.tolist(), name


def _run():
    calls, sessions, timeseries, duration_s = synthetic_run(
        ttft_s=[0.2, 0.2, 30.0, 60.0, 60.0, 60.0], hit_rate=[0.95, 0.95, 0.5, 0.3, 0.3, 0.3],
        never_start=[0.0, 0.0, 0.0, 0.1, 0.0, 0.0])
    return calls, sessions, timeseries, duration_s


def test_parquet_round_trip_keeps_types_and_nan(tmp_path: Path) -> None:
    calls, sessions, timeseries, _ = _run()
    assert np.isnan(sessions["first_admitted_s"]).any()  # the shed sessions: NaN must survive
    write_run(tmp_path / "run", calls, sessions, timeseries)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "calls.parquet", "sessions.parquet", "timeseries.parquet"]
    back = read_run(tmp_path / "run")
    for original, read in zip((calls, sessions, timeseries), back, strict=True):
        _assert_tables_equal(original, read)
    assert back[1]["session_uid"].dtype == np.int64
    assert back[1]["shed"].dtype == bool


def test_run_tables_are_plain_columns_under_zstd(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    calls, sessions, timeseries, _ = _run()
    write_run(tmp_path / "run", calls, sessions, timeseries)
    meta = pq.ParquetFile(tmp_path / "run" / "calls.parquet").metadata
    chunks = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
    assert {c.compression for c in chunks} == {"ZSTD"}
    assert not any("DICTIONARY" in enc for c in chunks for enc in c.encodings)  # first use costs ~70 ms


def test_string_columns_of_either_kind_round_trip(tmp_path: Path) -> None:
    table = {"tag": np.array(["base", "burst"]), "id": np.array(["a", "b"], dtype=object), "x": np.arange(2)}
    write_table(table, tmp_path / "t.parquet")
    back = read_table(tmp_path / "t.parquet")
    assert back["tag"].tolist() == ["base", "burst"] and back["id"].tolist() == ["a", "b"]
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary file was renamed away


def test_summary_json_round_trip(tmp_path: Path) -> None:
    calls, sessions, timeseries, duration_s = _run()
    summary = summarize_run(calls, sessions, timeseries, system="hicache", trigger_s=900.0,
                            duration_s=duration_s, measure_end_s=5400.0)
    assert summary.state is RunState.TRAPPED
    write_run(tmp_path, calls, sessions, timeseries, summary)
    text = (tmp_path / "summary.json").read_text()
    data = json.loads(text)  # strict JSON: no NaN tokens
    assert data["state"] == "trapped" and data["system"] == "hicache"
    assert len(data["windows"]) == 6
    assert [w["degraded"] for w in data["windows"]] == [False, False, True, True, True, True]
    back = read_summary(tmp_path)
    assert back.to_dict() == summary.to_dict()
    assert back.windows[-1] == summary.windows[-1]
    assert isinstance(back.state, RunState)


def test_nan_fields_are_written_as_null_and_read_back_as_nan() -> None:
    calls, sessions, timeseries, duration_s = _run()
    summary = summarize_run(calls, sessions, timeseries, system="x", trigger_s=None, duration_s=duration_s,
                            measure_end_s=5400.0)
    # Every field of this run is defined; blank one by hand as an undefined percentile would be.
    data = summary.to_dict() | {"slowdown_p90": None}
    back = RunSummary.from_dict(data)
    assert np.isnan(back.slowdown_p90)
    assert back.trigger_s is None  # an optional field stays None, not NaN
    assert json.loads(back.to_json())["slowdown_p90"] is None


def test_unknown_summary_fields_are_rejected() -> None:
    calls, sessions, timeseries, duration_s = _run()
    data = summarize_run(calls, sessions, timeseries, system="x", trigger_s=None, duration_s=duration_s,
                         measure_end_s=5400.0).to_dict()
    with pytest.raises(BasinInputError, match="unknown field"):
        RunSummary.from_dict(data | {"goodput": 1.0})


def test_missing_files_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(BasinInputError, match="no such table"):
        read_run(tmp_path)
    with pytest.raises(BasinInputError, match="no run summary"):
        read_summary(tmp_path)


def test_undefined_window_medians_round_trip_as_nan(tmp_path: Path) -> None:
    summary = summarize_run(make_calls([]), make_sessions([]), make_timeseries(120), system="idle",
                            trigger_s=900.0, duration_s=7200.0, measure_end_s=5400.0)
    assert np.isnan(summary.windows[0].ttft_p50_s)
    write_run(tmp_path, make_calls([]), make_sessions([]), make_timeseries(120), summary)
    back = read_summary(tmp_path)
    assert np.isnan(back.windows[0].ttft_p50_s) and np.isnan(back.slowdown_p50)
    assert back.goodput_per_h == 0.0 and back.state is RunState.HEALTHY
