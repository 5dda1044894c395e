"""A chat-completion request body as the engine model sees it: a cache key,
token counts, an output length and a queue priority. Pure: no clock, no I/O.

The model never sees text, only keys (:mod:`basin.sim.cache`): a list of
``(chunk_id, n_tokens)`` pieces where equal leading chunk ids mean a shared
prefix. Here each whole message is one piece, its id a hash of the message
(role, content and any tool calls), so a conversation that grows by messages
extends its previous key piece by piece and reuses its prefix exactly as a
simulated session does. A message edited anywhere changes its piece, and
everything after it is a miss, as in a real radix cache.

Token counts are an approximation, stated once: a message holds
``ceil(bytes / 4)`` tokens of its text (content, plus the JSON of its tool
calls), at least one; chat-template tokens are not counted. ``basin replay``
writes text at four characters per token, so the counts it intends come back
exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

MetricsStyle = Literal["sglang", "vllm"]
STYLES: tuple[str, ...] = ("sglang", "vllm")

#: Bytes of message text per token (the approximation of the module docstring).
BYTES_PER_TOKEN = 4
#: Output tokens when the request names no max_tokens / max_completion_tokens.
DEFAULT_MAX_TOKENS = 256

Piece = tuple[int, int]

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


class RequestError(ValueError):
    """A request the emulator refuses with HTTP 400; ``field`` names the culprit."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"field '{field}': {message}")


@dataclass(frozen=True, slots=True)
class ChatCall:
    """One call as the engine model takes it."""

    key: tuple[Piece, ...]
    prompt_tokens: int
    output_tokens: int
    #: The output length came from the request (finish_reason ``length``), not the default.
    limited: bool
    #: The engine's own priority field as sent (0 when absent).
    priority: int
    stream: bool
    include_usage: bool
    model: str | None
    #: Session identity for affinity routing (header, body field or first non-system message).
    affinity: str
    #: Hash of the whole conversation: seeds the answer's text.
    digest: int


def _hash64(*parts: bytes) -> int:
    # SHA-256, which CPUs with SHA extensions hash at twice BLAKE2b's speed (a
    # resent conversation is most of each call's bytes), fed part by part so
    # that a message is never copied into one buffer first.
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return int.from_bytes(h.digest()[:8], "big") >> 1


def _text_of(message: Mapping[str, object], where: str) -> str:
    """The text a message's tokens are counted from."""
    content = message.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise RequestError(f"{where}.content[{j}]", "expected a content part object such as "
                                   '{"type": "text", "text": "..."}')
            text = part.get("text")
            parts.append(text if isinstance(text, str) else _CANONICAL(part))
    elif content is not None:
        raise RequestError(f"{where}.content", f"expected a string, a list of content parts or null, "
                           f"got {type(content).__name__}")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        parts.append(_CANONICAL(tool_calls))
    return "".join(parts)


def message_piece(message: object, index: int) -> Piece:
    """The cache-key piece of one message: (hash of the whole message, its tokens)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise RequestError(where, f"expected a message object with 'role' and 'content', got "
                           f"{type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise RequestError(f"{where}.role", "expected a non-empty string such as 'user' or 'assistant'")
    text = _text_of(message, where)
    content = message.get("content")
    if isinstance(content, str) and len(message) == 2:
        # The common message, {role, content: text}: hashed from its two strings, without writing it
        # out as JSON (a resent conversation is most of each call's bytes). The tag keeps it apart
        # from every canonical JSON form, which starts with '{'.
        digest = _hash64(b"m\x00", role.encode("utf-8", "surrogatepass"), b"\x00",
                         content.encode("utf-8", "surrogatepass"))
    else:
        try:
            digest = _hash64(_CANONICAL(message).encode("utf-8", "surrogatepass"))
        except (TypeError, ValueError) as exc:
            raise RequestError(where, f"cannot be read as JSON ({exc})") from None
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return digest, max(1, math.ceil(size / BYTES_PER_TOKEN))


def _whole_number(body: Mapping[str, object], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(name, f"expected a whole number >= {minimum}, got {value!r}")
    if value < minimum:
        raise RequestError(name, f"expected a whole number >= {minimum}, got {value}")
    return value


def _flag(body: Mapping[str, object], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(name, f"expected true or false, got {value!r}")
    return value


def parse_chat(body: object, *, default_max_tokens: int = DEFAULT_MAX_TOKENS,
               routing_key: str | None = None) -> ChatCall:
    """The call a ``/v1/chat/completions`` body asks for; :class:`RequestError` names the bad field.

    ``routing_key``: the ``X-SMG-Routing-Key`` header (SGLang's affinity hint), if sent.
    """
    if not isinstance(body, dict):
        raise RequestError("(body)", "the request body must be a JSON object with 'model' and 'messages'")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "expected a non-empty list of {'role': ..., 'content': ...} objects")
    key = tuple(message_piece(m, i) for i, m in enumerate(messages))
    prompt = sum(n for _, n in key)
    max_completion = _whole_number(body, "max_completion_tokens", 1)
    max_tokens = _whole_number(body, "max_tokens", 1)
    limit = max_completion if max_completion is not None else max_tokens
    n = _whole_number(body, "n", 1)
    if n is not None and n != 1:
        raise RequestError("n", f"the emulator answers one choice per call; send n=1 or leave it out (got {n})")
    priority = body.get("priority")
    if priority is None:
        priority = 0
    elif isinstance(priority, bool) or not isinstance(priority, int):
        raise RequestError("priority", f"expected a whole number (the engine's own scale), got {priority!r}")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise RequestError("stream_options", "expected an object such as {\"include_usage\": true}")
        include_usage = _flag(options, "include_usage")
        if include_usage and not stream:
            raise RequestError("stream_options", "only allowed with \"stream\": true")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model", f"expected a string, got {type(model).__name__}")
    session_id = body.get("session_id")
    if routing_key:
        affinity = routing_key
    elif isinstance(session_id, str) and session_id:
        affinity = session_id
    else:
        first = next((i for i, m in enumerate(messages) if m.get("role") != "system"), 0)
        affinity = f"{key[first][0]:x}"
    digest = _hash64(b"".join(c.to_bytes(8, "big") for c, _ in key))
    return ChatCall(key=key, prompt_tokens=prompt, output_tokens=limit or default_max_tokens,
                    limited=limit is not None, priority=priority, stream=stream, include_usage=include_usage,
                    model=model, affinity=affinity, digest=digest)


def queue_priority(priority: int, style: MetricsStyle) -> float:
    """The simulator's queue key (lower served first) for an engine's priority value.

    SGLang serves higher values first (its default, without
    ``--schedule-low-priority-values-first``; the gateway sends ``-rank``);
    vLLM serves lower values first (the gateway sends ``rank``).
    """
    return float(-priority if style == "sglang" else priority)


def affinity_uid(affinity: str) -> int:
    """A stable session number for the simulator's affinity router."""
    return _hash64(affinity.encode("utf-8", "surrogatepass")) & 0xFFFF_FFFF
