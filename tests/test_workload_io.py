"""Workload files: lossless round trips and located errors for bad input."""

from __future__ import annotations

import gzip
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.errors import BasinInputError
from basin.paths import DATA_DIR
from basin.workload.io import (
    PARQUET_HEADER_KEY,
    SESSION_START_KEY,
    read_azure_trace,
    read_workload,
    workload_suffix,
    write_workload,
)
from basin.workload.records import Call, Session, Workload

SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")

# ---------------------------------------------------------------------------
# Random valid workloads

_counts = st.integers(min_value=0, max_value=200_000)
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
_gap = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
_hashes = st.none() | st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=6).map(tuple)


@st.composite
def _calls(draw: st.DrawFn) -> tuple[Call, ...]:
    calls: list[Call] = []
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        prompt = draw(_counts)
        reuse_cap = prompt if not calls else min(prompt, calls[-1].context_tokens)
        reused = draw(st.integers(min_value=0, max_value=reuse_cap))
        calls.append(Call(prompt, prompt - reused, draw(_counts), draw(_gap), draw(_hashes)))
    return tuple(calls)


@st.composite
def _session(draw: st.DrawFn, session_id: str) -> Session:
    calls = draw(_calls())
    return Session(
        session_id=session_id,
        calls=calls,
        task_text=draw(st.none() | _text),
        tags=tuple(draw(st.lists(_text, max_size=3))),
        shared_prefix_tokens=draw(st.integers(min_value=0, max_value=calls[0].prompt_tokens)),
        prefix_group=draw(st.none() | _text),
        source=draw(_text),
    )


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    ids = draw(st.lists(_text.filter(bool), min_size=1, max_size=5, unique=True))
    sessions = tuple(draw(_session(sid)) for sid in ids)
    starts = {s.session_id: draw(_gap) for s in sessions if draw(st.booleans())}
    extra: dict[str, object] = {"seed": draw(st.integers(0, 10)), "note": draw(_text)}
    if starts:
        extra[SESSION_START_KEY] = starts
    return Workload(
        name=draw(_text.filter(bool)),
        sessions=sessions,
        block_tokens=draw(st.none() | st.integers(min_value=1, max_value=4096)),
        description=draw(_text),
        extra=extra,
    )


@pytest.mark.parametrize("suffix", SUFFIXES)
@settings(max_examples=60, deadline=None)
@given(w=workloads())
def test_random_workloads_round_trip_exactly(suffix: str, w: Workload) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"w{suffix}"
        write_workload(w, path)
        back = read_workload(path)
    assert back == replace(w, origin=str(path))  # origin records where it was read from
    assert back.extra == w.extra


def _small() -> Workload:
    s0 = Session("s0", (Call(100, 100, 10, 0.5, (1, 2)), Call(130, 20, 5)), task_text="fix it", tags=("a",))
    s1 = Session("s1", (Call(50, 50, 7),), source="t")
    return Workload("small", (s0, s1), block_tokens=64, description="two sessions",
                    extra={SESSION_START_KEY: {"s0": 0.0, "s1": 2.5}})


def test_gzip_output_is_reproducible(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    write_workload(_small(), a)
    write_workload(_small(), b)
    assert a.read_bytes() == b.read_bytes()
    assert gzip.decompress(a.read_bytes()).decode().splitlines()[0].startswith('{"format": "basin-workload"')


def test_suffix_detection() -> None:
    assert workload_suffix("x/y.JSONL.GZ") == ".jsonl.gz"
    assert workload_suffix("y.parquet") == ".parquet"
    assert workload_suffix("y.csv") is None


# ---------------------------------------------------------------------------
# JSONL errors

HEADER = {"format": "basin-workload", "version": 1, "name": "t", "block_tokens": None,
          "description": "", "extra": {}}


def _jsonl(tmp_path: Path, *lines: object, name: str = "bad.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _sess(sid: str = "s", **fields: object) -> dict[str, object]:
    obj: dict[str, object] = {"session_id": sid, "calls": [{"prompt_tokens": 10, "new_tokens": 10,
                                                           "output_tokens": 2}]}
    obj.update(fields)
    return obj


def _raises(path: Path, *fragments: str) -> None:
    with pytest.raises(BasinInputError) as info:
        read_workload(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def test_minimal_jsonl_without_header_reads_with_defaults(tmp_path: Path) -> None:
    w = read_workload(_jsonl(tmp_path, _sess(), name="tiny.jsonl"))
    assert w.name == "tiny" and w.block_tokens is None
    assert w.sessions[0].calls == (Call(10, 10, 2, 0.0, None),)
    assert w.extra == {}


@pytest.mark.parametrize(
    ("lines", "fragments"),
    [
        ([HEADER, "{not json"], ["line 2", "malformed JSON"]),
        ([HEADER, "[1, 2]"], ["line 2", "expected a JSON object"]),
        ([HEADER, {"calls": []}], ["line 2", "field 'session_id'", "missing"]),
        ([HEADER, _sess(calls=[{"prompt_tokens": 5, "new_tokens": 5}])],
         ["line 2", "call 0", "field 'output_tokens'", "missing"]),
        ([HEADER, _sess(calls=[{"prompt_tokens": "5", "new_tokens": 5, "output_tokens": 1}])],
         ["line 2", "call 0", "field 'prompt_tokens'", "whole number"]),
        ([HEADER, _sess(calls=[{"prompt_tokens": 5, "new_tokens": 5, "output_tokens": -1}])],
         ["line 2", "field 'output_tokens'", "non-negative"]),
        ([HEADER, _sess(calls=[{"prompt_tokens": 5, "new_tokens": 6, "output_tokens": 1}])],
         ["line 2", "field 'new_tokens'", "cannot exceed the prompt"]),
        ([HEADER, _sess(calls=[{"prompt_tokens": 5, "new_tokens": 5, "output_tokens": 1},
                               {"prompt_tokens": 100, "new_tokens": 10, "output_tokens": 1}])],
         ["line 2", "call 1", "field 'new_tokens'", "raise new_tokens to at least 94"]),
        ([HEADER, _sess(calls=[{"prompt_tokens": 5, "new_tokens": 5, "output_tokens": 1, "tool_gap_s": -1}])],
         ["line 2", "field 'tool_gap_s'", ">= 0"]),
        ([HEADER, _sess(calls=[{"prompt_tokens": 5, "new_tokens": 5, "output_tokens": 1, "prompt": 3}])],
         ["line 2", "field 'prompt'", "unknown call field"]),
        ([HEADER, _sess(calls=[{"prompt_tokens": 5, "new_tokens": 5, "output_tokens": 1,
                                "block_hashes": [1, "x"]}])],
         ["line 2", "field 'block_hashes'", "list of integers"]),
        ([HEADER, _sess(calls=[])], ["line 2", "field 'calls'", "at least one call"]),
        ([HEADER, _sess(tags="a")], ["line 2", "field 'tags'", "list of strings"]),
        ([HEADER, _sess(start_s=float("nan"))], ["line 2", "field 'start_s'", "finite"]),
        ([HEADER, _sess(shared_prefix_tokens=11)], ["line 2", "field 'shared_prefix_tokens'", "longer"]),
        ([HEADER, _sess(taskk="x")], ["line 2", "field 'taskk'", "unknown session field"]),
        ([HEADER, _sess("a"), _sess("b"), _sess("a")], ["line 4", "'a' already appeared on line 2"]),
        ([{**HEADER, "version": 9}], ["line 1", "field 'version'"]),
        ([{**HEADER, "block_tokens": 0}], ["line 1", "field 'block_tokens'", "positive"]),
        ([{**HEADER, "extra": {SESSION_START_KEY: {}}}], ["line 1", "field 'extra'", "start_s"]),
        ([HEADER], ["no sessions"]),
    ],
)
def test_bad_jsonl_is_rejected_with_its_location(tmp_path: Path, lines: list[object], fragments: list[str]) -> None:
    _raises(_jsonl(tmp_path, *lines), *fragments)


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    _raises(path, "no sessions")


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bin.jsonl"
    path.write_bytes(json.dumps(HEADER).encode() + b"\n\xff\xfe\n")
    _raises(path, "line 2", "UTF-8")


def test_non_gzip_with_gz_suffix_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl.gz"
    path.write_text(json.dumps(_sess()) + "\n")
    _raises(path, "gzip")


def test_unknown_suffix_lists_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("x")
    _raises(path, ".jsonl", ".jsonl.gz", ".parquet")
    with pytest.raises(BasinInputError, match=r"\.parquet"):
        write_workload(_small(), tmp_path / "w.txt")


def test_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(BasinInputError, match="no such file"):
        read_workload(tmp_path / "nope.parquet")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"bad": object()}, "JSON values only"),
        ({SESSION_START_KEY: {"s0": float("nan")}}, "['s0']: expected a finite number"),
        ({SESSION_START_KEY: {"ghost": 1.0}}, "not in it: ghost"),
    ],
)
def test_bad_extra_is_rejected_on_write(tmp_path: Path, extra: dict[str, object], fragment: str) -> None:
    with pytest.raises(BasinInputError) as info:
        write_workload(replace(_small(), extra=extra), tmp_path / "w.parquet")
    assert fragment in str(info.value)


# ---------------------------------------------------------------------------
# Parquet errors


def _parquet_columns(tmp_path: Path) -> dict[str, list[object]]:
    path = tmp_path / "good.parquet"
    write_workload(_small(), path)
    return pq.read_table(path).to_pydict()


def _write_columns(tmp_path: Path, cols: dict[str, object], metadata: dict[bytes, bytes] | None = None) -> Path:
    path = tmp_path / "bad.parquet"
    table = pa.table(cols)
    if metadata is not None:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path)
    return path


def test_parquet_layout_is_one_row_per_call(tmp_path: Path) -> None:
    cols = _parquet_columns(tmp_path)
    assert cols["session_id"] == ["s0", "s0", "s1"]
    assert cols["call_index"] == [0, 1, 0]
    assert cols["task_text"] == ["fix it", "fix it", None]
    assert cols["block_hashes"] == [[1, 2], None, None]
    assert cols["start_s"] == [0.0, 0.0, 2.5]


def test_parquet_without_metadata_reads_with_defaults(tmp_path: Path) -> None:
    w = read_workload(_write_columns(tmp_path, {
        "session_id": ["x", "x"], "call_index": [0, 1], "prompt_tokens": [10, 20],
        "new_tokens": [10, 8], "output_tokens": [3, 4]}))
    assert w.name == "bad" and [c.prompt_tokens for c in w.sessions[0].calls] == [10, 20]


def _mutated(cols: dict[str, list[object]], column: str, row: int, value: object) -> dict[str, list[object]]:
    out = {k: list(v) for k, v in cols.items()}
    out[column][row] = value
    return out


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        (lambda c: _mutated(c, "call_index", 1, 2), ["row 1", "field 'call_index'", "expected call 1"]),
        (lambda c: _mutated(c, "call_index", 0, 1), ["row 0", "field 'call_index'", "expected call 0"]),
        (lambda c: {"session_id": ["a", "b", "a"], "call_index": [0, 0, 0], "prompt_tokens": [1, 1, 1],
                    "new_tokens": [1, 1, 1], "output_tokens": [1, 1, 1]},
         ["row 2", "field 'session_id'", "already has rows starting at row 0"]),
        (lambda c: _mutated(c, "output_tokens", 2, -3), ["row 2", "field 'output_tokens'", "non-negative"]),
        (lambda c: _mutated(c, "new_tokens", 2, 51), ["row 2", "field 'new_tokens'", "cannot exceed"]),
        (lambda c: _mutated(c, "new_tokens", 1, 1), ["row 1", "field 'new_tokens'", "previous call"]),
        (lambda c: _mutated(c, "prompt_tokens", 1, None), ["row 1", "field 'prompt_tokens'", "None"]),
        (lambda c: _mutated(c, "task_text", 1, "other"), ["row 1", "field 'task_text'", "differs from row 0"]),
        (lambda c: _mutated(c, "tool_gap_s", 0, float("inf")), ["row 0", "field 'tool_gap_s'", "finite"]),
        (lambda c: {k: v for k, v in c.items() if k != "new_tokens"}, ["field 'new_tokens'", "missing column"]),
        (lambda c: {**c, "prompt_tokens": [1.5, 2.5, 3.5]}, ["field 'prompt_tokens'", "integer column", "double"]),
        (lambda c: {**c, "promt": [1, 2, 3]}, ["field 'promt'", "unknown column"]),
    ],
)
def test_bad_parquet_is_rejected_with_its_row(tmp_path: Path, change, fragments: list[str]) -> None:
    _raises(_write_columns(tmp_path, change(_parquet_columns(tmp_path))), *fragments)


def test_parquet_bad_metadata_is_rejected(tmp_path: Path) -> None:
    cols = _parquet_columns(tmp_path)
    _raises(_write_columns(tmp_path, cols, {PARQUET_HEADER_KEY: b"{oops"}), "basin.workload", "not JSON")
    _raises(_write_columns(tmp_path, cols, {PARQUET_HEADER_KEY: json.dumps({**HEADER, "name": 3}).encode()}),
            "field 'name'")


def test_empty_parquet_is_rejected(tmp_path: Path) -> None:
    cols = {k: v[:0] for k, v in _parquet_columns(tmp_path).items()}
    _raises(_write_columns(tmp_path, {k: pa.array(v, type=pa.int64()) if k != "session_id" else
                                      pa.array(v, type=pa.string()) for k, v in cols.items()
                                      if k in ("session_id", "call_index", "prompt_tokens", "new_tokens",
                                               "output_tokens")}), "no sessions")


def test_not_a_parquet_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "junk.parquet"
    path.write_text("hello")
    _raises(path, "not a readable Parquet file")


def test_hashes_beyond_int64_cannot_go_to_parquet(tmp_path: Path) -> None:
    w = Workload("big", (Session("s", (Call(1, 1, 1, 0.0, (2**64,)),)),))
    with pytest.raises(BasinInputError, match="int64"):
        write_workload(w, tmp_path / "big.parquet")
    write_workload(w, tmp_path / "big.jsonl")
    assert read_workload(tmp_path / "big.jsonl").sessions == w.sessions


# ---------------------------------------------------------------------------
# Azure import


def test_shipped_azure_code_trace_imports_as_one_call_sessions() -> None:
    w = read_azure_trace(DATA_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")
    assert len(w.sessions) == 8819
    first = w.sessions[0].calls[0]
    assert (first.prompt_tokens, first.new_tokens, first.output_tokens) == (4808, 4808, 10)
    starts = w.extra[SESSION_START_KEY]
    assert starts[w.sessions[0].session_id] == 0.0
    assert starts[w.sessions[1].session_id] == pytest.approx(0.052)
    assert 3300 < starts[w.sessions[-1].session_id] < 3700  # about an hour


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        ("time,a,b\n", ["line 1", "TIMESTAMP,ContextTokens,GeneratedTokens"]),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,5,x\n",
         ["line 2", "field 'GeneratedTokens'"]),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", ["line 2", "field 'TIMESTAMP'"]),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:01,5,1\n2023-11-16 18:00:00,5,1\n",
         ["line 3", "arrival order"]),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", ["no requests"]),
    ],
)
def test_bad_azure_csv_is_rejected(tmp_path: Path, body: str, fragments: list[str]) -> None:
    path = tmp_path / "az.csv"
    path.write_text(body)
    with pytest.raises(BasinInputError) as info:
        read_azure_trace(path)
    for fragment in fragments:
        assert fragment in str(info.value)
