"""``basin gateway --record FILE``: the gateway's own traffic as a workload.

Each session's calls are kept as the gateway sees them (arrival, prompt,
cached and output tokens, tool gap) and written, when the session ends, as
one line of the workload schema's JSONL (``basin.workload.io``), so
``basin run`` and ``basin replay`` read the file like any other workload and
the session's first arrival travels as its ``start_s``. Content never leaves
the gateway: the task text is replaced by a hash of it.

:class:`TrafficRecorder` is pure (times are handed in by the gateway);
:class:`RecordFile` does the writing, one whole line per session, flushed,
rotating to ``NAME.1.jsonl``, ``NAME.2.jsonl``, ... past a size so a reader never sees a
half-written session.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from basin.errors import BasinInputError
from basin.gateway.usage import CallUsage
from basin.workload.arrivals import recorded_arrivals
from basin.workload.io import FORMAT, FORMAT_VERSION
from basin.workload.records import Call, Session

__all__ = ["RecordFile", "TrafficRecorder", "check_record_path", "observed_cached_tokens", "recorded_arrivals",
           "session_record", "task_hash"]

#: ``Session.source`` of a recorded session; the observed cached tokens follow it.
SOURCE = "basin-gateway"


def task_hash(text: str | None) -> str | None:
    """A stable stand-in for a task's text: equal tasks hash equal, the text stays private."""
    if not text:
        return None
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass
class _Open:
    arrival_s: float
    task: str | None
    #: Per answered call: (arrival, prompt, cached, output, answered at).
    calls: list[tuple[float, int, int, int, float]] = field(default_factory=list)
    pending_arrival_s: float | None = None


class TrafficRecorder:
    """Sessions' calls as they happen; a finished session comes back as a
    workload :class:`Session` and its start time (seconds since ``origin_s``)."""

    def __init__(self, origin_s: float):
        self.origin_s = origin_s
        self.open: dict[str, _Open] = {}

    def call_arrived(self, session_id: str, now_s: float, task_text: str | None) -> None:
        entry = self.open.get(session_id)
        if entry is None:
            entry = self.open[session_id] = _Open(now_s, task_hash(task_text))
        if entry.pending_arrival_s is None:
            entry.pending_arrival_s = now_s

    def call_done(self, session_id: str, usage: CallUsage | None, now_s: float) -> None:
        """An answered call; one without usage cannot be sized and is left out."""
        entry = self.open.get(session_id)
        if entry is None or entry.pending_arrival_s is None:
            return
        arrived, entry.pending_arrival_s = entry.pending_arrival_s, None
        if usage is None:
            return
        cached = min(usage.cached_tokens or 0, usage.prompt_tokens)
        entry.calls.append((arrived, usage.prompt_tokens, cached, usage.completion_tokens, now_s))

    def session_ended(self, session_id: str) -> tuple[Session, float] | None:
        """The session as a workload record, or None if no call of it was answered."""
        entry = self.open.pop(session_id, None)
        if entry is None or not entry.calls:
            return None
        return session_record(session_id, entry), max(entry.arrival_s - self.origin_s, 0.0)

    def drain(self) -> list[tuple[Session, float]]:
        """Every open session as recorded so far (the gateway is stopping)."""
        out = [self.session_ended(sid) for sid in list(self.open)]
        return [r for r in out if r is not None]


def session_record(session_id: str, entry: _Open) -> Session:
    """Calls in the workload's terms: the reused prefix is what the previous
    call's prompt and answer allow (the conversation grows), the tool gap is
    the time from an answer to the next call's arrival."""
    calls: list[Call] = []
    previous_context = 0
    for k, (_, prompt, _cached, output, answered) in enumerate(entry.calls):
        reused = min(prompt, previous_context)
        gap = max(entry.calls[k + 1][0] - answered, 0.0) if k + 1 < len(entry.calls) else 0.0
        calls.append(Call(prompt_tokens=prompt, new_tokens=prompt - reused, output_tokens=output, tool_gap_s=gap))
        previous_context = prompt + output
    cached = ",".join(str(c[2]) for c in entry.calls)
    return Session(session_id=session_id, calls=tuple(calls), task_text=entry.task,
                   source=f"{SOURCE}; cached_tokens={cached}")


def observed_cached_tokens(session: Session) -> tuple[int, ...] | None:
    """The cached tokens the engine reported per call, from a recorded session's ``source``."""
    prefix = f"{SOURCE}; cached_tokens="
    if not session.source.startswith(prefix):
        return None
    return tuple(int(v) for v in session.source[len(prefix):].split(",") if v)


def check_record_path(path: str | os.PathLike[str]) -> Path:
    """The record file's path, refused before the gateway listens if it cannot be one."""
    out = Path(path)
    if not out.name.endswith(".jsonl"):
        raise BasinInputError(f"--record {out}: expected a .jsonl file (the workload schema's JSONL)")
    if not out.parent.is_dir():
        raise BasinInputError(f"--record {out}: the folder {out.parent} does not exist")
    return out


class RecordFile:
    """Appends recorded sessions to a workload JSONL file, rotating past ``max_bytes``."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 256 * 2**20, keep: int = 5,
                 name: str = "gateway-traffic"):
        self.path = check_record_path(path)
        if max_bytes <= 0 or keep < 1:
            raise BasinInputError("record_max_bytes must be > 0 and record_keep >= 1")
        self.max_bytes, self.keep, self.name = max_bytes, keep, name
        self.written = 0
        self._fh = self._open()

    def _header(self) -> str:
        return json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "name": self.name, "block_tokens": None,
                           "description": "sessions recorded by basin gateway --record (task text hashed)",
                           "extra": {}}, separators=(",", ":"))

    def _open(self) -> TextIO:
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if not fresh:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                first = fh.readline()
            try:
                header = json.loads(first)
            except ValueError:
                header = None
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                # Appending to a file that is not a workload would spoil it: refuse now.
                raise BasinInputError(f"--record {self.path}: exists and is not a workload file (its first line "
                                      f"is not a {FORMAT} header); choose another file or move this one")
        fh = open(self.path, "a", encoding="utf-8")
        if fresh:
            fh.write(self._header() + "\n")
            fh.flush()
        return fh

    def rotated(self, i: int) -> Path:
        """The ``i``-th older file (1 the newest), still a ``.jsonl`` workload file."""
        return self.path.with_name(f"{self.path.name[:-len('.jsonl')]}.{i}.jsonl")

    def _rotate(self) -> None:
        self._fh.close()
        for i in range(self.keep - 1, 0, -1):
            older = self.rotated(i)
            if older.exists():
                os.replace(older, self.rotated(i + 1))
        os.replace(self.path, self.rotated(1))
        self._fh = self._open()

    def write(self, session: Session, start_s: float) -> None:
        obj = {"session_id": session.session_id, "task_text": session.task_text, "tags": list(session.tags),
               "shared_prefix_tokens": 0, "prefix_group": None, "source": session.source, "start_s": start_s,
               "calls": [{"prompt_tokens": c.prompt_tokens, "new_tokens": c.new_tokens,
                          "output_tokens": c.output_tokens, "tool_gap_s": c.tool_gap_s, "block_hashes": None}
                         for c in session.calls]}
        self._fh.write(json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n")
        self._fh.flush()
        self.written += 1
        if self._fh.tell() >= self.max_bytes:
            self._rotate()

    def close(self) -> None:
        self._fh.close()
