"""Client connections: a ceiling on how many are served at once, a deadline for
idle and slow ones, and JSON errors for requests that are not valid HTTP.

aiohttp already closes a connection whose request headers have not arrived
``keepalive_timeout`` after it opened or after its last answer (idle keep-alive
and slow headers alike, since trickling bytes do not restart that clock). What
it lacks is a connection limit, a word in the log when such limits bite, and
error answers in the gateway's JSON shape that do not echo what the client
sent; :class:`GuardedRunner` adds them through aiohttp's request handler,
which this module is the only place to touch.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from basin.gateway.netio import EveryFewSeconds

log = logging.getLogger("basin.gateway")


class ConnectionGuard:
    """The limit and its counters, shared by the server and its connections."""

    def __init__(self, max_connections: int, idle_timeout_s: float, refuse_grace_s: float = 1.0):
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        #: How long a connection over the limit may take to send the request it gets the 503 on.
        self.refuse_grace_s = refuse_grace_s
        self.events = {"over_limit": 0, "idle_closed": 0}
        #: Called for each request answered with the over-limit 503 (the gateway counts it as a call).
        self.on_refused: Callable[[], object] = lambda: None
        self._log_limit = EveryFewSeconds(log, logging.WARNING)
        self._log_idle = EveryFewSeconds(log, logging.INFO, period_s=60.0)

    def over_limit(self, open_connections: int) -> None:
        self.events["over_limit"] += 1
        self._log_limit("connection limit reached: %d client connections open (max_connections %d); new "
                        "ones get a 503 and are closed", open_connections, self.max_connections)

    def idle_closed(self) -> None:
        self.events["idle_closed"] += 1
        self._log_idle("closed a client connection that sent no complete request for %g s "
                       "(client_idle_timeout_s)", self.idle_timeout_s)


def _json_error(status: int, kind: str, message: str) -> web.Response:
    body = json.dumps({"error": {"type": kind, "code": status, "message": message}}).encode()
    resp = web.Response(status=status, body=body, content_type="application/json")
    resp.force_close()
    return resp


class _GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol, with the guard's hooks."""

    guard: ConnectionGuard
    over_limit = False

    def _process_keepalive(self) -> None:
        waiting = self._waiter is not None and not self._waiter.done()
        if (waiting and self._keepalive and not self._force_close
                and self._loop.time() >= self._next_keepalive_close_time):
            self.guard.idle_closed()
        super()._process_keepalive()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            log.error("the gateway failed on a request from %s", request.remote, exc_info=exc)
        else:
            log.debug("a request from %s is not valid HTTP: %s", request.remote, message)
        if request.writer.output_size > 0:
            raise ConnectionError("the response has begun; no error answer can follow")
        if status >= 500:
            return _json_error(status, "internal_error", "the gateway failed on this request; its log has the cause")
        return _json_error(status, "bad_request", "the request is not valid HTTP/1.1 (its request line, a header "
                           "or its framing is malformed or too long)")


class _GuardedServer(web.Server):
    guard: ConnectionGuard

    def __call__(self) -> RequestHandler:
        handler = _GuardedHandler(self, loop=self._loop, **self._kwargs)
        handler.guard = self.guard
        return handler

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self._connections) > self.guard.max_connections and isinstance(handler, _GuardedHandler):
            handler.over_limit = True
            self.guard.over_limit(len(self._connections))
            self._loop.call_later(self.guard.refuse_grace_s, handler.force_close)


@web.middleware
async def refuse_over_limit(request: web.Request, handler: Any) -> web.StreamResponse:
    """A request on a connection past the limit gets a 503 that says so."""
    protocol = request.protocol
    if isinstance(protocol, _GuardedHandler) and protocol.over_limit:
        protocol.guard.on_refused()
        resp = _json_error(503, "too_many_connections", "the gateway serves its maximum number of client "
                           "connections (max_connections); retry shortly")
        resp.headers["Retry-After"] = "1"
        return resp
    response: web.StreamResponse = await handler(request)
    return response


class GuardedRunner(web.AppRunner):
    """An AppRunner whose connections are guarded by ``guard``."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any):
        super().__init__(app, **kwargs)
        self.guard = guard

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer
        server.guard = self.guard  # type: ignore[attr-defined]
        return server
