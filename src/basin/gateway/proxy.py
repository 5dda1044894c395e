"""The request path: read a call, find its session, hold it while the policy
parks it, forward it with the session's priority, pass the answer through.

Responses are relayed byte for byte (streams chunk by chunk); the gateway only
keeps a stream's tail to read the usage the engine reports at its end. Every
failure the client can cause is a 4xx with a message that names the field;
an unreachable upstream is a 502 and a silent one a 504; an upstream that dies
mid-stream ends the stream with an error event. Messages to clients never name
the upstream's address or the gateway's internals; the log does.

Request bodies are read with a ceiling before and after decompression, and
large or compressed ones are decoded and parsed in a worker process
(:mod:`basin.gateway.body`), so no single call can stall the event loop that
serves every other one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import multiprocessing
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from basin.gateway import body as bodies
from basin.gateway.config import GatewayConfig
from basin.gateway.gate import Gate, NotOwner, ShedError
from basin.gateway.netio import EveryFewSeconds, TooLarge, read_capped
from basin.gateway.sessions import GatewaySession, SessionState
from basin.gateway.telemetry import Telemetry
from basin.gateway.usage import CallUsage, StreamUsage, usage_from_body

log = logging.getLogger("basin.gateway")

GATED_PATHS = ("/v1/chat/completions", "/v1/completions")
PASSTHROUGH_PATHS = ("/v1/models",)
#: Request headers worth carrying to the engine; everything else stays here.
_FORWARD_HEADERS = ("authorization", "accept", "x-request-id", "x-correlation-id", "traceparent", "tracestate")
#: Response headers worth carrying back (framing headers are the gateway's own;
#: the body is relayed as the engine encoded it, so its encoding goes with it).
_RETURN_HEADERS = ("content-type", "content-encoding", "x-request-id", "retry-after", "openai-processing-ms")
#: Body fields the gateway owns: a client's value is dropped (the engine's
#: queue order is the policy's, not the caller's).
OWNED_FIELDS = ("priority",)
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no", "")
_MAX_SESSION_ID = 256


class ClientGone(Exception):
    """The client hung up while the gateway wrote to it (counted once as ``client_gone``)."""


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
    anonymous: bool = False


def error_body(status: int, kind: str, message: str, **extra: object) -> bytes:
    return json.dumps({"error": {"type": kind, "code": status, "message": message, **extra}}).encode()


def error_response(status: int, kind: str, message: str, headers: dict[str, str] | None = None,
                   **extra: object) -> web.Response:
    return web.Response(status=status, body=error_body(status, kind, message, **extra),
                        content_type="application/json", headers=headers)


def sse_error(status: int, kind: str, message: str) -> bytes:
    return b"event: error\ndata: " + error_body(status, kind, message) + b"\n\n"


class BodyWorkers:
    """A small process pool for the bodies too large (or compressed) to read on
    the event loop; started on first use (in a thread: starting a process
    blocks), replaced if a worker dies."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()

    def _start(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("forkserver")  # a fork of a process running an event loop is unsafe
        context.set_forkserver_preload(["basin.gateway.body"])  # not the main script: the workers need only this
        pool = ProcessPoolExecutor(self.workers, mp_context=context)
        pool.submit(int).result()  # the workers are up before the first body waits on them
        return pool

    async def _executor(self) -> Executor:
        async with self._starting:
            if self._pool is None:
                self._pool = await asyncio.to_thread(self._start)
        return self._pool

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(await self._executor(), fn, *args)
        except BrokenProcessPool:
            log.error("a body worker process died; starting a new one")
            self.close()
            return await loop.run_in_executor(await self._executor(), fn, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


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
        self.workers = BodyWorkers()
        #: The gateway is shutting down: a call cut at the deadline is told so.
        self.stopping = False
        #: Handlers of gated calls now running (the shutdown waits for them, then cuts them).
        self.active: set[asyncio.Task[Any]] = set()
        #: Why the upstream last failed (for /admin/state; clients get a plain message).
        self.last_upstream_error: str | None = None
        self._watched = tuple(dict.fromkeys((*config.session_body_fields, config.end_body_field, "session_id",
                                             "stream", "stream_options", *OWNED_FIELDS)))
        #: Credentials are kept as keyed digests, never as given.
        self._binding_key = secrets.token_bytes(32)
        self._log_upstream = EveryFewSeconds(log, logging.WARNING)

    # ------------------------------------------------------------ reading a call
    async def read_body(self, request: web.Request) -> tuple[bytes, bodies.BodyFacts]:
        """The plain JSON body and its facts, read within the body timeout and
        the size limits; large or compressed bodies are parsed off the event loop."""
        cfg = self.config
        try:
            async with asyncio.timeout(cfg.client_body_timeout_s):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BadCall(413, "body_too_large", f"request body exceeds {cfg.max_body_bytes} bytes; send a "
                          "smaller body or raise max_body_bytes in the gateway config") from None
        except TimeoutError:
            raise BadCall(408, "body_timeout", f"the request body did not arrive within "
                          f"{cfg.client_body_timeout_s:g} s (client_body_timeout_s); send it at once") from None
        encoding = request.headers.get("Content-Encoding")
        plain_encoding = encoding is None or encoding.strip().lower() in ("", "identity")
        try:
            if plain_encoding and len(raw) <= cfg.offload_body_bytes:
                return bodies.inspect(raw, None, cfg.max_body_bytes, self._watched)
            result: tuple[bytes, bodies.BodyFacts] = await self.workers.run(
                bodies.inspect, raw, encoding, cfg.max_body_bytes, self._watched)
            return result
        except bodies.BadBody as exc:
            raise BadCall(exc.status, exc.kind, exc.message) from None

    def read_call(self, request: web.Request, facts: bodies.BodyFacts, size: int) -> CallMeta:
        """Who the call is from and what it asks, by the session identity rules
        (docs/gateway.md, Sessions): the session header wins, then the body
        fields in their configured order; a call naming none is a session of one call."""
        cfg = self.config
        session_id: object = request.headers.get(cfg.session_header)
        source = f"header {cfg.session_header}"
        if session_id is None:
            for name in cfg.session_body_fields:
                if facts.values.get(name) is not None:
                    session_id, source = facts.values[name], f"body field '{name}'"
                    break
        anonymous = session_id is None
        if session_id is None:
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
        flag = facts.values.get(cfg.end_body_field)
        if flag is not None:
            if not isinstance(flag, bool):
                raise BadCall(400, "invalid_session_marker",
                              f"body field '{cfg.end_body_field}': expected true or false, got {str(flag)[:40]!r}")
            end = end or flag
        stream = facts.values.get("stream")
        if stream is None:  # absent or null: OpenAI's default, not streamed
            stream = False
        if not isinstance(stream, bool):
            raise BadCall(400, "invalid_field",
                          f"body field 'stream': expected true or false, got {str(stream)[:40]!r}")
        if request.path == "/v1/chat/completions" and not facts.has_messages:
            raise BadCall(400, "invalid_field", "body field 'messages': a chat completion needs a list of messages")
        if request.path == "/v1/completions" and not facts.has_prompt:
            raise BadCall(400, "invalid_field", "body field 'prompt': a completion needs a prompt")
        # Estimated by its text until the engine counts it (Gate.done hands the count to the policy).
        prompt_tokens = max(int((size - facts.media_chars) / cfg.chars_per_token), 1)
        return CallMeta(str(session_id), end, stream, prompt_tokens, facts.task_text, anonymous)

    def owner_of(self, request: web.Request, call: CallMeta) -> bytes | None:
        """The keyed digest of the credential the session is bound to (binding on), else None."""
        header = self.config.session_binding
        if header is None or call.anonymous:
            return None
        value = request.headers.get(header)
        if not value:
            raise BadCall(401, "missing_credential", f"header {header}: sessions are bound to the client's "
                          f"{header} at this gateway; send it with every call")
        return hmac.new(self._binding_key, value.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()

    # ------------------------------------------------------------ handlers
    def _refuse(self, status: int, kind: str, message: str) -> web.Response:
        self.telemetry.calls.labels("refused").inc()
        response = error_response(status, kind, message)
        if status in (408, 413):  # the body was not read to its end: the connection cannot carry another call
            response.force_close()
        return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self.active.add(task)
        try:
            return await self._completion(request, task)
        finally:
            self.active.discard(task)

    async def _completion(self, request: web.Request, task: asyncio.Task[Any]) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            plain, facts = await self.read_body(request)
            call = self.read_call(request, facts, len(plain))
            owner = self.owner_of(request, call)
        except BadCall as exc:
            return self._refuse(exc.status, exc.kind, str(exc))
        gate = self.gate
        now = self.clock()
        try:
            sess = gate.open_call(call.session_id, now, call.prompt_tokens, call.task_text, call.end, owner)
        except ShedError as exc:
            return self._shed_response(exc.reason, str(exc))
        except NotOwner:
            return self._refuse(403, "session_owner_mismatch",
                                f"session {call.session_id[:40]!r} was opened with another "
                                f"{self.config.session_binding}; use a session id of your own")
        response: web.StreamResponse | None = None
        waited = 0.0
        if gate.must_wait(sess):
            wait_start = time.perf_counter()
            try:
                response, verdict = await self._hold(request, sess, call)
            except ClientGone:
                self.telemetry.calls.labels("client_gone").inc()
                return web.Response(status=499)  # nobody reads it: the connection is gone
            waited = time.perf_counter() - wait_start
            self.telemetry.park_wait.observe(waited)
            if verdict is not SessionState.ADMITTED:
                reason = sess.shed_reason or "session ended while held"
                if response is not None:
                    self.telemetry.calls.labels("shed").inc()
                    await self._try_write(response, sse_error(503, "session_shed", f"the session was shed ({reason}); "
                                                              f"retry after {self.config.retry_after_s} s"))
                    return response
                return self._shed_response(reason, "the session was shed to protect the engine")
        payload = await self._payload(plain, facts, sess, call)
        headers = self._upstream_headers(request, sess)
        work = gate.forwarded(sess, call.prompt_tokens, self.clock())
        self.telemetry.added_latency.observe(time.perf_counter() - started - waited)
        usage: CallUsage | None = None
        refused = True
        try:
            usage, response, refused = await self._forward(request, sess, call, plain, facts, payload, headers,
                                                           response, work)
            return response
        except ClientGone as gone:
            # Hung up mid-answer: the engine took the call (its usage, if read, stands); no traceback.
            refused = False
            usage = gone.args[0] if gone.args else None
            self.telemetry.calls.labels("client_gone").inc()
            return response if response is not None else web.Response(status=499)
        except asyncio.CancelledError:
            refused = False
            if not self.stopping:
                self.telemetry.calls.labels("client_gone").inc()
                raise
            # Cut at the shutdown deadline: answer, so the client knows to retry.
            self.telemetry.calls.labels("shutdown").inc()
            task.uncancel()
            message = "the gateway is shutting down; retry the call"
            if response is not None:
                await self._try_write(response, sse_error(503, "gateway_shutdown", message))
                return response
            return error_response(503, "gateway_shutdown", message,
                                  headers={"Retry-After": str(self.config.retry_after_s)})
        finally:
            gate.done(sess, usage, self.clock(), refused)

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        try:
            async with self.client.get(self.config.upstream + request.path, headers=self._headers(request),
                                       allow_redirects=False) as up:
                data = await read_capped(up, self.config.max_upstream_body_bytes)
                return web.Response(status=up.status, body=data, headers=self._returned(up))
        except TooLarge as exc:
            return self._too_large_answer(exc)
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
                    await self._write(response, b": waiting for admission\n\n")
        except BaseException:
            self.gate.abandon(sess, waiter, self.clock())
            raise

    # ------------------------------------------------------------ forwarding
    def _headers(self, request: web.Request) -> dict[str, str]:
        headers = {name: request.headers[name] for name in _FORWARD_HEADERS if name in request.headers}
        headers["Accept-Encoding"] = "identity"
        return headers

    def _upstream_headers(self, request: web.Request, sess: GatewaySession) -> dict[str, str]:
        headers = self._headers(request)
        headers["Content-Type"] = "application/json"
        headers.update(self.adapter.affinity_headers(sess.session_id))
        return headers

    @staticmethod
    def _returned(up: aiohttp.ClientResponse) -> dict[str, str]:
        return {name: up.headers[name] for name in _RETURN_HEADERS if name in up.headers}

    def _changes(self, facts: bodies.BodyFacts, sess: GatewaySession,
                 call: CallMeta) -> tuple[tuple[str, ...], dict[str, object]]:
        """(fields to drop, fields to set) in the forwarded body: the end flag
        and the client's priority go; the engine's affinity field is the
        gateway's session id; the session's priority while the policy orders;
        the usage request for streams."""
        put: dict[str, object] = dict(self.adapter.affinity_body(sess.session_id))
        rank = self.gate.priority_rank(sess) if self.send_priority else None
        if rank is not None:
            put.update(self.adapter.priority_fields(rank))
        if call.stream and self.config.request_stream_usage:
            options = facts.values.get("stream_options")
            if options is None:
                put["stream_options"] = {"include_usage": True}
            elif isinstance(options, dict) and "include_usage" not in options:
                put["stream_options"] = {**options, "include_usage": True}
        return (self.config.end_body_field, *OWNED_FIELDS), put

    async def _payload(self, plain: bytes, facts: bodies.BodyFacts, sess: GatewaySession, call: CallMeta) -> bytes:
        remove, put = self._changes(facts, sess, call)
        if len(plain) > self.config.offload_body_bytes and bodies.needs_rewrite(facts, remove, put):
            result: bytes = await self.workers.run(bodies.rewrite, plain, facts, remove, put)
            return result
        return bodies.rewrite(plain, facts, remove, put)

    async def _forward(self, request: web.Request, sess: GatewaySession, call: CallMeta, plain: bytes,
                       facts: bodies.BodyFacts, payload: bytes, headers: dict[str, str],
                       response: web.StreamResponse | None, work_tokens: int
                       ) -> tuple[CallUsage | None, web.StreamResponse, bool]:
        """Send the call and relay the answer: (usage, response, whether the
        engine refused or never got it). ``work_tokens``: the call's prefill
        work in the gateway's backlog, cleared at the answer's first byte."""
        url = self.config.upstream + request.path
        sent_priority = self.send_priority and self.gate.priority_rank(sess) is not None
        for attempt in range(2):
            try:
                up = await self.client.post(url, data=payload, headers=headers, allow_redirects=False)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                self.telemetry.calls.labels("upstream_down").inc()
                status, kind, message = self._failure(exc)
                if response is not None:
                    await response.write(sse_error(status, kind, message))
                    return None, response, True
                return None, error_response(status, kind, message), True
            async with up:
                streaming = up.status == 200 and up.content_type == "text/event-stream"
                if streaming:
                    usage, response = await self._relay_stream(request, sess, up, response, work_tokens)
                    return usage, response, False
                try:
                    data = await read_capped(up, self.config.max_upstream_body_bytes)
                    self.gate.answering(sess, work_tokens)
                except TooLarge as exc:
                    self.telemetry.calls.labels("upstream_broke").inc()
                    if response is not None:
                        await response.write(sse_error(502, "upstream_failed", self._too_large_message(exc)))
                        return None, response, False
                    return None, self._too_large_answer(exc), False
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    self.telemetry.calls.labels("upstream_broke").inc()
                    self._note_upstream_failure(exc)
                    message = "the upstream engine failed while answering; the call may have run"
                    if response is not None:
                        await response.write(sse_error(502, "upstream_failed", message))
                        return None, response, False
                    return None, error_response(502, "upstream_failed", message), False
            if attempt == 0 and sent_priority and self._priority_refused(up.status, data):
                payload = await self._payload(plain, facts, sess, call)
                continue
            if up.status in (429, 503):
                self.telemetry.calls.labels("upstream_backpressure").inc()
            else:
                self.telemetry.calls.labels("ok" if up.status < 400 else "upstream_error").inc()
            ok = 200 <= up.status < 300
            usage = await self._usage_of(data, up.headers.get("Content-Encoding")) if ok else None
            if response is not None:  # a held stream already answered 200
                if ok:
                    await self._write(response, data, usage)
                else:
                    await self._write(response, sse_error(up.status, "upstream_error",
                                                          data.decode("utf-8", "replace")))
                return usage, response, not ok
            return usage, web.Response(status=up.status, body=data, headers=self._returned(up)), not ok
        raise AssertionError("unreachable: the second attempt always returns")

    def _priority_refused(self, status: int, data: bytes) -> bool:
        """vLLM refuses a non-zero priority unless it runs the priority
        scheduler: stop sending the field (loudly) and retry once without it."""
        if status != 400 or b"priority" not in data:
            return False
        self.send_priority = False
        self.adapter.disable_priority("the engine refused the field")
        log.error("the engine refused the 'priority' field (%s); the gateway stops sending it. Start vLLM "
                  "with --scheduling-policy priority (SGLang: --enable-priority-scheduling) to order "
                  "sessions inside the engine.", data[:200].decode("utf-8", "replace"))
        return True

    async def _relay_stream(self, request: web.Request, sess: GatewaySession, up: aiohttp.ClientResponse,
                            response: web.StreamResponse | None, work_tokens: int
                            ) -> tuple[CallUsage | None, web.StreamResponse]:
        if response is None:
            response = web.StreamResponse(status=up.status, headers=self._returned(up))
            try:
                await response.prepare(request)
            except (ConnectionError, RuntimeError):
                raise ClientGone(None) from None
        scanner = StreamUsage(up.headers.get("Content-Encoding"))
        answering = False
        try:
            async for chunk in up.content.iter_any():
                if not answering:  # the prompt is prefilled once the first bytes of the answer arrive
                    self.gate.answering(sess, work_tokens)
                    answering = True
                scanner.feed(chunk)
                await self._write(response, chunk, scanner)
        except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            self.telemetry.calls.labels("upstream_broke").inc()
            self._note_upstream_failure(exc)
            why = (f"sent nothing for {self.config.upstream_timeout_s:g} s" if isinstance(exc, TimeoutError)
                   else "closed the stream early")
            await self._write(response, sse_error(502, "upstream_failed", f"the upstream engine {why}"))
            return None, response
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            # Cut at the shutdown deadline: say so on the stream, if the client still listens.
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            self.telemetry.calls.labels("shutdown").inc()
            await self._try_write(response, sse_error(503, "gateway_shutdown",
                                                      "the gateway is shutting down; retry the call"))
            return None, response
        self.telemetry.calls.labels("ok").inc()
        return scanner.close(), response

    @staticmethod
    async def _write(response: web.StreamResponse, data: bytes, usage: CallUsage | StreamUsage | None = None) -> None:
        """Write to the client; a client that hung up is :class:`ClientGone` (carrying the
        usage read so far), never mistaken for the engine breaking. aiohttp's reset error is
        a ``ConnectionError`` and an ``aiohttp.ClientConnectionError`` at once."""
        try:
            await response.write(data)
        except (ConnectionError, RuntimeError):
            raise ClientGone(usage.close() if isinstance(usage, StreamUsage) else usage) from None

    async def _usage_of(self, data: bytes, encoding: str | None) -> CallUsage | None:
        """Usage of a whole answer, inflated for reading when the engine compressed it."""
        if encoding is None or encoding.strip().lower() in ("", "identity"):
            return usage_from_body(data)
        try:
            if len(data) <= self.config.offload_body_bytes // 16:
                plain = bodies.decode(data, encoding, self.config.max_upstream_body_bytes)
            else:
                plain = await self.workers.run(bodies.decode, data, encoding, self.config.max_upstream_body_bytes)
        except bodies.BadBody:
            return None
        return usage_from_body(plain)

    @staticmethod
    async def _try_write(response: web.StreamResponse, data: bytes) -> None:
        """Best effort on a connection about to close."""
        try:
            await asyncio.wait_for(response.write(data), 0.5)
        except (ConnectionError, TimeoutError, RuntimeError):
            pass

    # ------------------------------------------------------------ refusals
    def _shed_response(self, reason: str, message: str) -> web.Response:
        self.telemetry.calls.labels("shed").inc()
        retry = str(self.config.retry_after_s)
        return error_response(503, "session_shed", f"{message} (reason: {reason}); retry after {retry} s",
                              headers={"Retry-After": retry}, reason=reason)

    def _note_upstream_failure(self, exc: BaseException) -> None:
        text = str(exc) or "no detail"
        self.last_upstream_error = f"{self.config.upstream}: {type(exc).__name__}: {text}"
        self._log_upstream("upstream failure: %s", self.last_upstream_error)

    def _failure(self, exc: BaseException) -> tuple[int, str, str]:
        """(status, type, message) for a call the upstream never answered: a
        connection that could not be made is a 502, a silent upstream a 504."""
        self._note_upstream_failure(exc)
        if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError):
            return 504, "upstream_timeout", (f"the upstream engine sent nothing for "
                                             f"{self.config.upstream_timeout_s:g} s (upstream_timeout_s)")
        return 502, "upstream_unavailable", ("the upstream engine cannot be reached; the gateway's log and "
                                             "/admin/state name the cause")

    def _upstream_down(self, exc: BaseException) -> web.Response:
        status, kind, message = self._failure(exc)
        return error_response(status, kind, message)

    def _too_large_message(self, exc: TooLarge) -> str:
        return (f"the upstream's answer is longer than {exc.limit} bytes (max_upstream_body_bytes); stream "
                "it or raise the limit")

    def _too_large_answer(self, exc: TooLarge) -> web.Response:
        log.warning("an upstream answer was longer than max_upstream_body_bytes (%d) and was not relayed", exc.limit)
        return error_response(502, "upstream_failed", self._too_large_message(exc))
