"""Token counts of a finished call, read from the engine's own response.

Engines report them in ``usage`` (OpenAI shape, with
``prompt_tokens_details.cached_tokens`` for prefix hits) and llama.cpp also in
``timings`` (``cache_n`` reused, ``prompt_n`` computed). Streamed responses
carry them in their last data event, so the proxy keeps only the stream's tail
and reads it here after the stream ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
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
    except (ValueError, UnicodeDecodeError):
        return None


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
