"""The shipped agent tables load with their published figures, and broken
copies are rejected with the file, line, field and a fix."""

from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
from pathlib import Path

import pytest

from basin.errors import BasinInputError
from basin.paths import DATA_DIR
from basin.workload.agent_tables import load_agent_table, load_agent_table_files
from basin.workload.io import SESSION_START_KEY
from basin.workload.stats import workload_stats

CALL_HEADER = ["session_id", "call_idx", "t_start_s", "t_end_s", "prompt_tokens", "new_tokens",
               "output_tokens", "cached_tokens", "tool_gap_s"]
SESSION_HEADER = ["session_id", "source", "session_start_s", "task_id", "model", "n_calls",
                  "first_prompt_tokens", "peak_prompt_tokens", "task_chars", "outcome"]


@pytest.fixture(scope="module")
def swe():
    return load_agent_table("swebench-deepseek")


@pytest.fixture(scope="module")
def tb():
    return load_agent_table("terminalbench-claude")


def test_swebench_table_matches_workloads_note(swe):
    # workloads.md 1a: 192 sessions / 15,415 calls; p50s and reuse as published.
    s = workload_stats(swe)
    assert (s.sessions, s.calls) == (192, 15_415)
    assert s.calls_per_session_p50 == 76 and s.calls_per_session_p90 == 115
    assert round(s.prompt_tokens_p50) == 19_214 and s.output_tokens_p50 == 90
    assert s.reuse_fraction == pytest.approx(0.990, abs=5e-4)
    assert s.tool_gap_s_p50 == pytest.approx(0.256)
    assert s.peak_context_p50 == pytest.approx(34_324.5)
    assert all(x.task_text for x in swe.sessions)
    assert swe.sessions[0].source == "deepseek_chat_dev deepseek/deepseek-chat"
    assert swe.extra["task_id"]["swe0000"] == "marshmallow-code__marshmallow-1343"
    assert swe.extra[SESSION_START_KEY]["swe0000"] == 70126.0
    assert swe.extra["clamped_tool_gaps"] == 5


def test_terminalbench_table_matches_workloads_note(tb):
    # workloads.md 1b: 171 sessions / 3,484 calls, p50 18 calls, 0.13 s gap, p90 21.6 s.
    s = workload_stats(tb)
    assert (s.sessions, s.calls) == (171, 3_484)
    assert s.calls_per_session_p50 == 18 and s.calls_per_session_p90 == 36
    assert s.tool_gap_s_p50 == pytest.approx(0.125)
    assert s.tool_gap_s_p90 == pytest.approx(21.63, abs=0.01)
    assert s.reuse_fraction == pytest.approx(0.967, abs=5e-4)
    assert all(x.task_text is None for x in tb.sessions)
    assert "claude-sonnet-4" in tb.sessions[0].source
    assert tb.extra["clamped_tool_gaps"] == 6


def test_last_calls_have_no_gap_and_new_tokens_follow_the_schema(swe, tb):
    for w in (swe, tb):
        for s in w.sessions:
            assert s.calls[-1].tool_gap_s == 0.0
            assert s.calls[0].new_tokens == s.calls[0].prompt_tokens
            for prev, call in zip(s.calls, s.calls[1:]):
                assert call.reused_tokens == prev.context_tokens


def test_unknown_table_names_the_choices():
    with pytest.raises(BasinInputError, match="swebench-deepseek, terminalbench-claude"):
        load_agent_table("swebench")


# --------------------------------------------------------------------------
# Small tables written into tmp_path


def _good_calls() -> list[list[object]]:
    return [
        ["a0", 0, 0, 1, 100, 100, 10, "", 0.5],
        ["a0", 1, 1.5, 2, 130, 20, 5, "", 1.25],
        ["a0", 2, 3.3, 4, 150, 15, 7, "", ""],
        ["b1", 0, 0, 1, 80, 80, 4, "", 2.0],
        ["b1", 1, 3, 4, 90, 6, 3, "", ""],
    ]


def _good_sessions() -> list[list[object]]:
    return [
        ["a0", "run1", 0, "task-a", "m/x", 3, 100, 150, 40, "ok"],
        ["b1", "run1", 5, "task-b", "m/x", 2, 80, 90, 30, "ok"],
    ]


def _write(tmp_path: Path, calls=None, sessions=None, tasks=None, gz=True) -> Path:
    calls_path = tmp_path / ("t_calls.csv.gz" if gz else "t_calls.csv")
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CALL_HEADER)
    writer.writerows(_good_calls() if calls is None else calls)
    if gz:
        with gzip.open(calls_path, "wt", encoding="utf-8", newline="") as f:
            f.write(buf.getvalue())
    else:
        calls_path.write_text(buf.getvalue(), encoding="utf-8")
    with (tmp_path / "t_sessions.csv").open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(SESSION_HEADER)
        writer.writerows(_good_sessions() if sessions is None else sessions)
    if tasks is not None:
        (tmp_path / "t_tasks.jsonl").write_text("".join(t + "\n" for t in tasks), encoding="utf-8")
    return calls_path


def test_good_small_table_loads_with_sessions_and_tasks_found_beside(tmp_path):
    tasks = [json.dumps({"session_id": "a0", "task_id": "task-a", "task_text": "fix the bug"})]
    w = load_agent_table_files(_write(tmp_path, tasks=tasks))
    assert w.name == "t" and [s.session_id for s in w.sessions] == ["a0", "b1"]
    a0, b1 = w.sessions
    assert [c.prompt_tokens for c in a0.calls] == [100, 130, 150]
    assert [c.tool_gap_s for c in a0.calls] == [0.5, 1.25, 0.0]
    assert a0.task_text == "fix the bug" and b1.task_text is None
    assert w.extra["outcome"] == {"a0": "ok", "b1": "ok"}


def test_rows_of_a_session_may_come_in_any_order(tmp_path):
    calls = _good_calls()
    calls[0], calls[2] = calls[2], calls[0]
    w = load_agent_table_files(_write(tmp_path, calls=calls, gz=False), tmp_path / "t_sessions.csv")
    assert [c.prompt_tokens for c in w.sessions[0].calls] == [100, 130, 150]


def _broken(tmp_path: Path, *, calls=None, sessions=None, tasks=None) -> str:
    with pytest.raises(BasinInputError) as info:
        load_agent_table_files(_write(tmp_path, calls=calls, sessions=sessions, tasks=tasks))
    return str(info.value)


def _edit(rows: list[list[object]], row: int, col: str, value: object, header=CALL_HEADER) -> list[list[object]]:
    rows[row][header.index(col)] = value
    return rows


def test_call_index_gap_is_rejected(tmp_path):
    msg = _broken(tmp_path, calls=_edit(_good_calls(), 2, "call_idx", 3))
    assert "t_calls.csv.gz line 4, field 'call_idx'" in msg and "expected call_idx 2, found 3" in msg


def test_duplicate_call_index_is_rejected(tmp_path):
    msg = _broken(tmp_path, calls=_edit(_good_calls(), 1, "call_idx", 0))
    assert "field 'call_idx'" in msg and "appears twice" in msg


def test_inconsistent_new_tokens_name_the_expected_value(tmp_path):
    msg = _broken(tmp_path, calls=_edit(_good_calls(), 1, "new_tokens", 25))
    assert "line 3, field 'new_tokens'" in msg and "= 20" in msg


def test_n_calls_must_match_the_rows(tmp_path):
    sessions = _edit(_good_sessions(), 1, "n_calls", 3, header=SESSION_HEADER)
    msg = _broken(tmp_path, sessions=sessions)
    assert "t_sessions.csv line 3, field 'n_calls'" in msg and "says 3 calls" in msg and "has 2" in msg


def test_calls_without_a_session_row_are_rejected(tmp_path):
    msg = _broken(tmp_path, sessions=_good_sessions()[:1])
    assert "line 5, field 'session_id'" in msg and "'b1' has no row in the sessions table" in msg


def test_session_without_calls_is_rejected(tmp_path):
    sessions = _good_sessions() + [["c2", "run1", 9, "task-c", "m/x", 1, 50, 50, 10, "ok"]]
    msg = _broken(tmp_path, sessions=sessions)
    assert "line 4, field 'n_calls'" in msg and "has 0" in msg


def test_duplicate_session_row_is_rejected(tmp_path):
    msg = _broken(tmp_path, sessions=_good_sessions() + [_good_sessions()[0]])
    assert "line 4, field 'session_id'" in msg and "already listed on line 2" in msg


def test_stated_peak_must_match_the_calls(tmp_path):
    msg = _broken(tmp_path, sessions=_edit(_good_sessions(), 0, "peak_prompt_tokens", 151, header=SESSION_HEADER))
    assert "field 'peak_prompt_tokens'" in msg and "give 150" in msg


def test_empty_gap_before_the_last_call_is_rejected(tmp_path):
    msg = _broken(tmp_path, calls=_edit(_good_calls(), 0, "tool_gap_s", ""))
    assert "line 2, field 'tool_gap_s'" in msg and "only a session's last call" in msg


def test_gap_on_the_last_call_is_rejected(tmp_path):
    msg = _broken(tmp_path, calls=_edit(_good_calls(), 2, "tool_gap_s", 3.0))
    assert "line 4, field 'tool_gap_s'" in msg and "leave tool_gap_s empty" in msg


def test_small_negative_gap_is_clock_jitter_and_counted(tmp_path):
    w = load_agent_table_files(_write(tmp_path, calls=_edit(_good_calls(), 0, "tool_gap_s", -0.3)))
    assert w.sessions[0].calls[0].tool_gap_s == 0.0
    assert w.extra["clamped_tool_gaps"] == 1 and "read as 0 s" in w.description


def test_large_negative_gap_is_rejected(tmp_path):
    msg = _broken(tmp_path, calls=_edit(_good_calls(), 0, "tool_gap_s", -5))
    assert "line 2, field 'tool_gap_s'" in msg and "negative" in msg


def test_fractional_token_count_is_rejected(tmp_path):
    msg = _broken(tmp_path, calls=_edit(_good_calls(), 3, "prompt_tokens", "80.5"))
    assert "line 5, field 'prompt_tokens'" in msg and "whole number" in msg


def test_missing_column_is_named(tmp_path):
    path = _write(tmp_path, gz=False)
    calls = [row[:-1] for row in _good_calls()]
    path.write_text(",".join(CALL_HEADER[:-1]) + "\n" + "\n".join(",".join(map(str, r)) for r in calls) + "\n")
    with pytest.raises(BasinInputError, match=r"t_calls.csv line 1: missing column\(s\) tool_gap_s"):
        load_agent_table_files(path)


def test_short_row_is_rejected(tmp_path):
    path = _write(tmp_path, gz=False)
    path.write_text(path.read_text() + "b1,2,5\n")
    with pytest.raises(BasinInputError, match="line 7: expected 9 comma-separated values"):
        load_agent_table_files(path)


def test_task_lines_are_checked(tmp_path):
    unknown = _broken(tmp_path, tasks=[json.dumps({"session_id": "zz", "task_text": "x"})])
    assert "t_tasks.jsonl line 1, field 'session_id'" in unknown and "not in the sessions table" in unknown
    wrong = _broken(tmp_path, tasks=[json.dumps({"session_id": "a0", "task_id": "task-b", "task_text": "x"})])
    assert "field 'task_id'" in wrong and "task 'task-a'" in wrong
    assert "not a JSON object" in _broken(tmp_path, tasks=["{oops"])


def test_calls_file_needs_the_table_naming(tmp_path):
    path = tmp_path / "calls.csv"
    path.write_text(",".join(CALL_HEADER) + "\n")
    with pytest.raises(BasinInputError, match="<prefix>_calls.csv"):
        load_agent_table_files(path)


def test_broken_copy_of_the_shipped_table_names_file_and_line(tmp_path):
    prefix = "swebench_minisweagent_deepseek"
    shutil.copy(DATA_DIR / "derived" / f"{prefix}_sessions.csv", tmp_path)
    with gzip.open(DATA_DIR / "derived" / f"{prefix}_calls.csv.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    fields = lines[500].split(",")  # a call of swe0006, line 501 of the file
    fields[CALL_HEADER.index("output_tokens")] = str(int(fields[CALL_HEADER.index("output_tokens")]) + 7)
    lines[500] = ",".join(fields)
    copy = tmp_path / f"{prefix}_calls.csv.gz"
    with gzip.open(copy, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    # The next call's new_tokens no longer follows from this call's output.
    with pytest.raises(BasinInputError, match=rf"{prefix}_calls.csv.gz line 502, field 'new_tokens'"):
        load_agent_table_files(copy)


def test_dropped_row_of_the_shipped_table_is_caught(tmp_path):
    prefix = "terminalbench_minisweagent_claude4sonnet"
    shutil.copy(DATA_DIR / "derived" / f"{prefix}_sessions.csv", tmp_path)
    with gzip.open(DATA_DIR / "derived" / f"{prefix}_calls.csv.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[6].startswith("tb0000,5,")
    del lines[6]
    copy = tmp_path / f"{prefix}_calls.csv.gz"
    with gzip.open(copy, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(BasinInputError, match="line 7, field 'call_idx'.*'tb0000': expected call_idx 5, found 6"):
        load_agent_table_files(copy)
