"""Real agent trajectories from the per-call tables in ``data/derived``.

Each table is a pair of CSV files (described in ``data/README.md`` section 4):
``*_calls.csv(.gz)`` with one row per LLM call and ``*_sessions.csv`` with one
row per session, plus optionally ``*_tasks.jsonl`` with each session's task
text. They are the only real, per-call agent data we have, so every row is
checked against the schema and the two files against each other; a broken
copy is rejected with the file, line, field and fix, never patched silently.

One repair is deliberate and counted: gaps are differences of timestamps taken
by different processes (agent and tool container, or a terminal recording),
and a handful are slightly below zero (11 in the shipped tables, the worst
-1.1 s). Gaps down to ``-NEGATIVE_GAP_TOLERANCE_S`` are read as 0.0 and their
number is kept in ``Workload.extra["clamped_tool_gaps"]``; anything more
negative is an error.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from basin.errors import BasinInputError, where
from basin.paths import DATA_DIR
from basin.workload.io import SESSION_START_KEY
from basin.workload.records import Call, Session, Workload

#: Clock jitter (seconds) below zero that is read as a zero tool gap.
NEGATIVE_GAP_TOLERANCE_S = 2.0

#: Columns a calls table must have (``t_start_s``, ``t_end_s`` and
#: ``cached_tokens`` are documented but not needed by any record).
CALL_COLUMNS = ("session_id", "call_idx", "prompt_tokens", "new_tokens", "output_tokens", "tool_gap_s")
#: Columns a sessions table must have; the others are checked when present.
SESSION_COLUMNS = ("session_id", "n_calls")


@dataclass(frozen=True, slots=True)
class AgentTable:
    """A shipped table: the file prefix under ``data/derived`` and a description."""

    prefix: str
    description: str
    has_task_texts: bool


#: The shipped tables by preset name.
AGENT_TABLES: dict[str, AgentTable] = {
    "swebench-deepseek": AgentTable(
        "swebench_minisweagent_deepseek",
        "mini-SWE-agent x DeepSeek on SWE-bench: provider token counts, measured tool gaps",
        has_task_texts=True,
    ),
    "terminalbench-claude": AgentTable(
        "terminalbench_minisweagent_claude4sonnet",
        "mini-SWE-agent x Claude Sonnet 4 on Terminal-Bench: tokens estimated as chars/3.5, "
        "long tool-gap tail",
        has_task_texts=False,
    ),
}


def table_files(name: str) -> tuple[Path, Path, Path | None]:
    """The calls, sessions and (if any) task-text files of a shipped table."""
    table = AGENT_TABLES.get(name)
    if table is None:
        raise BasinInputError(f"unknown agent table '{name}'; choose one of {', '.join(AGENT_TABLES)}")
    base = DATA_DIR / "derived"
    return (base / f"{table.prefix}_calls.csv.gz", base / f"{table.prefix}_sessions.csv",
            base / f"{table.prefix}_tasks.jsonl" if table.has_task_texts else None)


def load_agent_table(name: str) -> Workload:
    """Load a shipped table by name (``swebench-deepseek`` or ``terminalbench-claude``)."""
    calls, sessions, tasks = table_files(name)
    table = AGENT_TABLES[name]
    w = load_agent_table_files(calls, sessions, tasks, name=name)
    description = f"{table.description}; {w.description}" if w.description else table.description
    return Workload(name=w.name, sessions=w.sessions, description=description, origin=w.origin,
                    extra=w.extra)


def load_agent_table_files(
    calls_csv: str | Path,
    sessions_csv: str | Path | None = None,
    tasks_jsonl: str | Path | None = None,
    name: str | None = None,
) -> Workload:
    """Load a calls table with its sessions table (and task texts) into a workload.

    ``sessions_csv`` None: the ``*_sessions.csv`` beside ``calls_csv`` (same
    prefix). ``tasks_jsonl`` None: the ``*_tasks.jsonl`` beside it if there is
    one, else no task texts. ``name`` None: the file prefix. Sessions keep the
    sessions table's order; ``Session.source`` holds its ``source`` and
    ``model``; ``extra`` maps session ids to ``task_id``, ``outcome`` and
    ``session_start_s`` where the table has them.
    """
    calls_path = Path(calls_csv)
    prefix = _table_prefix(calls_path)
    sessions_path = Path(sessions_csv) if sessions_csv is not None else calls_path.with_name(
        f"{prefix}_sessions.csv")
    if tasks_jsonl is not None:
        tasks_path: Path | None = Path(tasks_jsonl)
    else:
        beside = calls_path.with_name(f"{prefix}_tasks.jsonl")
        tasks_path = beside if beside.is_file() else None

    session_rows = _read_sessions(sessions_path)
    calls_by_session, clamped = _read_calls(calls_path, session_rows)
    texts = _read_tasks(tasks_path, session_rows) if tasks_path is not None else {}

    sessions: list[Session] = []
    for sid, row in session_rows.items():
        line, fields = row
        calls = calls_by_session.get(sid, [])
        _check_session_row(sessions_path, line, fields, calls, calls_path)
        source = " ".join(v for v in (fields.get("source"), fields.get("model")) if v)
        # The row checks above guarantee every record invariant (exact reuse, gaps >= 0).
        sessions.append(Session(session_id=sid, calls=tuple(c for _, c in calls),
                                task_text=texts.get(sid), source=source))
    if not sessions:
        raise BasinInputError(f"{sessions_path}: no sessions (is the file empty?)")

    extra: dict[str, object] = {}
    for key in ("task_id", "outcome"):
        values = {sid: fields[key] for sid, (_, fields) in session_rows.items() if fields.get(key)}
        if values:
            extra[key] = values
    starts = {sid: _float(sessions_path, line, "session_start_s", fields["session_start_s"])
              for sid, (line, fields) in session_rows.items() if fields.get("session_start_s")}
    if starts:
        extra[SESSION_START_KEY] = starts
    description = ""
    if clamped:
        extra["clamped_tool_gaps"] = clamped
        description = (f"{clamped} tool gaps between -{NEGATIVE_GAP_TOLERANCE_S:g} s and 0 s "
                       "(clock jitter) read as 0 s")
    return Workload(name=name or prefix, sessions=tuple(sessions), description=description,
                    origin=str(calls_path), extra=extra)


# --------------------------------------------------------------------------
# Reading and checking


def _table_prefix(calls_path: Path) -> str:
    for suffix in ("_calls.csv.gz", "_calls.csv"):
        if calls_path.name.endswith(suffix):
            return calls_path.name[: -len(suffix)]
    raise BasinInputError(
        f"{calls_path}: expected a calls table named <prefix>_calls.csv or <prefix>_calls.csv.gz "
        "(its sessions table is <prefix>_sessions.csv)")


def _open_text(path: Path) -> IO[str]:
    if not path.is_file():
        raise BasinInputError(f"{path}: no such file")
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Rows of a CSV file with their 1-based line numbers (the header is line 1)."""
    with _open_text(path) as f:
        reader = csv.DictReader(f)
        try:
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise BasinInputError(
                    f"{where(path, line=1)}: missing column(s) {', '.join(missing)}; "
                    f"a table needs {', '.join(required)}")
            for fields in reader:
                if None in fields or any(v is None for v in fields.values()):
                    raise BasinInputError(
                        f"{where(path, line=reader.line_num)}: expected {len(header)} comma-separated "
                        "values as in the header")
                yield reader.line_num, fields
        except (csv.Error, UnicodeDecodeError, OSError, EOFError) as exc:
            raise BasinInputError(f"{where(path, line=reader.line_num)}: unreadable CSV ({exc})") from exc


def _int(path: Path, line: int, field: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise BasinInputError(
            f"{where(path, line=line, field=field)}: expected a whole number, got {text!r}") from None
    if value < 0:
        raise BasinInputError(f"{where(path, line=line, field=field)}: expected a count >= 0, got {value}")
    return value


def _float(path: Path, line: int, field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise BasinInputError(f"{where(path, line=line, field=field)}: expected a number, got {text!r}")
    return value


def _read_sessions(path: Path) -> dict[str, tuple[int, dict[str, str]]]:
    rows: dict[str, tuple[int, dict[str, str]]] = {}
    for line, fields in _csv_rows(path, SESSION_COLUMNS):
        sid = fields["session_id"]
        if not sid:
            raise BasinInputError(f"{where(path, line=line, field='session_id')}: empty session id")
        if sid in rows:
            raise BasinInputError(
                f"{where(path, line=line, field='session_id')}: session '{sid}' already listed on "
                f"line {rows[sid][0]}; keep one row per session")
        rows[sid] = (line, fields)
    return rows


def _read_calls(
    path: Path, session_rows: dict[str, tuple[int, dict[str, str]]]
) -> tuple[dict[str, list[tuple[int, Call]]], int]:
    """Calls grouped by session in call order, with their lines; and the clamped-gap count."""
    raw: dict[str, list[tuple[int, int, dict[str, str]]]] = {}
    for line, fields in _csv_rows(path, CALL_COLUMNS):
        sid = fields["session_id"]
        if sid not in session_rows:
            raise BasinInputError(
                f"{where(path, line=line, field='session_id')}: session '{sid}' has no row in the "
                "sessions table; add it there or remove its calls")
        idx = _int(path, line, "call_idx", fields["call_idx"])
        raw.setdefault(sid, []).append((idx, line, fields))

    grouped: dict[str, list[tuple[int, Call]]] = {}
    clamped = 0
    for sid, rows in raw.items():
        rows.sort(key=lambda r: (r[0], r[1]))
        calls: list[tuple[int, Call]] = []
        for k, (idx, line, fields) in enumerate(rows):
            if idx != k:
                problem = (f"call_idx {idx} appears twice (also line {rows[k - 1][1]})"
                           if k > 0 and idx == rows[k - 1][0] else f"expected call_idx {k}, found {idx}")
                raise BasinInputError(
                    f"{where(path, line=line, field='call_idx')}: session '{sid}': {problem}; "
                    "a session's calls are numbered 0, 1, 2, ... without gaps")
            last = k == len(rows) - 1
            call, was_clamped = _call(path, line, fields, calls[-1][1] if calls else None, last)
            clamped += was_clamped
            calls.append((line, call))
        grouped[sid] = calls
    return grouped, clamped


def _call(path: Path, line: int, fields: dict[str, str], prev: Call | None, last: bool) -> tuple[Call, bool]:
    prompt = _int(path, line, "prompt_tokens", fields["prompt_tokens"])
    new = _int(path, line, "new_tokens", fields["new_tokens"])
    output = _int(path, line, "output_tokens", fields["output_tokens"])
    expected_new = prompt if prev is None else prompt - prev.prompt_tokens - prev.output_tokens
    if new != expected_new:
        rule = ("prompt_tokens on call 0" if prev is None
                else "prompt_tokens - previous prompt_tokens - previous output_tokens")
        raise BasinInputError(
            f"{where(path, line=line, field='new_tokens')}: new_tokens is {new} but {rule} = "
            f"{expected_new}; fix the row (or the previous one) so the columns agree")
    gap_text = fields["tool_gap_s"].strip()
    clamped = False
    if last:
        if gap_text and _float(path, line, "tool_gap_s", gap_text) != 0.0:
            raise BasinInputError(
                f"{where(path, line=line, field='tool_gap_s')}: the last call of a session has no next "
                f"call; leave tool_gap_s empty (got {gap_text!r})")
        gap = 0.0
    else:
        if not gap_text:
            raise BasinInputError(
                f"{where(path, line=line, field='tool_gap_s')}: empty, but only a session's last call "
                "may leave the gap to the next call empty")
        gap = _float(path, line, "tool_gap_s", gap_text)
        if gap < -NEGATIVE_GAP_TOLERANCE_S:
            raise BasinInputError(
                f"{where(path, line=line, field='tool_gap_s')}: gap {gap} s is negative beyond "
                f"clock jitter ({-NEGATIVE_GAP_TOLERANCE_S:g} s); check the call's timestamps")
        if gap < 0:
            gap, clamped = 0.0, True
    return Call(prompt_tokens=prompt, new_tokens=new, output_tokens=output, tool_gap_s=gap), clamped


def _check_session_row(path: Path, line: int, fields: dict[str, str],
                       calls: list[tuple[int, Call]], calls_path: Path) -> None:
    sid = fields["session_id"]
    n_calls = _int(path, line, "n_calls", fields["n_calls"])
    if n_calls == 0:
        raise BasinInputError(
            f"{where(path, line=line, field='n_calls')}: session '{sid}' has no calls; a session needs "
            "at least one (drop its row)")
    if n_calls != len(calls):
        raise BasinInputError(
            f"{where(path, line=line, field='n_calls')}: session '{sid}' says {n_calls} calls but "
            f"{calls_path.name} has {len(calls)}; the two files are out of step")
    checks = (("first_prompt_tokens", lambda: calls[0][1].prompt_tokens),
              ("peak_prompt_tokens", lambda: max(c.prompt_tokens for _, c in calls)))
    for field, measured in checks:
        text = fields.get(field)
        if text:
            stated = _int(path, line, field, text)
            if stated != measured():
                raise BasinInputError(
                    f"{where(path, line=line, field=field)}: session '{sid}' says {stated} but its "
                    f"calls in {calls_path.name} give {measured()}; the two files are out of step")


def _read_tasks(path: Path, session_rows: dict[str, tuple[int, dict[str, str]]]) -> dict[str, str]:
    texts: dict[str, str] = {}
    seen: dict[str, int] = {}
    with _open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BasinInputError(f"{where(path, line=line_no)}: not a JSON object ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise BasinInputError(f"{where(path, line=line_no)}: expected a JSON object per line")
            sid = obj.get("session_id")
            if sid not in session_rows:
                raise BasinInputError(
                    f"{where(path, line=line_no, field='session_id')}: {sid!r} is not in the sessions table")
            if sid in seen:
                raise BasinInputError(
                    f"{where(path, line=line_no, field='session_id')}: '{sid}' already has a task text on "
                    f"line {seen[sid]}")
            text = obj.get("task_text")
            if not isinstance(text, str):
                raise BasinInputError(
                    f"{where(path, line=line_no, field='task_text')}: expected a string, got {text!r}")
            table_task = session_rows[sid][1].get("task_id")
            if "task_id" in obj and table_task and obj["task_id"] != table_task:
                raise BasinInputError(
                    f"{where(path, line=line_no, field='task_id')}: {obj['task_id']!r} but the sessions "
                    f"table gives session '{sid}' task {table_task!r}")
            seen[sid] = line_no
            texts[sid] = text
    return texts
