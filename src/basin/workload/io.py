"""Workload files: one schema in two encodings, picked by the file suffix.

JSONL (``.jsonl``, ``.jsonl.gz``) is easy to write from any script and to read
by eye; Parquet (``.parquet``) is compact, typed and opens directly in pandas
or DuckDB. Both carry exactly the same information, so a workload round-trips
through either without loss (``docs/workloads.md`` describes the schema).

* JSONL: line 1 is a header object (``format``, ``version``, ``name``,
  ``block_tokens``, ``description``, ``extra``); every further line is one
  session with its ``calls`` list.
* Parquet: one row per call, session-level columns repeated on every row of
  the session, rows of a session contiguous and in call order; the header
  object is stored as JSON under the schema metadata key ``basin.workload``.

Per-session start times (``Workload.extra["session_start_s"]``, a dict from
session id to seconds) become the per-session field ``start_s``, so a trace's
arrival shape survives the trip; every other ``extra`` entry goes into the
header and must be JSON.

A file that breaks the schema or a record invariant is rejected with a
:class:`~basin.errors.BasinInputError` naming the file, the line (JSONL,
1-based) or row (Parquet, 0-based as pandas shows it), the field and what was
expected. Nothing is dropped or repaired silently.

This module also imports the Azure LLM inference trace (CSV), which has no
sessions: each request becomes a one-call session.
"""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import json
import math
import re
import zlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from basin import diskcache
from basin.errors import BasinInputError, where
from basin.workload.records import Call, CallColumns, RecordError, Session, Workload, bulk_sessions

FORMAT = "basin-workload"
FORMAT_VERSION = 1
#: Suffixes :func:`read_workload` and :func:`write_workload` understand.
WORKLOAD_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
#: ``Workload.extra`` key holding per-session start times (session id -> s).
SESSION_START_KEY = "session_start_s"
#: Schema metadata key of the header object in a Parquet file.
PARQUET_HEADER_KEY = b"basin.workload"

_HEADER_FIELDS = ("format", "version", "name", "block_tokens", "description", "extra")
_CALL_FIELDS = ("prompt_tokens", "new_tokens", "output_tokens", "tool_gap_s", "block_hashes")
_REQUIRED_CALL_FIELDS = ("prompt_tokens", "new_tokens", "output_tokens")
_SESSION_FIELDS = (
    "session_id", "task_text", "tags", "shared_prefix_tokens", "prefix_group", "source", "start_s",
)
_JSONL_SESSION_FIELDS = (*_SESSION_FIELDS, "calls")
_PARQUET_COLUMNS = ("session_id", "call_index", *_CALL_FIELDS, *_SESSION_FIELDS[1:])
_PARQUET_REQUIRED = ("session_id", "call_index", *_REQUIRED_CALL_FIELDS)
#: A checked header: (name, block_tokens, description, extra).
_Header = tuple[str, int | None, str, dict[str, object]]


def workload_suffix(path: str | Path) -> str | None:
    """The workload suffix ``path`` ends with, or None if it has none we know."""
    name = str(path).lower()
    return next((s for s in sorted(WORKLOAD_SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def _require_suffix(path: Path) -> str:
    suffix = workload_suffix(path)
    if suffix is None:
        raise BasinInputError(
            f"{path}: unknown workload file type; use one of {', '.join(WORKLOAD_SUFFIXES)}"
        )
    return suffix


def _stem(path: Path) -> str:
    suffix = workload_suffix(path) or path.suffix
    return path.name[: len(path.name) - len(suffix)] or path.name


# --------------------------------------------------------------------------
# Field conversion shared by both encodings. Each check raises RecordError so
# the readers can add the location in one place.


def _text(name: str, value: object, nullable: bool) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        expected = "a string or null" if nullable else "a string"
        raise RecordError(name, f"expected {expected}, got {value!r}")
    return value


def _tags(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise RecordError("tags", f"expected a list of strings, got {value!r}")
    return tuple(value)


def _block_hashes(value: object, call_index: int) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise RecordError("block_hashes", f"expected a list of integers or null, got {value!r}", call_index)
    return tuple(value)


def _seconds(name: str, value: object, call_index: int | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RecordError(name, f"expected a finite number of seconds >= 0, got {value!r}", call_index)
    return float(value)


def _header_values(header: dict[str, Any]) -> _Header:
    """Check a header object read from a file."""
    unknown = sorted(set(header) - set(_HEADER_FIELDS))
    if unknown:
        raise RecordError(unknown[0], f"unknown header field; known fields: {', '.join(_HEADER_FIELDS)}")
    if header.get("format") != FORMAT:
        raise RecordError("format", f"expected {FORMAT!r}, got {header.get('format')!r}")
    if header.get("version") != FORMAT_VERSION:
        raise RecordError("version",
                          f"this build reads version {FORMAT_VERSION}, got {header.get('version')!r}")
    name = header.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError("name", f"expected a non-empty string, got {name!r}")
    block_tokens = header.get("block_tokens")
    if block_tokens is not None and (
            isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens <= 0):
        raise RecordError("block_tokens", f"expected a positive integer or null, got {block_tokens!r}")
    description = _text("description", header.get("description", ""), nullable=False)
    extra = header.get("extra", {})
    if not isinstance(extra, dict):
        raise RecordError("extra", f"expected a JSON object, got {extra!r}")
    if SESSION_START_KEY in extra:
        raise RecordError("extra", f"'{SESSION_START_KEY}' belongs in each session's 'start_s' field")
    return name, block_tokens, description or "", extra


def _header(w: Workload) -> tuple[str, dict[str, float]]:
    """The header as JSON text, and the per-session start times split off ``extra``."""
    extra = dict(w.extra)
    starts = extra.pop(SESSION_START_KEY, None) or {}
    key = f"workload '{w.name}': extra['{SESSION_START_KEY}']"
    if not isinstance(starts, dict):
        raise BasinInputError(f"{key} must map session ids to seconds")
    unknown = set(starts) - {s.session_id for s in w.sessions}
    if unknown:
        raise BasinInputError(f"{key} names sessions that are not in it: {', '.join(sorted(map(str, unknown))[:5])}")
    for sid, start_s in starts.items():
        try:
            _seconds("start_s", start_s)
        except RecordError as exc:
            raise BasinInputError(f"{key}['{sid}']: {exc.message}") from exc
    header = {
        "format": FORMAT, "version": FORMAT_VERSION, "name": w.name,
        "block_tokens": w.block_tokens, "description": w.description, "extra": extra,
    }
    try:
        text = json.dumps(header, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BasinInputError(f"workload '{w.name}': extra must hold JSON values only ({exc})") from exc
    return text, starts


def _workload(path: Path, header: _Header, sessions: list[Session], starts: dict[str, float]) -> Workload:
    if not sessions:
        raise BasinInputError(f"{path}: no sessions in the file (is it empty?)")
    name, block_tokens, description, extra = header
    if starts:
        extra = {**extra, SESSION_START_KEY: starts}
    return Workload(name=name, sessions=tuple(sessions), block_tokens=block_tokens,
                    description=description, origin=str(path), extra=extra)


def _default_header(path: Path) -> _Header:
    return _stem(path), None, "", {}


# --------------------------------------------------------------------------
# Public entry points


def read_workload(path: str | Path) -> Workload:
    """Read a workload file; the suffix picks the encoding.

    ``origin`` of the result is the path read. Raises BasinInputError for a
    missing file, an unknown suffix or any content that breaks the schema.
    """
    path = Path(path)
    suffix = _require_suffix(path)
    if not path.is_file():
        raise BasinInputError(f"{path}: no such file")
    reader = _read_parquet if suffix == ".parquet" else _read_jsonl
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BasinInputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) < CACHE_MIN_BYTES:
        return reader(path)
    # Every run of a sweep or compare reads the file again in its own process:
    # the checked records are kept on disk under the file's content (and the
    # reader's code), so only the first read parses.

    key = diskcache.make_key("workload-file", hashlib.sha256(data).hexdigest(), str(path), _reader_digest())
    return diskcache.cached(READ_CACHE, key, lambda: reader(path))


#: The disk cache (basin.diskcache) of workload files' checked records.
READ_CACHE = "workload-files"
#: Smaller files are parsed every time: a few thousand calls parse in a few
#: milliseconds, about what a cache entry costs to find and load.
CACHE_MIN_BYTES = 1 << 20


@functools.cache
def _reader_digest() -> str:
    """Digest of the code that turns a file into records."""
    here = Path(__file__).parent
    return diskcache.source_digest([here / "io.py", here / "records.py"])


def write_workload(w: Workload, path: str | Path) -> None:
    """Write ``w`` to ``path`` in the encoding its suffix names."""
    path = Path(path)
    suffix = _require_suffix(path)
    if not path.parent.is_dir():
        raise BasinInputError(f"{path}: the folder {path.parent} does not exist")
    if suffix == ".parquet":
        _write_parquet(w, path)
    else:
        _write_jsonl(w, path)


# --------------------------------------------------------------------------
# JSONL


def _write_jsonl(w: Workload, path: Path) -> None:
    header, starts = _header(w)
    lines = [header]
    for s in w.sessions:
        obj = {
            "session_id": s.session_id, "task_text": s.task_text, "tags": list(s.tags),
            "shared_prefix_tokens": s.shared_prefix_tokens, "prefix_group": s.prefix_group,
            "source": s.source, "start_s": starts.get(s.session_id),
            "calls": [
                {"prompt_tokens": c.prompt_tokens, "new_tokens": c.new_tokens,
                 "output_tokens": c.output_tokens, "tool_gap_s": c.tool_gap_s,
                 "block_hashes": None if c.block_hashes is None else list(c.block_hashes)}
                for c in s.calls
            ],
        }
        lines.append(json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")))
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if path.name.lower().endswith(".gz"):
        # mtime=0 keeps the bytes reproducible for the same workload.
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
            gz.write(data)
    else:
        path.write_bytes(data)


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, decoded text) of the non-blank lines."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            for line_no, raw in enumerate(fh, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise BasinInputError(f"{where(path, line=line_no)}: not UTF-8 text ({exc.reason})") from exc
                if text.strip():
                    yield line_no, text
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise BasinInputError(f"{path}: not a readable gzip file ({exc})") from exc


def _read_jsonl(path: Path) -> Workload:
    """A JSONL workload: parsed as columns (Arrow's JSON reader) and checked
    in bulk; a file that does not fit the columns or breaks a check is read
    again line by line, which names the line, call and field at fault."""
    return _read_jsonl_columnar(path) or _read_jsonl_lines(path)


def _jsonl_schema() -> Any:
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa

    call = pa.struct([("prompt_tokens", pa.int64()), ("new_tokens", pa.int64()), ("output_tokens", pa.int64()),
                      ("tool_gap_s", pa.float64()), ("block_hashes", pa.list_(pa.int64()))])
    return pa.schema([("session_id", pa.string()), ("task_text", pa.string()), ("tags", pa.list_(pa.string())),
                      ("shared_prefix_tokens", pa.int64()), ("prefix_group", pa.string()), ("source", pa.string()),
                      ("start_s", pa.float64()), ("calls", pa.list_(call))])


def _split_header(data: bytes) -> tuple[_Header | None, bytes] | None:
    """The header object (when the first non-blank line is one) and the rest
    of the file; None when the line reader must judge the first line."""
    start = 0
    while True:
        end = data.find(b"\n", start)
        line = data[start:] if end < 0 else data[start:end]
        if line.strip() or end < 0:
            break
        start = end + 1
    try:
        obj = json.loads(line)
    except ValueError:  # malformed JSON or not UTF-8
        return None
    if not isinstance(obj, dict):
        return None
    if "format" not in obj:
        return None, data[start:]
    try:
        return _header_values(obj), b"" if end < 0 else data[end + 1:]
    except RecordError:
        return None


def _read_jsonl_columnar(path: Path) -> Workload | None:
    """The workload, or None when the line reader must read it (see _read_jsonl)."""
    try:
        data = path.read_bytes()
        if path.name.lower().endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error):
        return None
    split = _split_header(data)
    if split is None or not split[1] or split[1].isspace():
        return None
    header, body = split
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pa_json

    try:
        # One block for the whole file: Arrow refuses an object across blocks.
        table = pa_json.read_json(
            pa.BufferReader(body), read_options=pa_json.ReadOptions(use_threads=False, block_size=len(body) + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=_jsonl_schema(), unexpected_field_behavior="error"))
        table = table.combine_chunks()
        table.validate(full=True)  # strings are UTF-8 (the line reader names a line that is not)
    except (pa.ArrowException, OverflowError, ValueError):
        return None
    calls = table.column("calls").chunk(0) if table.num_rows else None
    if calls is None:
        return None
    values = calls.flatten()
    # A null in a column is an explicit null or an absent field. Where the
    # field has a default the line reader tells them apart (absent: the
    # default; null: an error), so a file that spells a null out for one of
    # them is left to it; a required field null or absent is an error.
    defaulted = {"tags": table.column("tags"), "source": table.column("source"),
                 "shared_prefix_tokens": table.column("shared_prefix_tokens"), "tool_gap_s": values.field("tool_gap_s")}
    required = [table.column("session_id"), table.column("calls"), values,
                *(values.field(name) for name in _REQUIRED_CALL_FIELDS)]
    if any(column.null_count for column in required):
        return None
    if any(column.null_count and re.search(rb'"%s"\s*:\s*null' % name.encode(), body)
           for name, column in defaulted.items()):
        return None
    tags = pc.fill_null(table.column("tags"), pa.scalar([], type=pa.list_(pa.string()))).chunk(0)
    if tags.flatten().null_count:
        return None
    hashes = values.field("block_hashes")
    block_hashes = None
    if hashes.null_count < len(hashes):
        if hashes.flatten().null_count:
            return None
        block_hashes = [None if h is None else tuple(h) for h in hashes.to_pylist()]
    start_s = table.column("start_s").to_numpy(zero_copy_only=False)  # NaN where null
    given = table.column("start_s").chunk(0).is_valid().to_numpy(zero_copy_only=False)
    if (given & ~(np.isfinite(start_s) & (start_s >= 0))).any():
        return None
    ids = table.column("session_id").to_pylist()
    if len(set(ids)) != len(ids):
        return None
    sessions = bulk_sessions(CallColumns(
        session_id=ids, task_text=table.column("task_text").to_pylist(), tags=tags.to_pylist(),
        shared_prefix_tokens=pc.fill_null(table.column("shared_prefix_tokens"), 0).to_numpy(),
        prefix_group=table.column("prefix_group").to_pylist(),
        source=pc.fill_null(table.column("source"), "").to_pylist(),
        call_counts=calls.value_lengths().to_numpy(),
        prompt_tokens=values.field("prompt_tokens").to_numpy(), new_tokens=values.field("new_tokens").to_numpy(),
        output_tokens=values.field("output_tokens").to_numpy(),
        tool_gap_s=pc.fill_null(values.field("tool_gap_s"), 0.0).to_numpy(),
        block_hashes=block_hashes))
    if sessions is None:
        return None
    starts = {sid: s for sid, s, ok in zip(ids, start_s.tolist(), given.tolist()) if ok}
    return _workload(path, header or _default_header(path), sessions, starts)


def _read_jsonl_lines(path: Path) -> Workload:
    header: _Header | None = None
    sessions: list[Session] = []
    starts: dict[str, float] = {}
    first_line: dict[str, int] = {}
    for line_no, text in _jsonl_lines(path):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BasinInputError(
                f"{where(path, line=line_no)}: malformed JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(obj, dict):
            raise BasinInputError(
                f"{where(path, line=line_no)}: expected a JSON object, got {type(obj).__name__}")
        try:
            if header is None and not sessions and "format" in obj:
                header = _header_values(obj)
                continue
            session, start_s = _session_from_json(obj)
        except RecordError as exc:
            call = f", call {exc.call_index}" if exc.call_index is not None else ""
            raise BasinInputError(
                f"{where(path, line=line_no)}{call}, field '{exc.field}': {exc.message}") from exc
        if session.session_id in first_line:
            raise BasinInputError(
                f"{where(path, line=line_no, field='session_id')}: session '{session.session_id}' already "
                f"appeared on line {first_line[session.session_id]}; session ids must be unique"
            )
        first_line[session.session_id] = line_no
        sessions.append(session)
        if start_s is not None:
            starts[session.session_id] = start_s
    return _workload(path, header or _default_header(path), sessions, starts)


def _session_from_json(obj: dict[str, Any]) -> tuple[Session, float | None]:
    unknown = sorted(set(obj) - set(_JSONL_SESSION_FIELDS))
    if unknown:
        raise RecordError(unknown[0], f"unknown session field; known fields: {', '.join(_JSONL_SESSION_FIELDS)}")
    for name in ("session_id", "calls"):
        if name not in obj:
            raise RecordError(name, "missing")
    raw_calls = obj["calls"]
    if not isinstance(raw_calls, list):
        raise RecordError("calls", f"expected a list of call objects, got {type(raw_calls).__name__}")
    calls = []
    for k, raw in enumerate(raw_calls):
        if not isinstance(raw, dict):
            raise RecordError("calls", f"expected a call object, got {type(raw).__name__}", k)
        unknown = sorted(set(raw) - set(_CALL_FIELDS))
        if unknown:
            raise RecordError(unknown[0], f"unknown call field; known fields: {', '.join(_CALL_FIELDS)}", k)
        missing = [f for f in _REQUIRED_CALL_FIELDS if f not in raw]
        if missing:
            raise RecordError(missing[0], "missing", k)
        calls.append(_call(raw["prompt_tokens"], raw["new_tokens"], raw["output_tokens"],
                           raw.get("tool_gap_s", 0.0), raw.get("block_hashes"), k))
    session = _session(obj["session_id"], calls, obj.get("task_text"), obj.get("tags", []),
                       obj.get("shared_prefix_tokens", 0), obj.get("prefix_group"), obj.get("source", ""))
    start_s = obj.get("start_s")
    return session, None if start_s is None else _seconds("start_s", start_s)


def _call(prompt: object, new: object, output: object, gap: object, hashes: object, k: int) -> Call:
    try:
        return Call(prompt_tokens=prompt, new_tokens=new, output_tokens=output,  # type: ignore[arg-type]
                    tool_gap_s=_seconds("tool_gap_s", gap, k), block_hashes=_block_hashes(hashes, k))
    except RecordError as exc:
        raise RecordError(exc.field, exc.message, k) from exc


def _session(session_id: object, calls: list[Call], task_text: object, tags: object,
             shared_prefix_tokens: object, prefix_group: object, source: object) -> Session:
    return Session(
        session_id=session_id,  # type: ignore[arg-type]  # Session checks it
        calls=tuple(calls),
        task_text=_text("task_text", task_text, nullable=True),
        tags=_tags(tags),
        shared_prefix_tokens=shared_prefix_tokens,  # type: ignore[arg-type]
        prefix_group=_text("prefix_group", prefix_group, nullable=True),
        source=_text("source", source, nullable=False) or "",
    )


# --------------------------------------------------------------------------
# Parquet


def _write_parquet(w: Workload, path: Path) -> None:
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    header, starts = _header(w)
    cols: dict[str, list[Any]] = {name: [] for name in _PARQUET_COLUMNS}
    for s in w.sessions:
        session_values = (s.task_text, list(s.tags), s.shared_prefix_tokens, s.prefix_group, s.source,
                          starts.get(s.session_id))
        for k, c in enumerate(s.calls):
            cols["session_id"].append(s.session_id)
            cols["call_index"].append(k)
            cols["prompt_tokens"].append(c.prompt_tokens)
            cols["new_tokens"].append(c.new_tokens)
            cols["output_tokens"].append(c.output_tokens)
            cols["tool_gap_s"].append(c.tool_gap_s)
            cols["block_hashes"].append(None if c.block_hashes is None else list(c.block_hashes))
            for name, value in zip(_SESSION_FIELDS[1:], session_values):
                cols[name].append(value)
    schema = pa.schema(
        [
            ("session_id", pa.string()), ("call_index", pa.int32()),
            ("prompt_tokens", pa.int64()), ("new_tokens", pa.int64()), ("output_tokens", pa.int64()),
            ("tool_gap_s", pa.float64()), ("block_hashes", pa.list_(pa.int64())),
            ("task_text", pa.string()), ("tags", pa.list_(pa.string())),
            ("shared_prefix_tokens", pa.int64()), ("prefix_group", pa.string()),
            ("source", pa.string()), ("start_s", pa.float64()),
        ],
        metadata={PARQUET_HEADER_KEY: header.encode("utf-8")},
    )
    try:
        table = pa.table(cols, schema=schema)
    except (pa.ArrowInvalid, OverflowError) as exc:
        raise BasinInputError(
            f"{path}: cannot store workload '{w.name}' in Parquet ({exc}); counts and block hashes "
            f"must fit in int64 (JSONL has no such limit)"
        ) from exc
    pq.write_table(table, path, compression="zstd")


def _column_kind_ok(name: str, typ: Any) -> bool:
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow.types as pt

    nullable = name in ("block_hashes", "task_text", "prefix_group", "start_s")
    if nullable and pt.is_null(typ):
        return True
    if name in ("session_id", "task_text", "prefix_group", "source"):
        return pt.is_string(typ) or pt.is_large_string(typ)
    if name in ("tool_gap_s", "start_s"):
        return pt.is_floating(typ) or pt.is_integer(typ)
    if name == "block_hashes":
        return (pt.is_list(typ) or pt.is_large_list(typ)) and pt.is_integer(typ.value_type)
    if name == "tags":
        return (pt.is_list(typ) or pt.is_large_list(typ)) and (
            pt.is_string(typ.value_type) or pt.is_large_string(typ.value_type))
    return pt.is_integer(typ)


_EXPECTED_COLUMN_TYPE = {
    "session_id": "string", "call_index": "integer", "prompt_tokens": "integer", "new_tokens": "integer",
    "output_tokens": "integer", "tool_gap_s": "float", "block_hashes": "list<integer>",
    "task_text": "string", "tags": "list<string>", "shared_prefix_tokens": "integer",
    "prefix_group": "string", "source": "string", "start_s": "float",
}


def _read_parquet(path: Path) -> Workload:
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise BasinInputError(f"{path}: not a readable Parquet file ({exc})") from exc
    meta = table.schema.metadata or {}
    header = _default_header(path)
    if PARQUET_HEADER_KEY in meta:
        try:
            obj = json.loads(meta[PARQUET_HEADER_KEY].decode("utf-8"))
            if not isinstance(obj, dict):
                raise RecordError("format", "the header must be a JSON object")
            header = _header_values(obj)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BasinInputError(f"{path}: schema metadata 'basin.workload' is not JSON ({exc})") from exc
        except RecordError as exc:
            raise BasinInputError(
                f"{path}: schema metadata 'basin.workload', field '{exc.field}': {exc.message}") from exc
    names = table.column_names
    for name in names:
        if name not in _PARQUET_COLUMNS:
            raise BasinInputError(
                f"{where(path, field=name)}: unknown column; known columns: {', '.join(_PARQUET_COLUMNS)}")
    for name in _PARQUET_REQUIRED:
        if name not in names:
            raise BasinInputError(f"{where(path, field=name)}: missing column")
    for name in names:
        if not _column_kind_ok(name, table.schema.field(name).type):
            raise BasinInputError(
                f"{where(path, field=name)}: expected a {_EXPECTED_COLUMN_TYPE[name]} column, "
                f"got {table.schema.field(name).type}")
    n = table.num_rows
    defaults: dict[str, object] = {"tool_gap_s": 0.0, "block_hashes": None, "task_text": None, "tags": [],
                                   "shared_prefix_tokens": 0, "prefix_group": None, "source": "", "start_s": None}
    cols = {name: table.column(name).to_pylist() if name in names else [defaults[name]] * n
            for name in _PARQUET_COLUMNS}
    return _workload(path, header, *_sessions_from_rows(path, cols, n))


def _sessions_from_rows(path: Path, cols: dict[str, list[Any]], n: int) -> tuple[list[Session], dict[str, float]]:
    """Group contiguous rows into sessions, checking call order and session-level columns."""
    ids, index = cols["session_id"], cols["call_index"]
    sessions: list[Session] = []
    starts: dict[str, float] = {}
    first_row: dict[object, int] = {}
    row = 0
    while row < n:
        first = row
        sid = ids[first]
        while row < n and ids[row] == sid:
            row += 1
        if sid in first_row:
            raise BasinInputError(
                f"{where(path, row=first, field='session_id')}: session '{sid}' already has rows starting at "
                f"row {first_row[sid]}; session ids must be unique and a session's rows contiguous")
        first_row[sid] = first
        for r in range(first, row):
            if index[r] != r - first:
                raise BasinInputError(
                    f"{where(path, row=r, field='call_index')}: expected call {r - first} of session '{sid}', "
                    f"got {index[r]!r}; a session's rows must hold calls 0, 1, 2, ... in order")
        try:
            calls = [_call(cols["prompt_tokens"][r], cols["new_tokens"][r], cols["output_tokens"][r],
                           cols["tool_gap_s"][r], cols["block_hashes"][r], r - first) for r in range(first, row)]
            session = _session(sid, calls, cols["task_text"][first], cols["tags"][first],
                               cols["shared_prefix_tokens"][first], cols["prefix_group"][first],
                               cols["source"][first])
            start_s = cols["start_s"][first]
            if start_s is not None:
                starts[session.session_id] = _seconds("start_s", start_s)
        except RecordError as exc:
            bad_row = first + (exc.call_index or 0)
            raise BasinInputError(f"{where(path, row=bad_row, field=exc.field)}: {exc.message}") from exc
        for r in range(first + 1, row):
            for name in _SESSION_FIELDS[1:]:
                if cols[name][r] != cols[name][first]:
                    raise BasinInputError(
                        f"{where(path, row=r, field=name)}: differs from row {first} of session '{sid}'; "
                        f"session-level columns must repeat the same value on every row of the session")
        sessions.append(session)
    return sessions, starts


# --------------------------------------------------------------------------
# Azure LLM inference trace (CSV): requests without sessions


_AZURE_COLUMNS = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def read_azure_trace(path: str | Path) -> Workload:
    """Import an Azure LLM inference trace: each request is a one-call session.

    The context tokens are both the prompt and the new suffix (the trace has
    no prefix information) and the generated tokens the output. Arrival
    offsets from the first request go into ``extra["session_start_s"]`` so the
    workload also carries the trace's arrival shape.
    """
    path = Path(path)
    if not path.is_file():
        raise BasinInputError(f"{path}: no such file")
    sessions: list[Session] = []
    starts: dict[str, float] = {}
    first_arrival: datetime | None = None
    line = 1
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            head = next(reader, None)
            if head != _AZURE_COLUMNS:
                raise BasinInputError(
                    f"{where(path, line=1)}: expected the header {','.join(_AZURE_COLUMNS)}, got {head!r}")
            for row in reader:
                line = reader.line_num
                arrival, prompt, output = _azure_row(path, line, row)
                if first_arrival is None:
                    first_arrival = arrival
                offset_s = (arrival - first_arrival).total_seconds()
                sid = f"az{len(sessions):06d}"
                if sessions and offset_s < starts[sessions[-1].session_id]:
                    raise BasinInputError(
                        f"{where(path, line=line, field='TIMESTAMP')}: earlier than the previous request; "
                        f"the trace must be in arrival order")
                sessions.append(Session(session_id=sid, calls=(Call(prompt, prompt, output),), source=path.name))
                starts[sid] = offset_s
    except (csv.Error, UnicodeDecodeError) as exc:
        raise BasinInputError(f"{where(path, line=line + 1)}: unreadable CSV ({exc})") from exc
    if not sessions:
        raise BasinInputError(f"{path}: no requests after the header")
    return Workload(
        name=path.stem, sessions=tuple(sessions),
        description=f"Azure LLM inference trace {path.name}: one-call sessions at the trace's arrival times",
        origin=str(path), extra={SESSION_START_KEY: starts},
    )


def _azure_row(path: Path, line: int, row: list[str]) -> tuple[datetime, int, int]:
    if len(row) != len(_AZURE_COLUMNS):
        raise BasinInputError(f"{where(path, line=line)}: expected {len(_AZURE_COLUMNS)} columns, got {len(row)}")
    try:
        arrival = datetime.fromisoformat(row[0])
    except ValueError as exc:
        raise BasinInputError(
            f"{where(path, line=line, field='TIMESTAMP')}: expected a date and time, got {row[0]!r}") from exc
    for name, text in zip(_AZURE_COLUMNS[1:], row[1:]):
        if not (text.isascii() and text.isdigit()):
            raise BasinInputError(
                f"{where(path, line=line, field=name)}: expected a non-negative whole number, got {text!r}")
    return arrival, int(row[1]), int(row[2])
