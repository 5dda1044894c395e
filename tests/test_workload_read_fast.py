"""The columnar JSONL reader reads exactly what the line reader reads, and
leaves every file it cannot judge to it (so errors keep their line, call and
field); workload files are kept in the disk cache by content."""

from __future__ import annotations

import gzip
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from tests.test_workload_io import workloads

from basin.errors import BasinInputError
from basin.workload import io
from basin.workload.records import Workload


def _same(a: Workload, b: Workload) -> None:
    assert a == b and a.extra == b.extra
    for sa, sb in zip(a.sessions, b.sessions, strict=True):
        assert type(sa.tags) is type(sb.tags)
        for ca, cb in zip(sa.calls, sb.calls, strict=True):
            assert [type(getattr(ca, f)) for f in ca.__slots__] == [type(getattr(cb, f)) for f in cb.__slots__]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@settings(max_examples=60, deadline=None)
@given(w=workloads())
def test_columnar_reads_what_the_line_reader_reads(suffix: str, w: Workload) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"w{suffix}"
        io.write_workload(w, path)
        lines = io._read_jsonl_lines(path)
        columnar = io._read_jsonl_columnar(path)
    # Block hashes beyond int64 do not fit Arrow's columns: the line reader reads those.
    fits = all(-(2**63) <= h < 2**63 for s in w.sessions for c in s.calls for h in (c.block_hashes or ()))
    assert (columnar is not None) == fits
    if columnar is not None:
        _same(columnar, lines)
    _same(lines, replace(w, origin=str(path)))


HEADER = {"format": "basin-workload", "version": 1, "name": "t", "block_tokens": None, "description": "",
          "extra": {}}
CALL = {"prompt_tokens": 10, "new_tokens": 10, "output_tokens": 2}


def _session(sid: str = "s", call: dict | None = None, **fields: object) -> dict[str, object]:
    return {"session_id": sid, "calls": [call or CALL], **fields}


# Files whose records the columns cannot tell apart from others (an explicit
# null against an absent field), or that break a check: the line reader decides.
EDGE_FILES = {
    "tags absent": [HEADER, _session(), _session("t")],
    "tags null": [HEADER, _session(tags=None)],
    "source null": [HEADER, _session(source=None)],
    "tool gap absent": [HEADER, _session(call={**CALL})],
    "tool gap null": [HEADER, _session(call={**CALL, "tool_gap_s": None})],
    "header field on a session": [HEADER, _session(format=None)],
    "no header": [_session(), _session("t")],
    "blank lines": [HEADER, "", _session(), "   ", _session("t")],
    "token count true": [HEADER, _session(call={**CALL, "prompt_tokens": True})],
    "token count 10.0": [HEADER, _session(call={**CALL, "prompt_tokens": 10.0})],
    "tool gap NaN": [HEADER, '{"session_id": "s", "calls": [{"prompt_tokens": 1, "new_tokens": 1, '
                             '"output_tokens": 1, "tool_gap_s": NaN}]}'],
    "new above prompt": [HEADER, _session(call={**CALL, "new_tokens": 11})],
    "reuse above context": [HEADER, {"session_id": "s", "calls": [CALL, {**CALL, "prompt_tokens": 100}]}],
    "shared prefix above prompt": [HEADER, _session(shared_prefix_tokens=11)],
    "no calls": [HEADER, {"session_id": "s", "calls": []}],
    "duplicate id": [HEADER, _session(), _session()],
    "empty id": [HEADER, _session("")],
    "numeric id": [HEADER, {"session_id": 5, "calls": [CALL]}],
    "unknown call field": [HEADER, _session(call={**CALL, "cached": 3})],
    "unknown session field": [HEADER, _session(owner="x")],
    "null call": [HEADER, {"session_id": "s", "calls": [None]}],
    "negative start": [HEADER, _session(start_s=-1)],
    "integer start": [HEADER, _session(start_s=3)],
    "huge hash": [HEADER, _session(call={**CALL, "block_hashes": [2**64 + 1]})],
    "null in tags": [HEADER, _session(tags=["a", None])],
    "second header": [HEADER, _session(), HEADER],
    "bad header": [{**HEADER, "version": 9}, _session()],
    "header only": [HEADER],
    "malformed": [HEADER, '{"session_id": "s", "calls": [}'],
}


@pytest.mark.parametrize("name", list(EDGE_FILES))
def test_edge_files_read_as_the_line_reader_reads_them(tmp_path: Path, name: str) -> None:
    path = tmp_path / "edge.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in EDGE_FILES[name]),
                    encoding="utf-8")
    try:
        expected: Workload | str = io._read_jsonl_lines(path)
    except BasinInputError as exc:
        expected = str(exc)
    try:
        got: Workload | str = io.read_workload(path)
    except BasinInputError as exc:
        got = str(exc)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert isinstance(got, Workload)
        _same(got, expected)


def test_invalid_utf8_still_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(HEADER).encode() + b'\n{"session_id": "s\xff", "calls": []}\n')
    assert io._read_jsonl_columnar(path) is None
    with pytest.raises(BasinInputError, match="line 2: not UTF-8"):
        io.read_workload(path)


def test_a_valid_file_is_read_by_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "w.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for obj in (HEADER, _session(tags=["x"], start_s=1.5), _session("t", source="y")):
            fh.write(json.dumps(obj) + "\n")

    def refused(_: Path) -> Workload:
        raise AssertionError("the line reader read a file the columns hold")

    monkeypatch.setattr(io, "_read_jsonl_lines", refused)
    w = io.read_workload(path)
    assert [s.session_id for s in w.sessions] == ["s", "t"] and w.extra == {io.SESSION_START_KEY: {"s": 1.5}}


def test_large_files_are_kept_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(io, "CACHE_MIN_BYTES", 1)
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(_session()) + "\n", encoding="utf-8")
    first = io.read_workload(path)
    assert len(list((tmp_path / "cache" / io.READ_CACHE).glob("*.pickle"))) == 1
    # Another content is another entry; the old one is never served for it.
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(_session("other")) + "\n", encoding="utf-8")
    second = io.read_workload(path)
    assert [s.session_id for s in first.sessions] == ["s"] and [s.session_id for s in second.sessions] == ["other"]
    assert len(list((tmp_path / "cache" / io.READ_CACHE).glob("*.pickle"))) == 2
    # A bad file is not kept: its error comes every time.
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(_session("")) + "\n", encoding="utf-8")
    for _ in range(2):
        with pytest.raises(BasinInputError, match="session_id"):
            io.read_workload(path)
