"""Token counts of a finished call, read from the engine's own response.

Engines report them in ``usage`` (OpenAI shape, with
``prompt_tokens_details.cached_tokens`` for prefix hits) and llama.cpp also in
``timings`` (``cache_n`` reused, ``prompt_n`` computed). Streamed responses
carry them in a data event near the end (some engines in every event), so the
proxy hands every chunk to a :class:`StreamUsage`, which looks only at lines
that name a usage field and keeps the last usage found.

An engine's figure is read only when it is a count a context can have: a
negative, fractional-infinite or absurd value (``1e400`` parses as infinity)
leaves the call without usage, as if the engine had not said.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass

#: Largest token count read from an engine (far beyond any context; a bigger one is garbage).
MAX_COUNT = 1 << 40
#: Longest stream line kept while it is incomplete; a longer one is skipped (it is content, not usage).
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class CallUsage:
    prompt_tokens: int
    completion_tokens: int
    #: Prompt tokens served from the prefix cache; None when the engine did not say.
    cached_tokens: int | None

    @property
    def context_tokens(self) -> int:
        """The session's context after this call: its prompt plus its answer."""
        return self.prompt_tokens + self.completion_tokens


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not 0 <= value <= MAX_COUNT:
        return None
    return int(value)


def usage_from_response(obj: object) -> CallUsage | None:
    """Usage of one response object (a whole JSON body or one stream event)."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    timings = obj.get("timings")
    prompt = completion = cached = None
    if isinstance(usage, dict):
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = _count(details.get("cached_tokens"))
    if isinstance(timings, dict):
        cache_n, prompt_n = _count(timings.get("cache_n")), _count(timings.get("prompt_n"))
        if cached is None:
            cached = cache_n
        if prompt is None and cache_n is not None and prompt_n is not None:
            prompt = cache_n + prompt_n
        if completion is None:
            completion = _count(timings.get("predicted_n"))
    if prompt is None:
        return None
    return CallUsage(prompt, completion or 0, cached)


def usage_from_body(body: bytes) -> CallUsage | None:
    try:
        return usage_from_response(json.loads(body))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


class StreamUsage:
    """The last usage in a server-sent event stream, read as the stream passes
    (chunk by chunk, lines split across chunks joined), so a usage event is
    found wherever it sits. ``encoding``: the stream's ``Content-Encoding``
    (gzip or deflate are inflated for reading; the client gets the bytes as sent)."""

    __slots__ = ("usage", "_carry", "_broken", "_inflater")

    def __init__(self, encoding: str | None = None):
        self.usage: CallUsage | None = None
        self._carry = b""
        self._broken = False
        name = (encoding or "identity").strip().lower()
        self._inflater = None
        if name in ("gzip", "deflate"):
            self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if name == "gzip" else zlib.MAX_WBITS)

    def feed(self, chunk: bytes) -> None:
        if self._broken:
            return
        inflater = self._inflater
        if inflater is None:
            self._scan(chunk)
            return
        try:  # inflated a piece at a time: a small chunk may inflate to a lot
            self._scan(inflater.decompress(chunk, MAX_LINE_BYTES))
            while inflater.unconsumed_tail:
                self._scan(inflater.decompress(inflater.unconsumed_tail, MAX_LINE_BYTES))
        except zlib.error:
            self._broken = True  # not what its header says: no usage can be read from it

    def _scan(self, chunk: bytes) -> None:
        data = self._carry + chunk if self._carry else chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._carry = data if len(data) <= MAX_LINE_BYTES else b""
            return
        rest = data[end + 1:]
        self._carry = rest if len(rest) <= MAX_LINE_BYTES else b""
        body = data[:end]
        if b'"usage"' in body or b'"timings"' in body:
            for line in body.split(b"\n"):
                self._read(line)

    def _read(self, line: bytes) -> None:
        line = line.strip()
        if line.startswith(b"data:") and (b'"usage"' in line or b'"timings"' in line):
            found = usage_from_body(line[5:].strip())
            if found is not None:
                self.usage = found

    def close(self) -> CallUsage | None:
        """The usage, once the stream ended (a last line without its newline is read too)."""
        if self._carry:
            self._read(self._carry)
            self._carry = b""
        return self.usage


def usage_from_stream_tail(tail: bytes) -> CallUsage | None:
    """Usage from the last data event of a server-sent event stream that has it."""
    for line in reversed(tail.split(b"\n")):
        line = line.strip()
        if not line.startswith(b"data:") or b'"usage"' not in line and b'"timings"' not in line:
            continue
        found = usage_from_body(line[5:].strip())
        if found is not None:
            return found
    return None
