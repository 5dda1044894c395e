"""The run records: the tables' columns, types and counts."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from basin.sim.recorder import CALL_COLUMNS, Recorder, median
from basin.sim.sessions import SessionState
from basin.workload.records import Call, Session

from .helpers import request


def _finished(uid: int, prompt: int, cached: int, loaded: int, t0: float, ttft: float):
    req = request(uid, prompt, output=30)
    req.issued_s = req.admitted_s = t0
    req.prefill_start_s = t0 + 0.1
    req.first_token_s = t0 + ttft
    req.finished_s = t0 + ttft + 1.0
    req.cached, req.loaded, req.uncached = cached, loaded, prompt - cached - loaded
    req.retractions = uid % 2
    req.prefill = uid % 2
    return req


def test_calls_table_has_one_typed_row_per_finished_call():
    rec = Recorder()
    reqs = [_finished(0, 1000, 600, 100, 0.0, 0.5), _finished(1, 2000, 0, 0, 1.0, 0.25)]
    for i, (r, tag) in enumerate(zip(reqs, ["base", "burst"], strict=True)):
        rec.call_done(r, tag, viol=3 * i)
    t = rec.calls_table()
    assert tuple(t) == CALL_COLUMNS
    assert all(len(col) == 2 for col in t.values())
    assert t["tag"].dtype == object and list(t["tag"]) == ["base", "burst"]
    for name in CALL_COLUMNS:
        if name.endswith("_s"):
            assert t[name].dtype == np.float64, name
        elif name != "tag":
            assert t[name].dtype == np.int64, name
    assert list(t["prompt_tokens"]) == [1000, 2000]
    assert list(t["cached_tokens"] + t["loaded_tokens"] + t["uncached_tokens"]) == [1000, 2000]
    assert list(t["itl_violations"]) == [0, 3]
    assert list(t["retractions"]) == [0, 1]
    assert list(t["output_tokens"]) == [30, 30] and list(t["decode_steps"]) == [29, 29]
    assert list(t["prefill_instance"]) == [0, 1]
    assert list(t["decode_instance"]) == [-1, -1]  # never given one
    assert t["first_token_s"][1] == 1.25


def test_an_empty_run_still_has_every_call_column():
    t = Recorder().calls_table()
    assert tuple(t) == CALL_COLUMNS and all(len(c) == 0 for c in t.values())
    assert t["issued_s"].dtype == np.float64 and t["session_uid"].dtype == np.int64


def test_timeseries_counts_per_minute_and_fills_missing_tags():
    rec = Recorder()
    rec.arrival()
    rec.arrival()
    rec.first_admitted(2.0)
    a = _finished(0, 1000, 600, 100, 0.0, 0.5)
    rec.first_token(a)
    rec.call_done(a, "base", 0)
    # The engine's cumulative prefill totals (prompt, cached, loaded, computed) at each close.
    rec.close_minute(0, {"active_sessions": 2, "decode_running": 1}, Counter({"base": 2}), (1000, 600, 100, 300))
    b = _finished(1, 3000, 0, 0, 60.0, 1.5)
    rec.first_token(b)
    rec.session_done()
    rec.close_minute(1, {"active_sessions": 1, "decode_running": 0}, Counter({"burst": 1}), (4000, 600, 100, 3300))
    rec.close_minute(2, {"active_sessions": 0, "decode_running": 0}, Counter(), (4000, 600, 100, 3300))
    ts = rec.timeseries_table()
    assert ts["minute"].dtype == np.int64 and list(ts["minute"]) == [0, 1, 2]
    assert list(ts["arrivals"]) == [2, 0, 0]
    assert list(ts["calls_completed"]) == [1, 0, 0]
    assert list(ts["sessions_completed"]) == [0, 1, 0]
    assert list(ts["prompt_tokens"]) == [1000, 3000, 0]
    assert list(ts["cached_tokens"]) == [600, 0, 0] and list(ts["loaded_tokens"]) == [100, 0, 0]
    assert list(ts["uncached_tokens"]) == [300, 3000, 0]
    assert list(ts["ttft_p50_s"][:2]) == [0.5, 1.5] and math.isnan(ts["ttft_p50_s"][2])
    assert ts["first_call_wait_p50_s"][0] == 2.0 and math.isnan(ts["first_call_wait_p50_s"][1])
    assert list(ts["active_sessions"]) == [2, 1, 0]
    # A tag seen in any minute is a column; minutes without it read 0.
    assert list(ts["active_base"]) == [2, 0, 0] and list(ts["active_burst"]) == [0, 1, 0]
    assert all(len(c) == 3 for c in ts.values())


def test_recent_hit_rate_spans_the_current_and_the_previous_minute():
    rec = Recorder()
    assert math.isnan(rec.recent_hit_rate((0, 0, 0, 0)))
    first = (1000, 600, 100, 300)  # the engine's cumulative prefill totals
    assert rec.recent_hit_rate(first) == 0.7
    rec.close_minute(0, {}, Counter(), first)
    second = (2000, 600, 100, 1300)
    assert rec.recent_hit_rate(second) == 0.35
    rec.close_minute(1, {}, Counter(), second)
    rec.close_minute(2, {}, Counter(), second)
    assert math.isnan(rec.recent_hit_rate(second))


def test_sessions_table_has_one_row_per_session():
    calls = (Call(100, 100, 5, 1.0), Call(150, 45, 5))
    sessions = [SessionState(0, Session("a", calls), "base", 3.0, 0, None),
                SessionState(1, Session("b", calls), "warm", 0.0, 1, None)]
    sessions[0].calls_done = 2
    sessions[0].finished_s = 50.0
    sessions[1].shed = True
    t = Recorder.sessions_table(sessions)
    assert set(t) == {"session_uid", "session_id", "tag", "warm", "arrival_s", "first_admitted_s", "finished_s",
                      "shed", "n_calls", "calls_done", "reference_s", "decode_steps", "itl_violations"}
    assert all(len(c) == 2 for c in t.values())
    assert list(t["session_id"]) == ["a", "b"] and list(t["warm"]) == [False, True]
    assert list(t["n_calls"]) == [2, 2] and list(t["calls_done"]) == [2, 0]
    assert list(t["shed"]) == [False, True]
    assert t["finished_s"][0] == 50.0 and math.isnan(t["finished_s"][1])
    assert t["warm"].dtype == bool and t["calls_done"].dtype == np.int64


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=40))
def test_minute_median_is_numpys_bit_for_bit(values: list[float]) -> None:
    """The per-minute medians feed the time series the digests pin: they must
    be numpy's numbers, NaN and infinities included."""
    got = median(values)
    want = float(np.median(values)) if values else float("nan")
    assert (math.isnan(got) and math.isnan(want)) or got == want
    assert math.copysign(1.0, got) == math.copysign(1.0, want) or math.isnan(want)
