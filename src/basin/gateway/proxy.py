"""The request path: read a call, find its session, hold it while the policy
parks it, forward it with the session's priority, pass the answer through.

Responses are relayed byte for byte (streams chunk by chunk); the gateway only
keeps a stream's tail to read the usage the engine reports at its end. Every
failure the client can cause is a 4xx with a message that names the field;
an unreachable upstream is a 502 naming the cause; an upstream that dies
mid-stream ends the stream with an error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from basin.gateway.config import GatewayConfig
from basin.gateway.gate import Gate, ShedError
from basin.gateway.sessions import GatewaySession, SessionState
from basin.gateway.telemetry import Telemetry
from basin.gateway.usage import CallUsage, usage_from_body, usage_from_stream_tail

log = logging.getLogger("basin.gateway")

GATED_PATHS = ("/v1/chat/completions", "/v1/completions")
PASSTHROUGH_PATHS = ("/v1/models",)
#: Request headers worth carrying to the engine; everything else stays here.
_FORWARD_HEADERS = ("authorization", "accept", "x-request-id", "x-correlation-id", "traceparent", "tracestate")
#: Response headers worth carrying back (framing headers are the gateway's own).
_RETURN_HEADERS = ("content-type", "x-request-id", "retry-after", "openai-processing-ms")
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no", "")
_STREAM_TAIL_BYTES = 16384
_MAX_SESSION_ID = 256


class BadCall(Exception):
    """A call the gateway refuses with a 4xx."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass(frozen=True, slots=True)
class CallMeta:
    session_id: str
    end: bool
    stream: bool
    prompt_tokens: int
    task_text: str | None


def error_body(status: int, kind: str, message: str, **extra: object) -> bytes:
    return json.dumps({"error": {"type": kind, "code": status, "message": message, **extra}}).encode()


def error_response(status: int, kind: str, message: str, headers: dict[str, str] | None = None,
                   **extra: object) -> web.Response:
    return web.Response(status=status, body=error_body(status, kind, message, **extra),
                        content_type="application/json", headers=headers)


def sse_error(status: int, kind: str, message: str) -> bytes:
    return b"event: error\ndata: " + error_body(status, kind, message) + b"\n\n"


def _task_text(body: dict[str, Any]) -> str | None:
    """The first user message (the agent's task), for the peak predictor."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "user":
                content = msg.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, list):
                    parts = [p.get("text") for p in content if isinstance(p, dict)]
                    return " ".join(p for p in parts if isinstance(p, str)) or None
        return None
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else None


class Proxy:
    def __init__(self, config: GatewayConfig, gate: Gate, adapter: Any, telemetry: Telemetry,
                 client: aiohttp.ClientSession, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.gate = gate
        self.adapter = adapter
        self.telemetry = telemetry
        self.client = client
        self.clock = clock
        self.send_priority = bool(getattr(adapter, "priority_field_supported", False))

    # ------------------------------------------------------------ reading a call
    def read_call(self, request: web.Request, body: dict[str, Any], raw_size: int) -> CallMeta:
        cfg = self.config
        session_id: object = request.headers.get(cfg.session_header)
        source = f"header {cfg.session_header}"
        if session_id is None:
            for name in cfg.session_body_fields:
                if body.get(name) is not None:
                    session_id, source = body[name], f"body field '{name}'"
                    break
        if session_id is None:
            # A call that names no session is a session of one call.
            session_id, end = f"anonymous-{id(request):x}-{time.monotonic_ns():x}", True
        else:
            if (not isinstance(session_id, str) or not 0 < len(session_id) <= _MAX_SESSION_ID
                    or not session_id.isascii() or not session_id.isprintable()):
                raise BadCall(400, "invalid_session_id",
                              f"{source}: a session id is 1-{_MAX_SESSION_ID} printable ASCII characters; "
                              f"got {str(session_id)[:40]!r}")
            end = False
        marker = request.headers.get(cfg.end_header)
        if marker is not None:
            value = marker.strip().lower()
            if value not in _TRUE + _FALSE:
                raise BadCall(400, "invalid_session_marker",
                              f"header {cfg.end_header}: expected true or false, got {marker[:40]!r}")
            end = end or value in _TRUE
        flag = body.pop(cfg.end_body_field, None)
        if flag is not None:
            if not isinstance(flag, bool):
                raise BadCall(400, "invalid_session_marker",
                              f"body field '{cfg.end_body_field}': expected true or false, got {flag!r}")
            end = end or flag
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadCall(400, "invalid_field", f"body field 'stream': expected true or false, got {stream!r}")
        if request.path == "/v1/chat/completions" and not isinstance(body.get("messages"), list):
            raise BadCall(400, "invalid_field", "body field 'messages': a chat completion needs a list of messages")
        if request.path == "/v1/completions" and "prompt" not in body:
            raise BadCall(400, "invalid_field", "body field 'prompt': a completion needs a prompt")
        prompt_tokens = max(int(raw_size / cfg.chars_per_token), 1)
        return CallMeta(str(session_id), end, stream, prompt_tokens, _task_text(body))

    # ------------------------------------------------------------ handlers
    def _refuse(self, status: int, kind: str, message: str) -> web.Response:
        self.telemetry.calls.labels("refused").inc()
        return error_response(status, kind, message)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, "body_too_large",
                                f"request body exceeds {self.config.max_body_bytes} bytes; send a smaller "
                                "body or raise max_body_bytes in the gateway config")
        if not raw:
            return self._refuse(400, "missing_body", "the request has no body; send a JSON object")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return self._refuse(400, "invalid_json", f"the body is not valid JSON ({exc})")
        if not isinstance(body, dict):
            return self._refuse(400, "invalid_json", "the body must be a JSON object")
        try:
            call = self.read_call(request, body, len(raw))
        except BadCall as exc:
            return self._refuse(exc.status, exc.kind, str(exc))
        gate = self.gate
        try:
            sess = gate.open_call(call.session_id, self.clock(), call.prompt_tokens, call.task_text, call.end)
        except ShedError as exc:
            return self._shed_response(exc.reason, str(exc))
        response: web.StreamResponse | None = None
        waited = 0.0
        if gate.must_wait(sess):
            wait_start = time.perf_counter()
            response, verdict = await self._hold(request, sess, call)
            waited = time.perf_counter() - wait_start
            self.telemetry.park_wait.observe(waited)
            if verdict is not SessionState.ADMITTED:
                reason = sess.shed_reason or "session ended while held"
                if response is not None:
                    self.telemetry.calls.labels("shed").inc()
                    await response.write(sse_error(503, "session_shed", f"the session was shed ({reason})"))
                    return response
                return self._shed_response(reason, "the session was shed to protect the engine")
        payload, headers = self._upstream_request(request, sess, body, call)
        gate.forwarded(sess, call.prompt_tokens, self.clock())
        self.telemetry.added_latency.observe(time.perf_counter() - started - waited)
        usage: CallUsage | None = None
        try:
            usage, response = await self._forward(request, sess, call, payload, headers, response)
            return response
        finally:
            gate.done(sess, usage, self.clock())

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        try:
            async with self.client.get(self.config.upstream + request.path, headers=self._headers(request),
                                       allow_redirects=False) as up:
                data = await up.read()
                return web.Response(status=up.status, body=data, headers=self._returned(up))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return self._upstream_down(exc)

    # ------------------------------------------------------------ holding
    async def _hold(self, request: web.Request, sess: GatewaySession,
                    call: CallMeta) -> tuple[web.StreamResponse | None, SessionState]:
        """Wait for release; a streamed call gets its headers now and a
        keep-alive comment every few seconds so proxies keep it open."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[SessionState] = loop.create_future()
        self.gate.wait(sess, waiter)
        response: web.StreamResponse | None = None
        try:
            if not call.stream:
                return None, await waiter
            response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                               "Cache-Control": "no-cache"})
            await response.prepare(request)
            while True:
                try:
                    verdict = await asyncio.wait_for(asyncio.shield(waiter), self.config.keepalive_s)
                    return response, verdict
                except TimeoutError:
                    await response.write(b": waiting for admission\n\n")
        except BaseException:
            self.gate.abandon(sess, waiter, self.clock())
            raise

    # ------------------------------------------------------------ forwarding
    def _headers(self, request: web.Request) -> dict[str, str]:
        headers = {name: request.headers[name] for name in _FORWARD_HEADERS if name in request.headers}
        headers["Accept-Encoding"] = "identity"
        return headers

    @staticmethod
    def _returned(up: aiohttp.ClientResponse) -> dict[str, str]:
        return {name: up.headers[name] for name in _RETURN_HEADERS if name in up.headers}

    def _upstream_request(self, request: web.Request, sess: GatewaySession, body: dict[str, Any],
                          call: CallMeta) -> tuple[dict[str, Any], dict[str, str]]:
        headers = self._headers(request)
        headers["Content-Type"] = "application/json"
        headers.update(self.adapter.affinity_headers(sess.session_id))
        for name, value in self.adapter.affinity_body(sess.session_id).items():
            body.setdefault(name, value)
        rank = self.gate.priority_rank(sess) if self.send_priority else None
        if rank is not None:
            body.update(self.adapter.priority_fields(rank))
        if call.stream and self.config.request_stream_usage:
            options = body.get("stream_options")
            if options is None:
                body["stream_options"] = {"include_usage": True}
            elif isinstance(options, dict):
                options.setdefault("include_usage", True)
        return body, headers

    async def _forward(self, request: web.Request, sess: GatewaySession, call: CallMeta, body: dict[str, Any],
                       headers: dict[str, str], response: web.StreamResponse | None
                       ) -> tuple[CallUsage | None, web.StreamResponse]:
        url = self.config.upstream + request.path
        for attempt in range(2):
            try:
                up = await self.client.post(url, data=json.dumps(body).encode(), headers=headers,
                                            allow_redirects=False)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                self.telemetry.calls.labels("upstream_down").inc()
                if response is not None:
                    await response.write(sse_error(502, "upstream_unavailable", self._down_message(exc)))
                    return None, response
                return None, self._upstream_down(exc)
            async with up:
                streaming = up.status == 200 and up.content_type == "text/event-stream"
                if streaming:
                    return await self._relay_stream(request, sess, call, up, response)
                try:
                    data = await up.read()
                    self.gate.answering(sess, call.prompt_tokens)
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    self.telemetry.calls.labels("upstream_broke").inc()
                    message = f"the upstream failed while answering ({type(exc).__name__}: {exc})"
                    if response is not None:
                        await response.write(sse_error(502, "upstream_failed", message))
                        return None, response
                    return None, error_response(502, "upstream_failed", message)
            if attempt == 0 and self._priority_refused(up.status, data, body):
                continue
            if up.status in (429, 503):
                self.telemetry.calls.labels("upstream_backpressure").inc()
            else:
                self.telemetry.calls.labels("ok" if up.status < 400 else "upstream_error").inc()
            if response is not None:  # a held stream already answered 200
                if up.status == 200:
                    await response.write(data)
                else:
                    await response.write(sse_error(up.status, "upstream_error", data.decode("utf-8", "replace")))
                return (usage_from_body(data) if up.status == 200 else None), response
            usage = usage_from_body(data) if up.status == 200 else None
            return usage, web.Response(status=up.status, body=data, headers=self._returned(up))
        raise AssertionError("unreachable: the second attempt always returns")

    def _priority_refused(self, status: int, data: bytes, body: dict[str, Any]) -> bool:
        """vLLM refuses a non-zero priority unless it runs the priority
        scheduler: stop sending the field (loudly) and retry once without it."""
        if status != 400 or "priority" not in body or b"priority" not in data:
            return False
        self.send_priority = False
        self.adapter.disable_priority("the engine refused the field")
        body.pop("priority", None)
        log.error("the engine refused the 'priority' field (%s); the gateway stops sending it. Start vLLM "
                  "with --scheduling-policy priority (SGLang: --enable-priority-scheduling) to order "
                  "sessions inside the engine.", data[:200].decode("utf-8", "replace"))
        return True

    async def _relay_stream(self, request: web.Request, sess: GatewaySession, call: CallMeta,
                            up: aiohttp.ClientResponse, response: web.StreamResponse | None
                            ) -> tuple[CallUsage | None, web.StreamResponse]:
        if response is None:
            response = web.StreamResponse(status=up.status, headers=self._returned(up))
            await response.prepare(request)
        tail = b""
        answering = False
        try:
            async for chunk in up.content.iter_any():
                if not answering:  # the prompt is prefilled once the first bytes of the answer arrive
                    self.gate.answering(sess, call.prompt_tokens)
                    answering = True
                try:
                    await response.write(chunk)
                except ConnectionError:
                    self.telemetry.calls.labels("client_gone").inc()
                    raise
                tail = (tail + chunk)[-_STREAM_TAIL_BYTES:]
        except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            self.telemetry.calls.labels("upstream_broke").inc()
            await response.write(sse_error(502, "upstream_failed",
                                           f"the upstream stream broke ({type(exc).__name__}: {exc})"))
            return None, response
        self.telemetry.calls.labels("ok").inc()
        return usage_from_stream_tail(tail), response

    # ------------------------------------------------------------ refusals
    def _shed_response(self, reason: str, message: str) -> web.Response:
        self.telemetry.calls.labels("shed").inc()
        retry = str(self.config.retry_after_s)
        return error_response(503, "session_shed", f"{message} (reason: {reason}); retry after {retry} s",
                              headers={"Retry-After": retry}, reason=reason)

    def _down_message(self, exc: BaseException) -> str:
        return f"cannot reach the upstream {self.config.upstream} ({type(exc).__name__}: {exc})"

    def _upstream_down(self, exc: BaseException) -> web.Response:
        return error_response(502, "upstream_unavailable", self._down_message(exc))
