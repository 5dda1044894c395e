"""Sessions and calls: the records every part of basin-serve replays.

An agent session is a chain of LLM calls separated by tool gaps. Each call
resends the conversation so far (its *reused* prefix) plus a new suffix (the
tool observation and wrapper text), then generates an output. The records are
frozen and check their own invariants on construction, so a workload that
loaded is a workload that is safe to simulate.

Token accounting, per call k:

* ``prompt_tokens``: the full prompt sent.
* ``new_tokens``: the suffix that no earlier call of the session produced
  (uncached by construction). ``prompt_tokens - new_tokens`` is the reused
  prefix, which can be at most the previous call's prompt plus its output.
* ``output_tokens``: tokens generated.
* ``tool_gap_s``: time from this call's response to the next call's request
  (zero on the last call).
"""

from __future__ import annotations

import gc
import math
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat

import numpy as np


class RecordError(ValueError):
    """A record breaks an invariant. ``field`` names the offending field.

    Loaders catch it and re-raise a :class:`basin.errors.BasinInputError` that
    adds the file and line or row.
    """

    def __init__(self, field_name: str, message: str, call_index: int | None = None):
        self.field = field_name
        self.call_index = call_index
        self.message = message
        where = f"call {call_index}, " if call_index is not None else ""
        super().__init__(f"{where}field '{field_name}': {message}")


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(name, f"expected a whole number of tokens, got {value!r}")
    if value < 0:
        raise RecordError(name, f"expected a non-negative token count, got {value}")


@dataclass(frozen=True, slots=True)
class Call:
    """One LLM call of a session (see the module docstring for the fields)."""

    prompt_tokens: int
    new_tokens: int
    output_tokens: int
    tool_gap_s: float = 0.0
    #: Hashes of the prompt's fixed-size prefix blocks (the workload says how
    #: many tokens a block holds); equal leading hashes mean a shared prefix.
    block_hashes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_count("prompt_tokens", self.prompt_tokens)
        _check_count("new_tokens", self.new_tokens)
        _check_count("output_tokens", self.output_tokens)
        if self.new_tokens > self.prompt_tokens:
            raise RecordError(
                "new_tokens",
                f"new suffix ({self.new_tokens}) cannot exceed the prompt ({self.prompt_tokens})",
            )
        gap = self.tool_gap_s
        if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap < 0:
            raise RecordError("tool_gap_s", f"expected a finite number of seconds >= 0, got {gap!r}")
        if self.block_hashes is not None and not isinstance(self.block_hashes, tuple):
            raise RecordError("block_hashes", "expected a tuple of integers")

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Pickled as its fields and restored without the checks it passed when
        # built: a cached workload holds some 150,000 calls.
        return _restore_call, (self.prompt_tokens, self.new_tokens, self.output_tokens, self.tool_gap_s,
                               self.block_hashes)

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens repeated from earlier in the session."""
        return self.prompt_tokens - self.new_tokens

    @property
    def context_tokens(self) -> int:
        """Context after this call: its prompt plus its output."""
        return self.prompt_tokens + self.output_tokens


#: Call's slot setters, which bypass the frozen ``__setattr__`` (restoring only).
_SET_CALL_FIELD = {f.name: getattr(Call, f.name).__set__ for f in fields(Call)}
#: The fields a session's calls are pickled as columns of, with their array type codes.
_CALL_COLUMNS = (("prompt_tokens", "q"), ("new_tokens", "q"), ("output_tokens", "q"), ("tool_gap_s", "d"))


def _restore_call(prompt_tokens: int, new_tokens: int, output_tokens: int, tool_gap_s: float,
                  block_hashes: tuple[int, ...] | None) -> Call:
    call = object.__new__(Call)
    set_field = _SET_CALL_FIELD
    set_field["prompt_tokens"](call, prompt_tokens)
    set_field["new_tokens"](call, new_tokens)
    set_field["output_tokens"](call, output_tokens)
    set_field["tool_gap_s"](call, tool_gap_s)
    set_field["block_hashes"](call, block_hashes)
    return call


def _packable(calls: Sequence[Call]) -> bool:
    """Whether calls go into columns of machine numbers (no block hashes, float gaps)."""
    return not any(c.block_hashes is not None or type(c.tool_gap_s) is not float for c in calls)


def _columns(calls: Sequence[Call]) -> tuple[bytes, ...]:
    return tuple(array(code, [getattr(c, name) for c in calls]).tobytes() for name, code in _CALL_COLUMNS)


def _pack_calls(calls: tuple[Call, ...]) -> tuple[bytes, ...] | None:
    """A session's calls as four columns of machine numbers, or None when a
    call carries block hashes or a gap that is not a float (kept as objects)."""
    return _columns(calls) if _packable(calls) else None


def _unpack_calls(columns: Sequence[bytes]) -> list[Call]:
    # Field by field over all the calls, each pass a C loop (a Python call per
    # record cost twice as much: a workload restores some 130,000 calls).
    values = [array(code, raw).tolist() for (_, code), raw in zip(_CALL_COLUMNS, columns, strict=True)]
    calls = list(map(object.__new__, repeat(Call, len(values[0]))))
    for (name, _), column in zip(_CALL_COLUMNS, values, strict=True):
        deque(map(_SET_CALL_FIELD[name], calls, column), maxlen=0)
    deque(map(_SET_CALL_FIELD["block_hashes"], calls, repeat(None)), maxlen=0)
    return calls


def _restore_session(calls: tuple[Call, ...] | tuple[bytes, ...], *values: object) -> Session:
    session = object.__new__(Session)
    if calls and not isinstance(calls[0], Call):
        calls = tuple(_unpack_calls(calls))
    object.__setattr__(session, "calls", calls)
    for name, value in zip(_SESSION_FIELDS, values, strict=True):
        object.__setattr__(session, name, value)
    return session


@dataclass(frozen=True, slots=True)
class Session:
    """An agent session: its calls in order, optional task text and tags."""

    session_id: str
    calls: tuple[Call, ...]
    task_text: str | None = None
    tags: tuple[str, ...] = ()
    #: Leading tokens of call 0 shared with every session of ``prefix_group``
    #: (a common system prompt); they are cached once for the whole group.
    shared_prefix_tokens: int = 0
    prefix_group: str | None = None
    #: Free-form origin (source table, model) kept for reports.
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, str) or not self.session_id:
            raise RecordError("session_id", "expected a non-empty string")
        if not isinstance(self.calls, tuple) or not self.calls:
            raise RecordError("calls", "a session needs at least one call")
        _check_count("shared_prefix_tokens", self.shared_prefix_tokens)
        if self.shared_prefix_tokens > self.calls[0].prompt_tokens:
            raise RecordError(
                "shared_prefix_tokens",
                f"shared prefix ({self.shared_prefix_tokens}) is longer than the first prompt "
                f"({self.calls[0].prompt_tokens})",
            )
        prev: Call | None = None
        for k, call in enumerate(self.calls):
            if not isinstance(call, Call):
                raise RecordError("calls", f"expected Call records, got {type(call).__name__}", k)
            if prev is not None and call.reused_tokens > prev.context_tokens:
                raise RecordError(
                    "new_tokens",
                    f"the reused prefix (prompt {call.prompt_tokens} - new {call.new_tokens} = "
                    f"{call.reused_tokens}) exceeds the previous call's prompt plus output "
                    f"({prev.context_tokens}); raise new_tokens to at least "
                    f"{call.prompt_tokens - prev.context_tokens}",
                    k,
                )
            prev = call

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Pickled with its calls as columns and restored without the checks it
        # passed when built: a cached workload holds some 150,000 calls, and
        # objects rebuilt from columns load in about half the time.
        return _restore_session, (_pack_calls(self.calls) or self.calls,
                                  *(getattr(self, name) for name in _SESSION_FIELDS))

    @property
    def n_calls(self) -> int:
        return len(self.calls)

    @property
    def first_prompt_tokens(self) -> int:
        return self.calls[0].prompt_tokens

    @property
    def peak_context_tokens(self) -> int:
        """Largest context the session reaches (prompt plus output of a call)."""
        # Call.context_tokens summed in place: a property call per call made
        # this a twentieth of a simulated call's cost (a simulator reads it
        # once per arriving session).
        return max([c.prompt_tokens + c.output_tokens for c in self.calls])


#: Session's fields apart from its calls, in the order a pickle carries them.
_SESSION_FIELDS = tuple(f.name for f in fields(Session) if f.name != "calls")


@dataclass(frozen=True, slots=True)
class Workload:
    """A named set of sessions, the unit every command takes."""

    name: str
    sessions: tuple[Session, ...]
    #: Tokens per block hash, when calls carry ``block_hashes``.
    block_tokens: int | None = None
    description: str = ""
    #: Where the sessions came from (file path or preset), kept for reports.
    origin: str = ""
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.sessions:
            raise RecordError("sessions", f"workload '{self.name}' has no sessions")
        if self.block_tokens is not None:
            _check_count("block_tokens", self.block_tokens)
            if self.block_tokens == 0:
                raise RecordError("block_tokens", "expected a positive block size")

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Pickled with every session's calls in one set of columns (sessions
        # whose calls do not pack keep them as objects), restored in one pass
        # without the checks the records passed when built: per session, the
        # set-up of its columns cost about as much as its calls.
        packable = [_packable(s.calls) for s in self.sessions]
        columns = _columns([c for s, ok in zip(self.sessions, packable, strict=True) if ok for c in s.calls])
        lengths = array("q", [len(s.calls) if ok else 0 for s, ok in zip(self.sessions, packable, strict=True)])
        heads = [(None if ok else s.calls, *(getattr(s, name) for name in _SESSION_FIELDS))
                 for s, ok in zip(self.sessions, packable, strict=True)]
        return _restore_workload, (columns, lengths.tobytes(), heads,
                                   *(getattr(self, name) for name in _WORKLOAD_FIELDS))

    @property
    def n_calls(self) -> int:
        return sum(len(s.calls) for s in self.sessions)


#: Workload's fields apart from its sessions, in the order a pickle carries them.
_WORKLOAD_FIELDS = tuple(f.name for f in fields(Workload) if f.name != "sessions")


def _restore_workload(columns: Sequence[bytes], lengths: bytes,
                      heads: Sequence[tuple[tuple[Call, ...] | None, ...]], *values: object) -> Workload:
    calls = _unpack_calls(columns)
    sessions = []
    start = 0
    for n, (own, *session_values) in zip(array("q", lengths).tolist(), heads, strict=True):
        if own is None:
            own = tuple(calls[start:start + n])
            start += n
        sessions.append(_restore_session(own, *session_values))
    workload = object.__new__(Workload)
    object.__setattr__(workload, "sessions", tuple(sessions))
    for name, value in zip(_WORKLOAD_FIELDS, values, strict=True):
        object.__setattr__(workload, name, value)
    return workload


@dataclass(frozen=True, slots=True)
class CallColumns:
    """Sessions as columns, the form a columnar reader produces: one entry per
    session in the session columns, one per call in the call columns (calls
    of a session contiguous and in order, ``call_counts`` of them)."""

    session_id: Sequence[object]
    task_text: Sequence[object]
    tags: Sequence[object]
    shared_prefix_tokens: np.ndarray
    prefix_group: Sequence[object]
    source: Sequence[object]
    call_counts: np.ndarray
    prompt_tokens: np.ndarray
    new_tokens: np.ndarray
    output_tokens: np.ndarray
    tool_gap_s: np.ndarray
    #: Per call, its block hashes (a tuple) or None; None: no call has any.
    block_hashes: Sequence[tuple[int, ...] | None] | None = None


def bulk_sessions(cols: CallColumns) -> list[Session] | None:
    """The sessions ``cols`` hold, with every invariant of :class:`Call` and
    :class:`Session` checked over whole columns at once; None when any record
    breaks one (build those records one by one to learn which and why: the
    checks here accept exactly what the constructors accept)."""
    counts = cols.call_counts
    n_sessions, n_calls = len(cols.session_id), int(counts.sum()) if len(counts) else 0
    prompt, new, output, gap = cols.prompt_tokens, cols.new_tokens, cols.output_tokens, cols.tool_gap_s
    if n_sessions == 0 or len(counts) != n_sessions or (counts <= 0).any() or len(prompt) != n_calls:
        return None
    for name in ("prompt_tokens", "new_tokens", "output_tokens", "shared_prefix_tokens"):
        column = getattr(cols, name)
        if column.dtype.kind not in "iu" or (len(column) and column.min() < 0):
            return None
    if gap.dtype.kind != "f" or not np.isfinite(gap).all() or (gap < 0).any() or (new > prompt).any():
        return None
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    if (cols.shared_prefix_tokens > prompt[starts]).any():
        return None
    # A call reuses at most the previous call's prompt plus output (the first call of a session has none).
    later = np.ones(n_calls, dtype=bool)
    later[starts] = False
    reused, context = prompt - new, prompt + output
    if (later[1:] & (reused[1:] > context[:-1])).any():
        return None
    ids = cols.session_id
    if not all(type(s) is str and s for s in ids):
        return None
    if not all(t is None or type(t) is str for t in cols.task_text) \
            or not all(g is None or type(g) is str for g in cols.prefix_group) \
            or not all(type(s) is str for s in cols.source):
        return None
    tags = [tuple(t) if type(t) is list else t for t in cols.tags]
    if not all(type(t) is tuple and all(type(x) is str for x in t) for t in tags):
        return None
    # Tens of thousands of new objects, none cyclic: the collector's passes
    # over them would cost as much as building them.
    collecting = gc.isenabled()
    gc.disable()
    try:
        calls = _calls_unchecked(prompt.tolist(), new.tolist(), output.tolist(), gap.tolist(), cols.block_hashes)
        bounds = np.cumsum(counts).tolist()
        sessions = []
        first = 0
        shared = cols.shared_prefix_tokens.tolist()
        for i, last in enumerate(bounds):
            sessions.append(_restore_session(tuple(calls[first:last]), ids[i], cols.task_text[i], tags[i],
                                             shared[i], cols.prefix_group[i], cols.source[i]))
            first = last
    finally:
        if collecting:
            gc.enable()
    return sessions


def _calls_unchecked(prompt: list[int], new: list[int], output: list[int], gap: list[float],
                     hashes: Sequence[tuple[int, ...] | None] | None) -> list[Call]:
    """Calls built field by field over whole columns (each pass a C loop),
    without the constructor's checks: the caller has made them in bulk."""
    calls = list(map(object.__new__, repeat(Call, len(prompt))))
    for name, column in (("prompt_tokens", prompt), ("new_tokens", new), ("output_tokens", output),
                         ("tool_gap_s", gap), ("block_hashes", repeat(None) if hashes is None else hashes)):
        deque(map(_SET_CALL_FIELD[name], calls, column), maxlen=0)
    return calls
