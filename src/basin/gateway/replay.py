"""``basin replay``: agent sessions replayed for real against an
OpenAI-compatible endpoint (an engine, or the gateway in front of it).

Each session arrives at its scheduled time and makes its calls in order,
waiting its tool gap after each answer, so the load is closed-loop the way
agents are. Traces carry token counts, not text, so each session gets a
deterministic conversation of the trace's sizes (its task text first) that
grows by whole messages: every prompt extends the previous one and the
engine's prefix cache sees the reuse the trace has (the answer the engine
really gave is replaced by text of its size, so its own tokens are not
reused). ``token_scale`` and ``time_scale`` shrink sessions to what a small
test engine holds.

Times are kept in *scenario seconds*: wall seconds since the start times
``speed``. With ``basin emulate --speed K`` and ``speed=K`` a scenario of two
hours runs in 120/K minutes and its records read like the simulator's.
:class:`ReplayLog` is filled as calls finish, so an interrupted or failed run
still has everything it measured; :func:`run_tables` turns it into the
simulator's three tables (docs/replay.md).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from basin.errors import BasinInputError
from basin.gateway.usage import usage_from_stream_tail
from basin.metrics import nan_percentile
from basin.runtables import (
    ACTIVE_TAG_PREFIX,
    ENGINE_ONLY_TIMESERIES,
    REPLAY_CALLS,
    REPLAY_SESSIONS,
    SECONDS_PER_MINUTE,
    TIMESERIES,
)
from basin.workload.arrivals import PoissonSchedule, SessionArrival, draw_arrivals
from basin.workload.presets import resolve_workload
from basin.workload.records import Call, Session

_WORDS = ("agent tool file patch test build error trace module function value index cache request "
          "token branch commit review parser config server client thread queue memory buffer").split()

#: Mean length of a filler word with the space after it.
_WORD_CHARS = round(sum(len(w) + 1 for w in _WORDS) / len(_WORDS))

#: Bytes of a stream's tail kept to read its usage and the emulator's timings.
_TAIL_BYTES = 16384


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    target: str
    model: str = "default"
    rate_per_min: float = 2.0
    duration_s: float = 600.0
    seed: int = 0
    token_scale: float = 1.0
    time_scale: float = 1.0
    chars_per_token: float = 4.0
    session_header: str = "X-Session-Id"
    end_header: str = "X-Session-End"
    call_timeout_s: float = 600.0
    #: Scenario seconds per wall second (the emulator's ``--speed``).
    speed: float = 1.0
    #: Stop the run this many scenario seconds after its start (None: when every session ended).
    stop_after_s: float | None = None
    #: The ITL SLO decode gaps are counted against (scenario seconds).
    itl_slo_s: float = 0.05

    def __post_init__(self) -> None:
        if not self.target.startswith(("http://", "https://")):
            raise BasinInputError(f"field 'target': expected an http(s) URL such as http://127.0.0.1:8400, "
                                  f"got {self.target!r}")
        for name in ("rate_per_min", "duration_s", "token_scale", "chars_per_token", "call_timeout_s",
                     "speed", "itl_slo_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise BasinInputError(f"field '{name}': expected a number > 0, got {value!r}")
        if not math.isfinite(self.time_scale) or self.time_scale < 0:
            raise BasinInputError(f"field 'time_scale': expected a number >= 0, got {self.time_scale!r}")
        stop = self.stop_after_s
        if stop is not None and (not math.isfinite(stop) or stop <= 0):
            raise BasinInputError(f"field 'stop_after_s': expected a number > 0 or none, got {stop!r}")


@dataclass(frozen=True, slots=True)
class ReplayCall:
    """One call as the client saw it (times in scenario seconds from the replay's start).

    ``admitted_s`` is when the engine received the call: the emulator reports
    its own TTFT, so a gateway's parking shows as waiting, not as a slow
    engine; without that report it equals ``sent_s``.
    """

    session_id: str
    call_index: int
    sent_s: float
    first_byte_s: float
    done_s: float
    status: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    outcome: str  # ok | shed | error
    tag: str = "base"
    admitted_s: float = math.nan
    decode_steps: int = 0
    itl_violations: int = 0
    #: Why the call failed ("connection refused", "HTTP 500", ...); empty when it did not.
    error: str = ""


@dataclass
class SessionRecord:
    """One session's progress, updated by its task as its calls finish (a driver-side accumulator)."""

    uid: int
    session_id: str
    tag: str
    warm: bool
    arrival_s: float
    n_calls: int
    reference_s: float
    first_admitted_s: float = math.nan
    #: When it completed (NaN unless it did).
    finished_s: float = math.nan
    #: When it left the run in any way (completed, shed, failed, terminated).
    ended_s: float = math.nan
    shed: bool = False
    calls_done: int = 0
    decode_steps: int = 0
    itl_violations: int = 0
    outcome: str = "running"  # running | completed | shed | failed | terminated
    #: A scenario's termination reached it; it ends before its next call.
    terminated: bool = False
    #: Its current call has had no answer yet.
    unanswered: bool = False


@dataclass
class ReplayLog:
    """Everything a replay measured so far; complete at any moment it is read."""

    calls: list[ReplayCall] = field(default_factory=list)
    sessions: list[SessionRecord] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    #: Scenario seconds the run lasted (set when it ends, however it ends).
    elapsed_s: float = 0.0
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    sessions: int
    completed: int
    shed: int
    failed: int
    calls: int
    ttft_p50_s: float
    ttft_p90_s: float
    hit_rate: float
    completed_per_h: float
    wall_s: float


@dataclass(frozen=True, slots=True)
class Termination:
    """At ``at_s`` the client gives up the sessions tagged ``tag`` (a scenario's ``terminate_tag``)."""

    at_s: float
    tag: str


class SessionConversation:
    """A session's deterministic conversation, grown call by call.

    Call 0 is one user message of the first prompt's size (the task text
    first). Each later call appends an assistant message the size of the
    previous answer and a user message (the tool result) the size of the
    prompt's growth, so every prompt extends the previous one by whole
    messages, as an agent's does.
    """

    def __init__(self, session: Session, seed: int, chars_per_token: float):
        self.rng = random.Random(f"{seed}/{session.session_id}")
        self.chars_per_token = chars_per_token
        self.task = (session.task_text or f"Task of {session.session_id}.").strip()
        #: The first prompt's leading tokens every session of the group shares (a
        #: common system prompt), sent as one system message of the same text for
        #: all of them, so an engine caches it once, as the simulator's key does.
        self.shared_tokens = session.shared_prefix_tokens if session.prefix_group else 0
        self.group = session.prefix_group
        self.messages: list[dict[str, str]] = []
        #: Each message as JSON, encoded once when it is added: a call's body is
        #: spliced from them, so a call costs the messages it adds, not its whole context.
        self._encoded: list[bytes] = []
        self.tokens = 0

    def _filler(self, tokens: int) -> str:
        return _words(self.rng, max(int(tokens * self.chars_per_token), 1))

    def next_prompt(self, prompt_tokens: int, previous_output_tokens: int) -> list[dict[str, str]]:
        """The messages of the next call, whose prompt is ``prompt_tokens``."""
        if not self.messages:
            shared = min(self.shared_tokens, prompt_tokens - 1)
            if shared > 0 and self.group is not None:
                self.messages.append({"role": "system",
                                      "content": _group_prompt(self.group, shared, self.chars_per_token)})
            own = prompt_tokens - max(shared, 0)
            chars = max(int(own * self.chars_per_token), 1)
            self.messages.append({"role": "user", "content": (self.task + "\n" + self._filler(own))[:chars]})
            self.tokens = prompt_tokens
        else:
            answer = max(previous_output_tokens, 1)
            result = max(prompt_tokens - self.tokens - answer, 1)
            self.messages += [{"role": "assistant", "content": self._filler(answer)},
                              {"role": "user", "content": self._filler(result)}]
            self.tokens += answer + result
        self._encoded += [json.dumps(m).encode() for m in self.messages[len(self._encoded):]]
        return list(self.messages)

    def messages_json(self) -> bytes:
        """The conversation so far as the JSON array a body carries (what ``json.dumps`` writes)."""
        return b"[" + b", ".join(self._encoded) + b"]"


def _words(rng: random.Random, chars: int) -> str:
    """``chars`` characters of filler words, drawn in batches sized to the text
    still missing (one draw per word was a sixth of the client's CPU at 30x)."""
    parts: list[str] = []
    size = 0
    while size < chars:
        part = " ".join(rng.choices(_WORDS, k=(chars - size) // _WORD_CHARS + 1))
        parts.append(part)
        size += len(part) + 1
    return " ".join(parts)[:chars]


@functools.lru_cache(maxsize=64)
def _group_prompt(group: str, tokens: int, chars_per_token: float) -> str:
    """The system prompt of a prefix group: the same text for every session of the group."""
    chars = max(int(tokens * chars_per_token), 1)
    return (f"System prompt of {group}.\n" + _words(random.Random(f"group/{group}"), chars))[:chars]


#: Where a call body's messages go: spliced in after the small fields are encoded.
_MESSAGES_SLOT = "\x00messages\x00"


def call_body(model: str, messages_json: bytes, max_tokens: int) -> bytes:
    """A streamed chat call's body, byte for byte what ``json.dumps`` of the whole request writes."""
    head = json.dumps({"model": model, "messages": _MESSAGES_SLOT, "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}, "temperature": 0}).encode()
    slot = json.dumps(_MESSAGES_SLOT).encode()
    at = head.index(b'"messages": ' + slot) + len(b'"messages": ')
    return head[:at] + messages_json + head[at + len(slot):]


def error_kind(exc: BaseException) -> str:
    """A failed call's cause in the words an operator searches for."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        cause = exc.os_error
        if isinstance(cause, ConnectionRefusedError) or "refused" in str(exc).lower():
            return "connection refused"
        return f"cannot connect ({cause.strerror or type(cause).__name__})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    return type(exc).__name__


def _emulator_timings(tail: bytes) -> Mapping[str, object] | None:
    """The emulator's simulated timings from the stream's tail, if it sent them."""
    for line in reversed(tail.split(b"\n")):
        line = line.strip()
        if line.startswith(b"data:") and b'"emulator"' in line:
            try:
                found = json.loads(line[5:].strip()).get("emulator")
            except (ValueError, UnicodeDecodeError, AttributeError):
                return None
            return found if isinstance(found, dict) else None
    return None


def stream_error_kind(tail: bytes) -> str | None:
    """The ``type`` of the last ``event: error`` in a stream's tail (as the
    gateway writes one: ``session_shed``, ``upstream_failed``, ...); ``""``
    when the event carries no readable type, None when there is no error event."""
    at = tail.rfind(b"event: error")
    if at < 0:
        return None
    for line in tail[at:].split(b"\n")[1:]:
        line = line.strip()
        if line.startswith(b"data:"):
            try:
                found = json.loads(line[5:].strip()).get("error", {}).get("type")
            except (ValueError, UnicodeDecodeError, AttributeError):
                return ""
            return found if isinstance(found, str) else ""
    return ""


class _Clock:
    """Scenario seconds since the start of the replay: wall time times the speed."""

    def __init__(self, speed: float):
        self.origin = time.monotonic()
        self.speed = speed

    def now(self) -> float:
        return (time.monotonic() - self.origin) * self.speed

    async def until(self, t_s: float) -> None:
        await asyncio.sleep(max(t_s - self.now(), 0.0) / self.speed)


async def _call(client: aiohttp.ClientSession, cfg: ReplaySettings, record: SessionRecord, index: int,
                messages_json: bytes, max_tokens: int, end: bool, clock: _Clock,
                log: ReplayLog) -> ReplayCall:
    sid, tag = record.session_id, record.tag
    body = call_body(cfg.model, messages_json, max_tokens)
    headers = {cfg.session_header: sid, cfg.end_header: "true" if end else "false",
               "Content-Type": "application/json"}
    sent = clock.now()
    first = last = math.nan
    violations = 0
    tail = b""
    try:
        async with client.post(cfg.target.rstrip("/") + "/v1/chat/completions", data=body, headers=headers) as r:
            if r.status != 200:
                await r.read()
                now = clock.now()
                outcome = "shed" if r.status == 503 else "error"
                return ReplayCall(sid, index, sent, now, now, r.status, 0, 0, 0, outcome, tag, now,
                                  error="" if outcome == "shed" else f"HTTP {r.status}")
            async for chunk in r.content.iter_any():
                now = clock.now()
                if math.isnan(first):
                    if chunk.lstrip().startswith(b":") and b"data:" not in chunk:
                        continue  # SSE comments only (the gateway's keep-alive while a call is held): no token yet
                    first = now
                    record.unanswered = False
                else:
                    tokens = chunk.count(b'"content"')
                    if tokens and (now - last) / tokens > cfg.itl_slo_s:
                        violations += tokens
                last = now
                tail = (tail + chunk)[-_TAIL_BYTES:]
            status = r.status
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        now = clock.now()
        return ReplayCall(sid, index, sent, now, now, 0, 0, 0, 0, "error", tag, now, error=error_kind(exc))
    done = clock.now()
    first = first if not math.isnan(first) else done
    usage = usage_from_stream_tail(tail)
    error = stream_error_kind(tail)
    # A session the gateway shed while its first call was held ends shed, as in the simulator.
    outcome = "ok" if error is None else "shed" if error == "session_shed" else "error"
    admitted = sent
    timings = _emulator_timings(tail)
    if timings is not None:
        ttft = timings.get("ttft_s")
        if isinstance(ttft, (int, float)) and math.isfinite(ttft):
            admitted = min(max(first - float(ttft), sent), first)
        speed = timings.get("speed")
        if isinstance(speed, (int, float)) and abs(speed - cfg.speed) > 1e-9 * cfg.speed:
            note = (f"the engine runs at --speed {speed:g} but the replay at {cfg.speed:g}; "
                    f"give both the same speed or the times mean nothing")
            if note not in log.notes:
                log.notes.append(note)
    completion = usage.completion_tokens if usage else 0
    steps = max(completion - 1, 0)
    return ReplayCall(sid, index, sent, first, done, status,
                      usage.prompt_tokens if usage else 0,
                      (usage.cached_tokens or 0) if usage else 0,
                      completion, outcome, tag, admitted, steps, min(violations, steps),
                      f"stream error ({error})" if outcome == "error" and error else
                      "stream error" if outcome == "error" else "")


def _end(record: SessionRecord, outcome: str, now: float) -> None:
    record.outcome = outcome
    record.ended_s = now
    record.shed = outcome == "shed"
    if outcome == "completed":
        record.finished_s = now


async def _session(client: aiohttp.ClientSession, cfg: ReplaySettings, arrival: SessionArrival, clock: _Clock,
                   log: ReplayLog, reference: Callable[[Sequence[Call]], float],
                   live: dict[int, tuple[SessionRecord, asyncio.Task[str]]]) -> str:
    await clock.until(arrival.arrival_s)
    session = arrival.session
    calls = session.calls[arrival.start_call:]
    record = SessionRecord(len(log.sessions), session.session_id, arrival.tag, arrival.start_call > 0 or
                           arrival.tag == "warm", clock.now(), len(session.calls), reference(calls))
    log.sessions.append(record)
    me = asyncio.current_task()
    assert me is not None
    live[record.uid] = (record, me)
    try:
        return await _calls(client, cfg, arrival, calls, clock, log, record)
    except asyncio.CancelledError:
        if not record.terminated:
            raise
        _end(record, "terminated", clock.now())
        return "terminated"
    finally:
        live.pop(record.uid, None)


async def _calls(client: aiohttp.ClientSession, cfg: ReplaySettings, arrival: SessionArrival,
                 calls: Sequence[Call], clock: _Clock, log: ReplayLog, record: SessionRecord) -> str:
    conversation = SessionConversation(arrival.session, cfg.seed, cfg.chars_per_token)
    previous_output = 0
    for k, call in enumerate(calls):
        if record.terminated:
            _end(record, "terminated", clock.now())
            return "terminated"
        conversation.next_prompt(max(int(call.prompt_tokens * cfg.token_scale), 1), previous_output)
        max_tokens = previous_output = max(int(round(call.output_tokens * cfg.token_scale)), 1)
        record.unanswered = True
        result = await _call(client, cfg, record, arrival.start_call + k, conversation.messages_json(), max_tokens,
                             k == len(calls) - 1, clock, log)
        record.unanswered = False
        if result.prompt_tokens > 0:  # the engine's own count: the next call grows from it, template included
            conversation.tokens = result.prompt_tokens
        log.calls.append(result)
        if result.error:
            log.errors[result.error] += 1
        if result.outcome != "ok":
            _end(record, "shed" if result.outcome == "shed" else "failed", result.done_s)
            return record.outcome
        if math.isnan(record.first_admitted_s):
            record.first_admitted_s = result.admitted_s
        record.calls_done += 1
        record.decode_steps += result.decode_steps
        record.itl_violations += result.itl_violations
        if k < len(calls) - 1:
            await asyncio.sleep(call.tool_gap_s * cfg.time_scale / cfg.speed)
    _end(record, "completed", clock.now())
    return "completed"


async def _terminate(clock: _Clock, stop: Termination,
                     live: dict[int, tuple[SessionRecord, asyncio.Task[str]]]) -> None:
    """At the time, the tag's running sessions stop: each ends before its next
    call, and one whose call has had no answer yet is hung up on (the
    simulator withdraws calls whose prefill has not started; a gateway drops
    a parked call whose client left). Later arrivals of the tag run."""
    await clock.until(stop.at_s)
    for record, task in list(live.values()):
        if record.tag == stop.tag and record.outcome == "running":
            record.terminated = True
            if record.unanswered:
                task.cancel()


async def replay(sessions: list[SessionArrival], cfg: ReplaySettings,
                 progress: Callable[[int], None] | None = None, log: ReplayLog | None = None,
                 reference: Callable[[Sequence[Call]], float] | None = None,
                 terminations: Sequence[Termination] = ()) -> tuple[list[ReplayCall], ReplaySummary]:
    """Replay ``sessions`` against ``cfg.target``; returns every call and a summary.

    ``log`` (filled as calls finish) keeps what was measured if the run is
    cancelled; ``reference`` gives each session's unloaded time (NaN without
    it); the run stops at ``cfg.stop_after_s`` with unfinished sessions left
    running, as a simulated run ends.
    """
    log = log if log is not None else ReplayLog()
    reference = reference or (lambda calls: math.nan)
    clock = _Clock(cfg.speed)
    live: dict[int, tuple[SessionRecord, asyncio.Task[str]]] = {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=cfg.call_timeout_s)
    ends: list[str] = []
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as client:
            pending = {asyncio.create_task(_session(client, cfg, a, clock, log, reference, live))
                       for a in sessions}
            stoppers = [asyncio.create_task(_terminate(clock, t, live)) for t in terminations]
            deadline = None if cfg.stop_after_s is None else cfg.stop_after_s / cfg.speed
            try:
                while pending:
                    left = None if deadline is None else deadline - (time.monotonic() - clock.origin)
                    if left is not None and left <= 0:
                        break
                    done, pending = await asyncio.wait(pending, timeout=left,
                                                       return_when=asyncio.FIRST_COMPLETED)
                    ends += [task.result() for task in done]
                    if progress is not None:
                        progress(len(ends))
            finally:
                for task in [*pending, *stoppers]:
                    task.cancel()
                await asyncio.gather(*pending, *stoppers, return_exceptions=True)
    finally:
        now = clock.now()
        if cfg.stop_after_s is not None:
            # Every session ended early: the rest of the window holds no event, so the run lasted it all.
            now = cfg.stop_after_s if len(ends) == len(sessions) else min(now, cfg.stop_after_s)
        log.elapsed_s = now
    wall = log.elapsed_s / cfg.speed
    ok = [r for r in log.calls if r.outcome == "ok"]
    prompt = sum(r.prompt_tokens for r in ok)
    first_calls = np.array([r.first_byte_s - r.sent_s for r in ok], dtype=float)
    summary = ReplaySummary(
        sessions=len(sessions), completed=ends.count("completed"), shed=ends.count("shed"),
        failed=ends.count("failed"), calls=len(log.calls),
        ttft_p50_s=nan_percentile(first_calls, 50), ttft_p90_s=nan_percentile(first_calls, 90),
        hit_rate=sum(r.cached_tokens for r in ok) / prompt if prompt else math.nan,
        completed_per_h=ends.count("completed") * 3600.0 / wall if wall > 0 else math.nan, wall_s=wall)
    return list(log.calls), summary


# ------------------------------------------------------------------ tables
def calls_table(log: ReplayLog, uids: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The calls table of docs/metrics.md, one row per call sent and answered
    (a failed or shed call has NaN first token and finish: it never had them).
    The engine's prefill start is not visible to a client (NaN), and host-tier
    hits are counted in ``cached_tokens`` as engines report them."""
    rows = log.calls
    ok = np.array([r.outcome == "ok" for r in rows], dtype=bool)

    def times(name: str) -> np.ndarray:
        values = np.array([getattr(r, name) for r in rows], dtype=float)
        return np.where(ok, values, np.nan)

    prompt = np.array([r.prompt_tokens for r in rows], dtype=np.int64)
    cached = np.array([r.cached_tokens for r in rows], dtype=np.int64)
    return REPLAY_CALLS.build({
        "session_uid": [uids[r.session_id] for r in rows],
        "tag": [r.tag for r in rows],
        "call_index": [r.call_index for r in rows],
        "issued_s": [r.sent_s for r in rows],
        "admitted_s": times("admitted_s"),
        "prefill_start_s": np.full(len(rows), np.nan),
        "first_token_s": times("first_byte_s"),
        "finished_s": times("done_s"),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "loaded_tokens": np.zeros(len(rows), dtype=np.int64),
        "uncached_tokens": np.maximum(prompt - cached, 0),
        "output_tokens": [r.completion_tokens for r in rows],
        "decode_steps": [r.decode_steps for r in rows],
        "itl_violations": [r.itl_violations for r in rows],
        "retractions": np.zeros(len(rows), dtype=np.int64),
        "status": [r.status for r in rows],
        "outcome": [r.outcome for r in rows],
        "error": [r.error for r in rows],
    })


def sessions_table(log: ReplayLog) -> dict[str, np.ndarray]:
    """The sessions table of docs/metrics.md, one row per session that arrived."""
    rows = log.sessions
    return REPLAY_SESSIONS.build({
        "session_uid": [s.uid for s in rows],
        "session_id": [s.session_id for s in rows],
        "tag": [s.tag for s in rows],
        "warm": [s.warm for s in rows],
        "arrival_s": [s.arrival_s for s in rows],
        "first_admitted_s": [s.first_admitted_s for s in rows],
        "finished_s": [s.finished_s for s in rows],
        "shed": [s.shed for s in rows],
        "n_calls": [s.n_calls for s in rows],
        "calls_done": [s.calls_done for s in rows],
        "reference_s": [s.reference_s for s in rows],
        "decode_steps": [s.decode_steps for s in rows],
        "itl_violations": [s.itl_violations for s in rows],
        "outcome": [s.outcome for s in rows],
        "ended_s": [s.ended_s for s in rows],
    })


def timeseries_table(log: ReplayLog, duration_s: float, capacity_tokens: float = math.nan) -> dict[str, np.ndarray]:
    """The per-minute table of docs/metrics.md as a client sees it.

    Tokens and TTFTs count at a call's first token (when its prefill ended);
    a session is active from its first admission until it ends, and
    *waiting* (the ``parked_sessions`` column) from its arrival until then;
    the working set is the context of the active sessions' last answered
    calls. What only the engine knows (its queues, decode memory) is NaN.
    """
    n = max(int(math.ceil(duration_s / SECONDS_PER_MINUTE - 1e-9)), 0)
    ends = (np.arange(n) + 1) * SECONDS_PER_MINUTE
    ok = [r for r in log.calls if r.outcome == "ok"]
    first = np.array([r.first_byte_s for r in ok], dtype=float)
    done = np.array([r.done_s for r in ok], dtype=float)
    ttft = np.array([r.first_byte_s - r.admitted_s for r in ok], dtype=float)
    prompt = np.array([r.prompt_tokens for r in ok], dtype=float)
    cached = np.array([r.cached_tokens for r in ok], dtype=float)
    context = prompt + np.array([r.completion_tokens for r in ok], dtype=float)
    sids = [r.session_id for r in ok]
    s = log.sessions
    arrival = np.array([x.arrival_s for x in s], dtype=float)
    admitted = np.array([x.first_admitted_s for x in s], dtype=float)
    ended = np.array([x.ended_s for x in s], dtype=float)
    completed = np.array([x.outcome == "completed" for x in s], dtype=bool)
    tags = np.array([x.tag for x in s], dtype=object)
    index = {x.session_id: i for i, x in enumerate(s)}
    call_session = np.array([index[sid] for sid in sids], dtype=np.int64)
    nan = float("nan")
    cols: dict[str, list[float]] = {name: [] for name in (
        "arrivals", "sessions_completed", "calls_completed", "active_sessions", "parked_sessions",
        "working_set_tokens", "cache_capacity_tokens", "prompt_tokens", "cached_tokens", "loaded_tokens",
        "uncached_tokens", "ttft_p50_s", "first_call_wait_p50_s")}
    active_tags: dict[str, list[float]] = {f"{ACTIVE_TAG_PREFIX}{t}": [] for t in sorted(set(tags.tolist()))}
    for end in ends:
        start = end - SECONDS_PER_MINUTE
        here = (first >= start) & (first < end)
        gone = np.isfinite(ended) & (ended <= end)
        active = np.isfinite(admitted) & (admitted <= end) & ~gone
        waiting = (arrival <= end) & ~active & ~gone
        answered = done <= end
        last: dict[int, float] = {}
        for i in np.flatnonzero(answered & active[call_session]):
            last[int(call_session[i])] = context[i]
        admitted_here = (admitted >= start) & (admitted < end)
        cols["arrivals"].append(float(((arrival >= start) & (arrival < end)).sum()))
        cols["sessions_completed"].append(float((completed & (ended >= start) & (ended < end)).sum()))
        cols["calls_completed"].append(float(((done >= start) & (done < end)).sum()))
        cols["active_sessions"].append(float(active.sum()))
        cols["parked_sessions"].append(float(waiting.sum()))
        cols["working_set_tokens"].append(float(sum(last.values())))
        cols["cache_capacity_tokens"].append(float(capacity_tokens))
        cols["prompt_tokens"].append(float(prompt[here].sum()))
        cols["cached_tokens"].append(float(cached[here].sum()))
        cols["loaded_tokens"].append(0.0)
        cols["uncached_tokens"].append(float(np.maximum(prompt[here] - cached[here], 0).sum()))
        cols["ttft_p50_s"].append(float(np.median(ttft[here])) if here.any() else nan)
        waits = (admitted - arrival)[admitted_here]
        cols["first_call_wait_p50_s"].append(float(np.median(waits)) if waits.size else nan)
        for name in active_tags:
            active_tags[name].append(float((active & (tags == name[len(ACTIVE_TAG_PREFIX):])).sum()))
    table: dict[str, Iterable[float]] = {"minute": np.arange(n, dtype=np.int64), **cols}
    table.update({name: np.full(n, np.nan) for name in ENGINE_ONLY_TIMESERIES})
    table.update(active_tags)
    return TIMESERIES.build(table)


def run_tables(log: ReplayLog, duration_s: float, capacity_tokens: float = math.nan
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(calls, sessions, timeseries)`` of a replay, in the simulator's columns."""
    uids = {s.session_id: s.uid for s in log.sessions}
    return calls_table(log, uids), sessions_table(log), timeseries_table(log, duration_s, capacity_tokens)


# --------------------------------------------------------------- the target
async def check_target(target: str, timeout_s: float = 5.0) -> None:
    """Refuse a target nothing listens on, before any session is sent.

    Any HTTP answer (even 404) means something is there; only a failure to
    connect stops the replay, with the cause in plain words.
    """
    parts = urlsplit(target)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as client:
            async with client.get(target.rstrip("/") + "/v1/models") as r:
                await r.read()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise BasinInputError(f"--target {target}: {error_kind(exc)} at {parts.hostname}:{parts.port or 80}; "
                              "start the gateway or engine there first, or point --target at it") from None


#: The two probe texts' lengths: long enough that a chat template's few tokens
#: and a word cut at the end are small beside their difference.
_PROBE_CHARS = (1_000, 8_000)


async def measure_chars_per_token(cfg: ReplaySettings, timeout_s: float = 120.0) -> float:
    """Characters of the replay's own filler text per token, as the target counts them.

    The replay sizes each prompt as tokens x ``chars_per_token``; a tokenizer
    that packs the filler words more or less densely than assumed would get
    prompts of another size than the workload's (a 270-word-vocabulary BPE
    counted 26% fewer tokens than 4.0 characters a token gives). Two one-token
    calls of the same filler text at two lengths, each as a session of its own
    that ends at once; the slope of their counted prompt tokens leaves the chat
    template out.
    """
    counted = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as client:
        for i, chars in enumerate(_PROBE_CHARS):
            text = _words(random.Random(f"probe/{cfg.seed}/{i}"), chars)
            body = call_body(cfg.model, json.dumps([{"role": "user", "content": text}]).encode(), 1)
            headers = {"Content-Type": "application/json", cfg.session_header: f"replay-probe-{cfg.seed}-{i}",
                       cfg.end_header: "true"}
            try:
                async with client.post(cfg.target.rstrip("/") + "/v1/chat/completions", data=body,
                                       headers=headers) as resp:
                    answer = await resp.read()
                    if resp.status != 200:
                        raise BasinInputError(f"--target {cfg.target}: a probe call to count the filler text's "
                                              f"tokens got HTTP {resp.status}: {answer[:200]!r}; give "
                                              "--chars-per-token to skip the probe")
                usage = usage_from_stream_tail(answer[-_TAIL_BYTES:])
                if usage is None or not usage.prompt_tokens:
                    raise BasinInputError(f"--target {cfg.target}: its answer to a probe call carries no "
                                          "usage.prompt_tokens; give --chars-per-token to skip the probe")
                counted.append(int(usage.prompt_tokens))
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise BasinInputError(f"--target {cfg.target}: a probe call failed ({error_kind(exc)}); give "
                                      "--chars-per-token to skip the probe") from None
    tokens = counted[1] - counted[0]
    if tokens <= 0:
        raise BasinInputError(f"--target {cfg.target}: {_PROBE_CHARS[1]:,} characters counted {counted[1]} tokens "
                              f"and {_PROBE_CHARS[0]:,} counted {counted[0]}; give --chars-per-token")
    return (_PROBE_CHARS[1] - _PROBE_CHARS[0]) / tokens


# ------------------------------------------------------------- scheduling
def schedule_sessions(workload_spec: str, cfg: ReplaySettings, max_sessions: int | None = None) -> list[SessionArrival]:
    """The sessions and their arrival times: the workload's sessions drawn onto
    a seeded Poisson schedule in wall-clock time (``time_scale`` scales tool
    gaps only)."""
    workload = resolve_workload(workload_spec, seed=cfg.seed)
    arrivals = draw_arrivals(workload, PoissonSchedule(cfg.rate_per_min), cfg.duration_s, cfg.seed)
    return arrivals if max_sessions is None else arrivals[:max_sessions]


def write_calls(records: list[ReplayCall], path: Path) -> Path:
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([asdict(r) for r in records]), path)
    return path
