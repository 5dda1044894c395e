"""Reading a call's JSON body, and writing the one the engine receives.

Pure functions on bytes, with no event loop in sight, so the proxy can run
them inline for small bodies and in a worker process for large or compressed
ones: ``json`` in C holds the interpreter lock, so a thread would not free the
event loop, while a process does, and only bytes and a few small facts cross
the boundary.

What the proxy needs of a body is a handful of top-level fields (the session
id, the end flag, ``stream``, the messages or prompt, the first user message).
Those are :class:`BodyFacts`. The body forwarded to the engine is the client's
bytes with the gateway's fields spliced in before the closing brace; only when
a field must be removed or replaced is the body parsed and written again.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Encodings a client may send its body in (``Content-Encoding``).
ENCODINGS = ("identity", "gzip", "deflate")
#: Longest first user message kept for the peak predictor.
TASK_TEXT_CHARS = 16_384
_MISSING = object()


class BadBody(Exception):
    """A body the gateway refuses: ``status`` and ``kind`` for the 4xx, and the message."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(status, kind, message)
        self.status, self.kind, self.message = status, kind, message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class BodyFacts:
    """What the gateway reads of a body's top level."""

    #: Every top-level key.
    keys: frozenset[str]
    #: Values of the watched keys that are present (session id fields, the
    #: end flag, ``stream``, ``stream_options``, ``priority``).
    values: Mapping[str, object]
    #: ``messages`` is a list (chat) / ``prompt`` is present (completion).
    has_messages: bool
    has_prompt: bool
    #: The first user message (or the prompt string), cut to TASK_TEXT_CHARS.
    task_text: str | None
    #: Characters of the messages' non-text parts (images, audio, files: base64 data or
    #: URLs), which an engine does not count as text: a 1.5 MB image is about a hundred
    #: tokens, not 400,000. The prompt estimate leaves them out.
    media_chars: int = 0


def decode(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """The body without its ``Content-Encoding``, refused once it would grow past ``limit`` bytes
    (inflation stops there, so a small bomb costs no more than a body of ``limit`` bytes)."""
    name = (encoding or "identity").strip().lower()
    if name in ("", "identity"):
        return raw
    if name not in ENCODINGS:
        raise BadBody(415, "unsupported_encoding", f"header Content-Encoding: {name[:40]!r} is not supported; "
                      "send the body as identity, gzip or deflate")
    wbits = 16 + zlib.MAX_WBITS if name == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(raw, limit + 1)
        if len(out) <= limit and not inflater.eof:
            out += inflater.flush()
    except zlib.error:
        raise BadBody(400, "invalid_encoding", f"the body is not valid {name} data although header "
                      f"Content-Encoding says so; compress it with {name} or drop the header") from None
    if len(out) > limit:
        raise BadBody(413, "body_too_large", f"the body inflates to more than {limit} bytes; send a smaller "
                      "body or raise max_body_bytes in the gateway config")
    if not inflater.eof:
        raise BadBody(400, "invalid_encoding", f"the {name} body is truncated; send the whole compressed body")
    return out


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def parse(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; anything else is a :class:`BadBody` that says what is wrong."""
    if not raw:
        raise BadBody(400, "missing_body", "the request has no body; send a JSON object")
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_constant=_no_constants)
    except UnicodeDecodeError:
        raise BadBody(400, "invalid_json", "the body is not UTF-8 text; send JSON encoded as UTF-8") from None
    except RecursionError:
        raise BadBody(400, "invalid_json", "the body nests JSON too deeply to read; flatten it") from None
    except ValueError as exc:
        raise BadBody(400, "invalid_json", f"the body is not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(body, dict):
        raise BadBody(400, "invalid_json", "the body must be a JSON object")
    return body


def task_text(body: Mapping[str, Any]) -> str | None:
    """The first user message (the agent's task), for the peak predictor."""
    messages = body.get("messages")
    text: str | None = None
    if isinstance(messages, list):
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "user":
                content = msg.get("content")
                if isinstance(content, str):
                    text = content
                elif isinstance(content, list):
                    parts = [p.get("text") for p in content if isinstance(p, dict)]
                    text = " ".join(p for p in parts if isinstance(p, str)) or None
                break
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else None
    return text[:TASK_TEXT_CHARS] if text is not None else None


def media_chars(body: Mapping[str, Any]) -> int:
    """Characters in the non-text parts of the messages' content lists."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    total = 0
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") != "text":
                    total += _chars(part, 4)
    return total


def _chars(value: object, depth: int) -> int:
    """Characters of the strings in ``value`` (nested up to ``depth``)."""
    if isinstance(value, str):
        return len(value)
    if depth <= 0:
        return 0
    if isinstance(value, dict):
        return sum(_chars(v, depth - 1) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v, depth - 1) for v in value)
    return 0


def facts_of(body: Mapping[str, Any], watched: Iterable[str]) -> BodyFacts:
    values = {name: body[name] for name in watched if name in body}
    return BodyFacts(frozenset(body), values, isinstance(body.get("messages"), list), "prompt" in body,
                     task_text(body), media_chars(body))


def inspect(raw: bytes, encoding: str | None, limit: int, watched: tuple[str, ...]) -> tuple[bytes, BodyFacts]:
    """Decode and read one body: (the plain JSON bytes, their facts). Module-level and
    made of picklable parts, so a worker process can run it."""
    plain = decode(raw, encoding, limit)
    return plain, facts_of(parse(plain), watched)


def rewrite(raw: bytes, facts: BodyFacts, remove: Iterable[str], put: Mapping[str, object]) -> bytes:
    """The body the engine receives: ``raw`` without the keys in ``remove`` and with ``put`` set.

    When nothing present is removed or replaced, the new fields are spliced in
    before the closing brace and the client's bytes go through untouched;
    otherwise the body is parsed and written again.
    """
    drop, changed = _plan(facts, remove, put)
    if not drop and not any(k in facts.keys for k in changed):
        return splice(raw, changed)
    body = parse(raw)
    for key in drop:
        body.pop(key, None)
    body.update(changed)
    return _dumps(body)


def _dumps(obj: object) -> bytes:
    """Compact JSON as UTF-8. JSON may escape a lone surrogate (``"\\ud800"``),
    which has no UTF-8 form: such a body is written with every non-ASCII
    character escaped, the same JSON value the client sent."""
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def _plan(facts: BodyFacts, remove: Iterable[str], put: Mapping[str, object]
          ) -> tuple[list[str], dict[str, object]]:
    """The keys to drop (present, and not set again) and the values that differ from the body's."""
    drop = [k for k in remove if k in facts.keys and k not in put]
    changed = {k: v for k, v in put.items() if facts.values.get(k, _MISSING) != v}
    return drop, changed


def needs_rewrite(facts: BodyFacts, remove: Iterable[str], put: Mapping[str, object]) -> bool:
    """Whether :func:`rewrite` must parse the body again (a field present is dropped or replaced)."""
    drop, changed = _plan(facts, remove, put)
    return bool(drop) or any(k in facts.keys for k in changed)


def splice(raw: bytes, additions: Mapping[str, object]) -> bytes:
    """``raw`` (a JSON object none of whose keys are in ``additions``) with ``additions`` added."""
    if not additions:
        return raw
    extra = _dumps(dict(additions))[1:-1]
    head = raw.rstrip()
    if not head.endswith(b"}"):
        raise ValueError("splice needs the bytes of a JSON object")
    inner = head[:-1].rstrip()
    return inner + (b"" if inner.endswith(b"{") else b",") + extra + b"}"
