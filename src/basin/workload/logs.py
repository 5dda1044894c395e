"""Real request logs as workloads, each session keeping its own start time.

Serving logs record requests, not sessions. Every importer here reads one log
format into :class:`LoggedRequest` records (times in seconds since the epoch,
token counts from the provider's or engine's own usage report) and hands them
to :func:`build_workload`, which applies the one set of rules stated in
``docs/workloads.md`` section 3.5:

* requests are grouped into sessions by the format's session key (each
  format names it; a request without one becomes a session of its own, or is
  chained by conversation prefix where the log holds the messages);
* a session's calls are ordered by request start; the tool gap of a call is
  the next request's start minus this response's end, so a session's calls
  may not overlap (that is an error, not clipped to zero);
* the reused prefix of call k >= 1 is, by default, the whole previous context
  (prompt plus output, capped at this prompt): the agent loop resends the
  conversation. ``reuse="cached"`` uses the reported cached tokens instead
  (what the provider's cache actually served, capped the same way);
* each session's first request start, as an offset from the log's earliest
  request, goes under ``SESSION_START_KEY`` so ``arrivals.from_workload``
  replays the log's own arrival shape.

Bad input is a :class:`~basin.errors.BasinInputError` naming the file, the line
(or span), the field and the fix; nothing is dropped silently. Spans and log
lines that are not LLM calls at all (an HTTP span, a startup message) are
skipped and counted in ``Workload.extra["skipped_records"]``.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from basin.errors import BasinInputError, where
from basin.workload.io import SESSION_START_KEY
from basin.workload.records import Call, RecordError, Session, Workload

#: Log formats :func:`load_request_log` reads.
LOG_FORMATS = ("openai", "otel", "litellm", "vllm", "sglang")
Reuse = Literal["append", "cached"]


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One LLM request as a log reports it, before sessions exist."""

    #: Where it was read, e.g. ``log.jsonl line 4``; error messages start with it.
    location: str
    request_id: str
    #: The format's session key, or None when the record has none.
    session_key: str | None
    start_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    #: Prompt tokens the provider served from its cache, when reported.
    cached_tokens: int | None = None
    #: Chain keys (see :func:`build_workload`): this request continues the
    #: session whose tail key equals ``parent_key``; ``tail_keys`` are the
    #: keys a later request of the same conversation would carry.
    parent_keys: tuple[str, ...] = ()
    tail_keys: tuple[str, ...] = ()


# --------------------------------------------------------------------------
# Shared field checks


def _fail(location: str, field: str, message: str) -> BasinInputError:
    return BasinInputError(f"{location}, field '{field}': {message}")


def _count(location: str, field: str, value: object) -> int:
    # OTLP JSON writes int64 values as strings, so digit strings are accepted.
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(location, field, f"expected a whole number of tokens >= 0, got {value!r}")
    return value


def _timestamp(location: str, field: str, value: object) -> float:
    """Seconds since the epoch from an ISO 8601 string or a number of seconds.

    A time without a zone is read as UTC, the same for every record, so only
    differences matter.
    """
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d*)?", value.strip()):
        value = float(value)
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value.strip())
        except ValueError:
            raise _fail(location, field, f"expected an ISO 8601 time or seconds since the epoch, "
                                         f"got {value!r}") from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        return stamp.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _fail(location, field, f"expected an ISO 8601 time or seconds since the epoch, got {value!r}")
    return float(value)


def _check_times(location: str, start_s: float, end_s: float, end_field: str) -> None:
    if end_s < start_s:
        raise _fail(location, end_field, f"ends {start_s - end_s:.3f} s before it starts; "
                                         f"the log's start and end times are swapped or corrupt")


def _optional_text(location: str, field: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise _fail(location, field, f"expected a string id, got {value!r}")
    return value


def _open_text(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered non-blank lines of a text or gzip'd text file."""
    if not path.is_file():
        raise BasinInputError(f"{path}: no such file")
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for line_no, text in enumerate(fh, 1):
                if text.strip():
                    yield line_no, text
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise BasinInputError(f"{path}: not a readable UTF-8 text file ({exc})") from exc


def _json_objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Objects of a JSONL file, or of a file holding one JSON array or object."""
    lines = list(_open_text(path))
    if not lines:
        raise BasinInputError(f"{path}: the file is empty")
    if lines[0][1].lstrip().startswith("["):
        text = "".join(t for _, t in lines)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BasinInputError(f"{where(path, line=exc.lineno)}: malformed JSON ({exc.msg})") from exc
        for i, obj in enumerate(data):
            loc = f"{path} record {i}"
            if not isinstance(obj, dict):
                raise BasinInputError(f"{loc}: expected a JSON object, got {type(obj).__name__}")
            yield loc, obj
        return
    for line_no, text in lines:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BasinInputError(
                f"{where(path, line=line_no)}: malformed JSON ({exc.msg} at column {exc.colno}); "
                f"expected one JSON object per line") from exc
        if not isinstance(obj, dict):
            raise BasinInputError(f"{where(path, line=line_no)}: expected a JSON object, got {type(obj).__name__}")
        yield where(path, line=line_no), obj


# --------------------------------------------------------------------------
# Building sessions


def build_workload(requests: Iterable[LoggedRequest], name: str, path: Path, fmt: str,
                   reuse: Reuse = "append", skipped: int = 0, counts: dict[str, int] | None = None) -> Workload:
    """Group logged requests into sessions (module docstring has the rules); ``counts``
    are the format's own tallies of what it set aside, kept in ``Workload.extra``."""
    ordered = sorted(requests, key=lambda r: (r.start_s, r.end_s))
    if not ordered:
        raise BasinInputError(f"{path}: no LLM requests with token usage found in this {fmt} log")
    groups: dict[str, list[LoggedRequest]] = {}
    tails: dict[str, str] = {}
    for n, r in enumerate(ordered):
        key = r.session_key
        if key is None:
            key = next((tails[p] for p in r.parent_keys if p in tails), None)
        if key is None:
            key = f"{fmt}-{r.request_id}" if r.request_id else f"{fmt}-{n:06d}"
            while key in groups:
                key += "+"
        groups.setdefault(key, []).append(r)
        for t in r.tail_keys:
            tails[t] = key
    origin_s = ordered[0].start_s
    sessions: list[Session] = []
    starts: dict[str, float] = {}
    for key, reqs in groups.items():
        sessions.append(_session(key, reqs, reuse, path.name))
        starts[key] = reqs[0].start_s - origin_s
    return Workload(
        name=name, sessions=tuple(sessions), origin=str(path),
        description=f"{fmt} request log {path.name}: {len(ordered)} requests in {len(sessions)} sessions, "
                    f"at the log's own arrival times",
        extra={SESSION_START_KEY: starts, "log_format": fmt, "reuse_rule": reuse, "skipped_records": skipped,
               **(counts or {})},
    )


def _session(key: str, reqs: list[LoggedRequest], reuse: Reuse, source: str) -> Session:
    calls: list[Call] = []
    for k, r in enumerate(reqs):
        if k == 0:
            reused = 0  # nothing earlier in the session; a cross-session hit is not reuse of this session
        else:
            prev, prev_req = calls[-1], reqs[k - 1]
            gap = r.start_s - prev_req.end_s
            if gap < 0:
                raise BasinInputError(
                    f"{r.location}: starts {-gap:.3f} s before the previous call of session '{key}' "
                    f"({prev_req.location}) ended; a session's calls must not overlap. Give parallel "
                    f"calls different session ids, or fix the log's times")
            calls[-1] = Call(prev.prompt_tokens, prev.new_tokens, prev.output_tokens, gap)
            if reuse == "cached":
                if r.cached_tokens is None:
                    raise _fail(r.location, "cached_tokens",
                                "missing, and the reuse rule 'cached' needs it; use the 'append' rule")
                reused = min(r.cached_tokens, prev.context_tokens, r.prompt_tokens)
            else:
                reused = min(prev.context_tokens, r.prompt_tokens)
        try:
            calls.append(Call(r.prompt_tokens, r.prompt_tokens - reused, r.output_tokens))
        except RecordError as exc:
            raise _fail(r.location, exc.field, exc.message) from exc
    return Session(session_id=key, calls=tuple(calls), source=source)


# --------------------------------------------------------------------------
# OpenAI-format request/response logs


def _digest(parts: Iterable[object]) -> list[str]:
    """Rolling hashes of every prefix of ``parts`` (JSON-canonical)."""
    h = hashlib.blake2b(digest_size=16)
    out = []
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\x1e")
        out.append(h.copy().hexdigest())
    return out


def _message_key(message: object) -> object:
    # Compare what the model saw, not client-side extras such as a message id.
    if isinstance(message, dict):
        return {k: message.get(k) for k in ("role", "content", "tool_calls", "tool_call_id", "name")
                if message.get(k) is not None}
    return message


def read_openai_log(path: str | Path, reuse: Reuse = "append") -> Workload:
    """An OpenAI-format request/response log (JSONL, one exchange a line).

    Each line holds ``request`` (the Chat Completions body: ``messages``,
    optionally ``user`` and ``metadata``), ``response`` (with ``usage``:
    ``prompt_tokens``, ``completion_tokens``, optionally
    ``prompt_tokens_details.cached_tokens``) and the times ``start_time`` and
    ``end_time`` (ISO 8601 or epoch seconds). Without them the response's
    ``created`` is both, so tool gaps then include the service time.

    Session key: top-level ``session_id``, else ``request.metadata.session_id``
    or ``conversation_id``. Without one, a request whose ``messages`` begin
    with an earlier request's messages plus its reply continues that
    request's session (the agent loop resends the conversation).
    """
    path = Path(path)
    requests = [_openai_request(loc, obj, n) for n, (loc, obj) in enumerate(_json_objects(path))]
    return build_workload(requests, path.name.split(".")[0], path, "openai", reuse)


def _openai_request(loc: str, obj: dict[str, Any], n: int) -> LoggedRequest:
    request, response = obj.get("request"), obj.get("response")
    if not isinstance(request, dict):
        raise _fail(loc, "request", "missing or not an object; each line needs the request body under 'request'")
    if not isinstance(response, dict):
        raise _fail(loc, "response", "missing or not an object; each line needs the response under 'response'")
    usage = response.get("usage")
    if not isinstance(usage, dict):
        raise _fail(loc, "response.usage", "missing; log responses with usage (for streamed calls set "
                                           "stream_options.include_usage), or this call's tokens are unknown")
    for field in ("prompt_tokens", "completion_tokens"):
        if field not in usage:
            raise _fail(loc, f"response.usage.{field}", "missing")
    prompt = _count(loc, "response.usage.prompt_tokens", usage["prompt_tokens"])
    output = _count(loc, "response.usage.completion_tokens", usage["completion_tokens"])
    details = usage.get("prompt_tokens_details")
    cached = None
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        cached = _count(loc, "response.usage.prompt_tokens_details.cached_tokens", details["cached_tokens"])
    if "start_time" in obj:
        start = _timestamp(loc, "start_time", obj["start_time"])
        end = _timestamp(loc, "end_time", obj["end_time"]) if "end_time" in obj else start
    elif "created" in response:
        start = end = _timestamp(loc, "response.created", response["created"])
    else:
        raise _fail(loc, "start_time", "missing (and no response.created); the log needs request times")
    _check_times(loc, start, end, "end_time")
    raw_metadata = request.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    key = _optional_text(loc, "session_id", obj.get("session_id"))
    for field in ("session_id", "conversation_id"):
        if key is None:
            key = _optional_text(loc, f"request.metadata.{field}", metadata.get(field))
    parents: tuple[str, ...] = ()
    tails: tuple[str, ...] = ()
    messages = request.get("messages")
    if key is None and isinstance(messages, list) and messages:
        prefixes = _digest(_message_key(m) for m in messages)
        # Longest earlier conversation first: a request continues the latest turn it extends.
        parents = tuple(reversed(prefixes[:-1]))
        tails = (prefixes[-1],)
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("message"):
            reply = _digest([*(_message_key(m) for m in messages), _message_key(choices[0]["message"])])[-1]
            tails = (reply, prefixes[-1])
    rid = _optional_text(loc, "response.id", response.get("id")) or f"{n:06d}"
    return LoggedRequest(loc, rid, key, start, end, prompt, output, cached, parents, tails)


# --------------------------------------------------------------------------
# OpenTelemetry GenAI spans (OTLP JSON); vLLM's request spans are the same

_OTEL_INPUT = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
_OTEL_OUTPUT = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
#: Operations that are model calls: a span naming one must report usage.
_OTEL_INFERENCE_OPS = ("chat", "text_completion", "generate_content")


def _otel_value(value: object) -> object:
    """The Python value of an OTLP JSON ``AnyValue``."""
    if not isinstance(value, dict):
        return None
    for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if kind in value:
            return value[kind]
    return None


def _otel_attributes(loc: str, raw: object) -> dict[str, object]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise _fail(loc, "attributes", "expected a list of {key, value} objects (OTLP JSON)")
    return {a["key"]: _otel_value(a.get("value")) for a in raw if isinstance(a, dict) and "key" in a}


def _otel_spans(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every span of an OTLP JSON export: one request object, or one per line (the collector's file exporter)."""
    lines = list(_open_text(path))
    if not lines:
        raise BasinInputError(f"{path}: the file is empty")
    try:
        docs: list[tuple[int | None, Any]] = [(None, json.loads("".join(t for _, t in lines)))]
    except json.JSONDecodeError:
        docs = []
        for line_no, text in lines:
            try:
                docs.append((line_no, json.loads(text)))
            except json.JSONDecodeError as exc:
                raise BasinInputError(f"{where(path, line=line_no)}: malformed JSON ({exc.msg}); expected an "
                                      f"OTLP JSON export (one object, or one per line)") from exc
    for doc_line, doc in docs:
        base = where(path, line=doc_line)
        if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
            raise _fail(base, "resourceSpans", "missing; expected an OTLP JSON trace export "
                                               "({\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [...]}]}]})")
        for i, rs in enumerate(doc["resourceSpans"]):
            for j, ss in enumerate(rs.get("scopeSpans") or [] if isinstance(rs, dict) else []):
                for k, span in enumerate(ss.get("spans") or [] if isinstance(ss, dict) else []):
                    loc = f"{base} resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                    if not isinstance(span, dict):
                        raise BasinInputError(f"{loc}: expected a span object")
                    yield loc, span


def read_otel_log(path: str | Path, reuse: Reuse = "append", fmt: str = "otel") -> Workload:
    """OpenTelemetry GenAI spans from an OTLP JSON export.

    A span is a model call if it carries ``gen_ai.usage.input_tokens`` (or
    the older ``gen_ai.usage.prompt_tokens``, which vLLM's request spans use)
    or names an inference ``gen_ai.operation.name``; such a span must report
    both input and output tokens. Other spans (tools, HTTP) are skipped and
    counted. Times are ``startTimeUnixNano`` and ``endTimeUnixNano``.

    Session key: ``gen_ai.conversation.id``, else ``session.id``, else the
    span's ``traceId`` (one trace is one agent run or one client request).

    One call seen at two hops (a client's span and a proxy's or engine's
    span below it) is one request: an inference span with an inference span
    among its ancestors, or one repeating an earlier span's
    ``gen_ai.response.id`` in the same trace, is skipped and counted as a
    duplicate; the outermost span (the client's) is kept.
    """
    path = Path(path)
    spans = [(loc, span, _otel_attributes(loc, span.get("attributes"))) for loc, span in _otel_spans(path)]
    inference = [_is_inference(attrs) for _, _, attrs in spans]
    parents = {(s.get("traceId"), s.get("spanId")): s.get("parentSpanId") for _, s, _ in spans}
    inference_ids = {(s.get("traceId"), s.get("spanId")) for (_, s, _), yes in zip(spans, inference) if yes}
    requests: list[LoggedRequest] = []
    skipped = duplicates = 0
    seen_responses: set[tuple[object, str]] = set()
    # Outermost and earliest first, so of two spans of one call the client's is the one kept.
    order = sorted(range(len(spans)), key=lambda i: (_otel_depth(spans[i][1], parents), _start_ns(spans[i][1])))
    for i in order:
        loc, span, attrs = spans[i]
        if not inference[i]:
            skipped += 1
            continue
        response_id = attrs.get("gen_ai.response.id")
        hop_of_response = isinstance(response_id, str) and (span.get("traceId"), response_id) in seen_responses
        if hop_of_response or _has_inference_ancestor(span, parents, inference_ids):
            duplicates += 1
            continue
        if isinstance(response_id, str):
            seen_responses.add((span.get("traceId"), response_id))
        counts = []
        for names in (_OTEL_INPUT, _OTEL_OUTPUT):
            name = next((a for a in names if a in attrs), None)
            if name is None:
                raise _fail(loc, names[0], f"missing on a GenAI inference span; the instrumentation must "
                                           f"record token usage ({names[0]} or {names[1]})")
            counts.append(_count(loc, name, attrs[name]))
        times = []
        for field in ("startTimeUnixNano", "endTimeUnixNano"):
            raw = span.get(field)
            if raw is None:
                raise _fail(loc, field, "missing")
            times.append(_count(loc, field, raw) / 1e9)
        _check_times(loc, times[0], times[1], "endTimeUnixNano")
        key = None
        for name in ("gen_ai.conversation.id", "session.id"):
            key = key or _optional_text(loc, name, attrs.get(name))
        key = key or _optional_text(loc, "traceId", span.get("traceId"))
        rid = (_optional_text(loc, "gen_ai.response.id", attrs.get("gen_ai.response.id"))
               or _optional_text(loc, "gen_ai.request.id", attrs.get("gen_ai.request.id"))
               or _optional_text(loc, "spanId", span.get("spanId")) or f"{len(requests):06d}")
        requests.append(LoggedRequest(loc, rid, key, times[0], times[1], counts[0], counts[1]))
    return build_workload(requests, path.name.split(".")[0], path, fmt, reuse, skipped,
                          {"duplicate_spans": duplicates})


def _is_inference(attrs: dict[str, object]) -> bool:
    """A model call: it reports token usage or names an inference operation."""
    return (any(a in attrs for a in _OTEL_INPUT + _OTEL_OUTPUT)
            or attrs.get("gen_ai.operation.name") in _OTEL_INFERENCE_OPS)


def _otel_ancestors(span: dict[str, Any], parents: dict[tuple[object, object], object]) -> Iterator[object]:
    """The span ids above ``span`` in its trace, nearest first (a cycle in a corrupt export ends the walk)."""
    trace_id, parent = span.get("traceId"), span.get("parentSpanId")
    seen: set[object] = set()
    while parent and parent not in seen:
        seen.add(parent)
        yield parent
        parent = parents.get((trace_id, parent))


def _otel_depth(span: dict[str, Any], parents: dict[tuple[object, object], object]) -> int:
    return sum(1 for _ in _otel_ancestors(span, parents))


def _start_ns(span: dict[str, Any]) -> int:
    """For ordering only: a missing or bad start is reported when the span is read."""
    raw = span.get("startTimeUnixNano")
    return int(raw) if isinstance(raw, (int, str)) and str(raw).isdigit() else 0


def _has_inference_ancestor(span: dict[str, Any], parents: dict[tuple[object, object], object],
                            inference_ids: set[tuple[object, object]]) -> bool:
    return any((span.get("traceId"), a) in inference_ids for a in _otel_ancestors(span, parents))


def read_vllm_log(path: str | Path, reuse: Reuse = "append") -> Workload:
    """vLLM's per-request OpenTelemetry spans (``--otlp-traces-endpoint``), exported as OTLP JSON.

    vLLM's text request log (``--enable-log-requests``) holds prompt token ids
    cut to ``--max-log-len`` and no usage line, so it cannot give token counts;
    its ``llm_request`` spans carry ``gen_ai.usage.prompt_tokens`` and
    ``gen_ai.usage.completion_tokens``. They hold no conversation id, so calls
    group by the ``traceId`` the client propagated (``traceparent``), else one
    session per request.
    """
    return read_otel_log(path, reuse, fmt="vllm")


# --------------------------------------------------------------------------
# LiteLLM spend logs

_LITELLM_REQUIRED = ("request_id", "startTime", "endTime", "prompt_tokens", "completion_tokens")


def _csv_objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of a CSV export as objects keyed by the header, each with its 1-based line."""
    lines = _open_text(path)
    first = next(lines, None)
    if first is None:
        raise BasinInputError(f"{path}: the file is empty")
    header = next(csv.reader([first[1]]))
    for line_no, text in lines:
        try:
            row = next(csv.reader([text]))
        except csv.Error as exc:
            raise BasinInputError(f"{where(path, line=line_no)}: unreadable CSV ({exc})") from exc
        if len(row) != len(header):
            raise BasinInputError(f"{where(path, line=line_no)}: expected {len(header)} columns as in the "
                                  f"header, got {len(row)} (a quoted field with a line break is not supported; "
                                  f"export as JSON instead)")
        yield where(path, line=line_no), dict(zip(header, row))


def read_litellm_log(path: str | Path, reuse: Reuse = "append") -> Workload:
    """LiteLLM proxy spend logs (the ``LiteLLM_SpendLogs`` table).

    Accepts the ``/spend/logs`` JSON (an array), JSONL, or a CSV export of
    the table. Each row needs ``request_id``, ``startTime``, ``endTime``,
    ``prompt_tokens`` and ``completion_tokens``; rows whose ``status`` is
    ``failure`` are skipped and counted.

    Session key: the ``session_id`` column (what a client sets with
    ``litellm_session_id``; without it LiteLLM writes each request's own
    trace id there), else one session per request. ``user`` and
    ``end_user`` are not used: a user runs many sessions. Cached tokens, for
    ``reuse="cached"``, come from the row's ``metadata``
    (``additional_usage_values.prompt_tokens_details.cached_tokens``).
    """
    path = Path(path)
    rows = _csv_objects(path) if path.name.lower().removesuffix(".gz").endswith(".csv") else _json_objects(path)
    requests: list[LoggedRequest] = []
    skipped = 0
    for loc, row in rows:
        if row.get("status") == "failure":
            skipped += 1
            continue
        for field in _LITELLM_REQUIRED:
            if row.get(field) in (None, ""):
                raise _fail(loc, field, "missing; a LiteLLM spend-log row needs "
                                        + ", ".join(_LITELLM_REQUIRED))
        start = _timestamp(loc, "startTime", row["startTime"])
        end = _timestamp(loc, "endTime", row["endTime"])
        _check_times(loc, start, end, "endTime")
        key = _optional_text(loc, "session_id", row.get("session_id"))
        rid = _optional_text(loc, "request_id", row["request_id"]) or f"{len(requests):06d}"
        requests.append(LoggedRequest(loc, rid, key, start, end,
                                      _count(loc, "prompt_tokens", row["prompt_tokens"]),
                                      _count(loc, "completion_tokens", row["completion_tokens"]),
                                      _litellm_cached_tokens(loc, row.get("metadata"))))
    return build_workload(requests, path.name.split(".")[0], path, "litellm", reuse, skipped)


def _litellm_cached_tokens(loc: str, metadata: object) -> int | None:
    """The provider's cached prompt tokens, which LiteLLM keeps in the row's ``metadata``
    (a JSON string in the table) under ``additional_usage_values.prompt_tokens_details``."""
    if isinstance(metadata, str):
        if not metadata.strip():
            return None
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError:
            raise _fail(loc, "metadata", "not valid JSON; export the spend-log table as LiteLLM writes it") from None
    usage = metadata.get("additional_usage_values") if isinstance(metadata, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        return None
    return _count(loc, "metadata.additional_usage_values.prompt_tokens_details.cached_tokens", cached)


# --------------------------------------------------------------------------
# SGLang --log-requests

#: ``[2025-03-01 10:00:03] `` or ``[2025-03-01 10:00:03 TP0] INFO ...`` before the message.
_SGLANG_FINISH = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)[^\]]*\].*?Finish: obj=")
_SGLANG_META = {name: re.compile(rf"'{name}': ({pattern})") for name, pattern in (
    ("id", r"'[^']*'"), ("prompt_tokens", r"\d+"), ("completion_tokens", r"\d+"),
    ("cached_tokens", r"\d+"), ("e2e_latency", r"[0-9.eE+-]+"))}


def read_sglang_log(path: str | Path, reuse: Reuse = "append") -> Workload:
    """SGLang's request log (``--log-requests``), in either of its formats.

    Text (``--log-requests-format text``, the default): one ``Finish:`` line
    per request, whose ``out=`` part's ``meta_info`` holds ``prompt_tokens``,
    ``completion_tokens``, ``cached_tokens`` and ``e2e_latency``; the line's
    time stamp (whole seconds) is the request's end and end minus
    ``e2e_latency`` its start.

    JSON (``--log-requests-format json``): one object per line; those whose
    ``event`` is ``request.finished`` carry the same ``out.meta_info`` and a
    ``timestamp`` (microseconds) taken as the end. A batched request's ``out``
    is a list: each element is a request of its own.

    Other lines are skipped and counted. Session key: the request's
    ``session_params.id`` (SGLang's own session API) in the JSON format;
    otherwise none, since SGLang logs no conversation id: each request is a
    one-call session at its own arrival time (an arrival shape with token
    sizes, like the Azure trace).
    """
    path = Path(path)
    requests: list[LoggedRequest] = []
    skipped = 0
    for line_no, text in _open_text(path):
        loc = where(path, line=line_no)
        if text.lstrip().startswith("{"):
            found = _sglang_json_requests(loc, text, line_no)
        else:
            found = _sglang_text_request(loc, text, line_no)
        if not found:
            skipped += 1
        requests += found
    return build_workload(requests, path.name.split(".")[0], path, "sglang", reuse, skipped)


def _sglang_text_request(loc: str, text: str, line_no: int) -> list[LoggedRequest]:
    head = _SGLANG_FINISH.match(text)
    if head is None:
        return []
    out_at = text.find(", out=", head.end())
    if out_at < 0:
        raise _fail(loc, "out", "missing from the Finish line; run SGLang with --log-requests at "
                                "--log-requests-level 0 or higher so the output metadata is logged")
    meta: dict[str, object] = {}
    for name, pattern in _SGLANG_META.items():
        found = pattern.findall(text, out_at)
        if found:
            raw = found[-1]  # meta_info follows the output text, so the last match is it
            meta[name] = raw.strip("'") if name == "id" else float(raw) if name == "e2e_latency" else int(raw)
    end = _timestamp(loc, "time stamp", head.group(1).replace(",", "."))
    return [_sglang_request(loc, meta, "meta_info", end, None, f"{line_no:06d}")]


def _sglang_json_requests(loc: str, text: str, line_no: int) -> list[LoggedRequest]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BasinInputError(f"{loc}: malformed JSON ({exc.msg} at column {exc.colno}); SGLang's JSON request "
                              f"log has one object per line") from exc
    if not isinstance(record, dict) or record.get("event") != "request.finished":
        return []
    if "timestamp" not in record:
        raise _fail(loc, "timestamp", "missing from a request.finished record")
    end = _timestamp(loc, "timestamp", record["timestamp"])
    outs = record.get("out")
    if outs is None:
        raise _fail(loc, "out", "missing; SGLang writes it for text generation (a multimodal-generation "
                                "request has none and carries no token counts)")
    outs = outs if isinstance(outs, list) else [outs]
    obj = record.get("obj")
    session = obj.get("session_params") if isinstance(obj, dict) else None
    key = _optional_text(loc, "obj.session_params.id", session.get("id")) if isinstance(session, dict) else None
    found = []
    for i, out in enumerate(outs):
        where_out = f"out[{i}]" if len(outs) > 1 else "out"
        meta = out.get("meta_info") if isinstance(out, dict) else None
        if not isinstance(meta, dict):
            raise _fail(loc, f"{where_out}.meta_info", "missing or not an object")
        found.append(_sglang_request(loc, meta, f"{where_out}.meta_info", end, key, f"{line_no:06d}-{i}"))
    return found


def _sglang_request(loc: str, meta: dict[str, object], prefix: str, end_s: float, key: str | None,
                    fallback_id: str) -> LoggedRequest:
    """One finished request from its ``meta_info`` and the time it was logged (its end)."""
    for name in ("prompt_tokens", "completion_tokens"):
        if name not in meta:
            raise _fail(loc, f"{prefix}.{name}", "missing from the finished request's output metadata")
    latency = meta.get("e2e_latency", 0.0)
    if (isinstance(latency, bool) or not isinstance(latency, (int, float)) or not math.isfinite(latency)
            or latency < 0):
        raise _fail(loc, f"{prefix}.e2e_latency", f"expected seconds >= 0, got {latency!r}")
    cached = meta.get("cached_tokens")
    rid = _optional_text(loc, f"{prefix}.id", meta.get("id")) or fallback_id
    return LoggedRequest(loc, rid, key, max(0.0, end_s - latency), end_s,
                         _count(loc, f"{prefix}.prompt_tokens", meta["prompt_tokens"]),
                         _count(loc, f"{prefix}.completion_tokens", meta["completion_tokens"]),
                         None if cached is None else _count(loc, f"{prefix}.cached_tokens", cached))


# --------------------------------------------------------------------------
# Dispatch


def load_request_log(fmt: str, path: str | Path, reuse: Reuse = "append") -> Workload:
    """Import the request log at ``path`` written in ``fmt`` (one of :data:`LOG_FORMATS`)."""
    readers = {"openai": read_openai_log, "otel": read_otel_log, "vllm": read_vllm_log,
               "litellm": read_litellm_log, "sglang": read_sglang_log}
    if fmt not in readers:
        raise BasinInputError(f"unknown log format {fmt!r}; use one of {', '.join(sorted(readers))}")
    if reuse not in ("append", "cached"):
        raise BasinInputError(f"--reuse {reuse!r}: use 'append' or 'cached'")
    return readers[fmt](path, reuse)
