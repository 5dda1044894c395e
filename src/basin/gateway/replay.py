"""``basin replay``: agent sessions from a workload, replayed for real against
an OpenAI-compatible endpoint (an engine, or the gateway in front of it).

Each session arrives on a seeded Poisson schedule and makes its calls in
order, waiting its tool gap after each answer, so the load is closed-loop the
way agents are. Traces carry token counts, not text, so each session gets a
deterministic conversation of the trace's sizes (its task text first) that
grows by whole messages: every prompt extends the previous one and the
engine's prefix cache sees the reuse the trace has (the answer the engine
really gave is replaced by text of its size, so its own tokens are not
reused). ``token_scale`` and
``time_scale`` shrink sessions to what a small test engine holds.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import numpy as np

from basin.errors import BasinInputError
from basin.gateway.usage import usage_from_stream_tail
from basin.metrics._tables import nan_percentile
from basin.workload.arrivals import PoissonSchedule, SessionArrival, draw_arrivals
from basin.workload.records import Session

_WORDS = ("agent tool file patch test build error trace module function value index cache request "
          "token branch commit review parser config server client thread queue memory buffer").split()


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

    def __post_init__(self) -> None:
        if not self.target.startswith(("http://", "https://")):
            raise BasinInputError(f"field 'target': expected an http(s) URL such as http://127.0.0.1:8400, "
                                  f"got {self.target!r}")
        for name in ("rate_per_min", "duration_s", "token_scale", "chars_per_token", "call_timeout_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise BasinInputError(f"field '{name}': expected a number > 0, got {value!r}")
        if not math.isfinite(self.time_scale) or self.time_scale < 0:
            raise BasinInputError(f"field 'time_scale': expected a number >= 0, got {self.time_scale!r}")


@dataclass(frozen=True, slots=True)
class ReplayCall:
    """One call as the client saw it (times in seconds from the replay's start)."""

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
        self.messages: list[dict[str, str]] = []
        self.tokens = 0

    def _filler(self, tokens: int) -> str:
        chars = max(int(tokens * self.chars_per_token), 1)
        words: list[str] = []
        size = 0
        while size < chars:
            words.append(self.rng.choice(_WORDS))
            size += len(words[-1]) + 1
        return " ".join(words)[:chars]

    def next_prompt(self, prompt_tokens: int, previous_output_tokens: int) -> list[dict[str, str]]:
        """The messages of the next call, whose prompt is ``prompt_tokens``."""
        if not self.messages:
            chars = max(int(prompt_tokens * self.chars_per_token), 1)
            self.messages.append({"role": "user", "content": (self.task + "\n" + self._filler(prompt_tokens))[:chars]})
            self.tokens = prompt_tokens
        else:
            answer = max(previous_output_tokens, 1)
            result = max(prompt_tokens - self.tokens - answer, 1)
            self.messages += [{"role": "assistant", "content": self._filler(answer)},
                              {"role": "user", "content": self._filler(result)}]
            self.tokens += answer + result
        return list(self.messages)


async def _call(client: aiohttp.ClientSession, cfg: ReplaySettings, sid: str, index: int,
                messages: list[dict[str, str]], max_tokens: int, end: bool, origin: float) -> ReplayCall:
    body = {"model": cfg.model, "messages": messages, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
    headers = {cfg.session_header: sid, cfg.end_header: "true" if end else "false"}
    sent = time.monotonic() - origin
    first = math.nan
    tail = b""
    try:
        async with client.post(cfg.target.rstrip("/") + "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status != 200:
                await r.read()
                now = time.monotonic() - origin
                outcome = "shed" if r.status == 503 else "error"
                return ReplayCall(sid, index, sent, now, now, r.status, 0, 0, 0, outcome)
            async for chunk in r.content.iter_any():
                if math.isnan(first):
                    first = time.monotonic() - origin
                tail = (tail + chunk)[-16384:]
            status = r.status
    except (TimeoutError, aiohttp.ClientError, OSError):
        now = time.monotonic() - origin
        return ReplayCall(sid, index, sent, now, now, 0, 0, 0, 0, "error")
    done = time.monotonic() - origin
    usage = usage_from_stream_tail(tail)
    broken = b"event: error" in tail
    return ReplayCall(sid, index, sent, first if not math.isnan(first) else done, done, status,
                      usage.prompt_tokens if usage else 0,
                      (usage.cached_tokens or 0) if usage else 0,
                      usage.completion_tokens if usage else 0, "error" if broken else "ok")


async def _session(client: aiohttp.ClientSession, cfg: ReplaySettings, arrival: SessionArrival, origin: float,
                   records: list[ReplayCall]) -> str:
    await asyncio.sleep(max(arrival.arrival_s - (time.monotonic() - origin), 0.0))
    session = arrival.session
    conversation = SessionConversation(session, cfg.seed, cfg.chars_per_token)
    calls = session.calls[arrival.start_call:]
    previous_output = 0
    for k, call in enumerate(calls):
        messages = conversation.next_prompt(max(int(call.prompt_tokens * cfg.token_scale), 1), previous_output)
        max_tokens = previous_output = max(int(round(call.output_tokens * cfg.token_scale)), 1)
        record = await _call(client, cfg, session.session_id, k, messages, max_tokens, k == len(calls) - 1,
                             origin)
        records.append(record)
        if record.outcome != "ok":
            return "shed" if record.outcome == "shed" else "failed"
        if k < len(calls) - 1:
            await asyncio.sleep(call.tool_gap_s * cfg.time_scale)
    return "completed"


async def replay(sessions: list[SessionArrival], cfg: ReplaySettings,
                 progress: Callable[[int], None] | None = None) -> tuple[list[ReplayCall], ReplaySummary]:
    """Replay ``sessions`` against ``cfg.target``; returns every call and a summary."""
    records: list[ReplayCall] = []
    origin = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=cfg.call_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as client:
        tasks = [asyncio.create_task(_session(client, cfg, a, origin, records)) for a in sessions]
        ends: list[str] = []
        for task in asyncio.as_completed(tasks):
            ends.append(await task)
            if progress is not None:
                progress(len(ends))
    wall = time.monotonic() - origin
    ok = [r for r in records if r.outcome == "ok"]
    prompt = sum(r.prompt_tokens for r in ok)
    first_calls = np.array([r.first_byte_s - r.sent_s for r in ok], dtype=float)
    summary = ReplaySummary(
        sessions=len(sessions), completed=ends.count("completed"), shed=ends.count("shed"),
        failed=ends.count("failed"), calls=len(records),
        ttft_p50_s=nan_percentile(first_calls, 50), ttft_p90_s=nan_percentile(first_calls, 90),
        hit_rate=sum(r.cached_tokens for r in ok) / prompt if prompt else math.nan,
        completed_per_h=ends.count("completed") * 3600.0 / wall if wall > 0 else math.nan, wall_s=wall)
    return records, summary


def schedule_sessions(workload_spec: str, cfg: ReplaySettings, max_sessions: int | None = None) -> list[SessionArrival]:
    """The sessions and their arrival times: the workload's sessions drawn onto
    a seeded Poisson schedule in wall-clock time (``time_scale`` scales tool
    gaps only)."""
    from basin.workload.presets import resolve_workload

    workload = resolve_workload(workload_spec, seed=cfg.seed)
    arrivals = draw_arrivals(workload, PoissonSchedule(cfg.rate_per_min), cfg.duration_s, cfg.seed)
    return arrivals if max_sessions is None else arrivals[:max_sessions]


def write_calls(records: list[ReplayCall], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([asdict(r) for r in records]), path)
    return path
