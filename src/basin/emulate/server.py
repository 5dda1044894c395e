"""The emulator's HTTP driver: aiohttp in front of :class:`EmulatedEngine`.

The model runs on simulated time ``(wall - start) * speed``. Whenever a
request arrives, a stream polls, or the model's next event comes due, the
driver runs the model up to the wall clock's simulated time and sets one
timer for the next pending event, so a call answers at the wall time its
simulated finish maps to (``latency / speed`` after it was sent). Between
events nothing runs: an idle emulator costs nothing.

Streams send the first token at the call's first-token time and the rest at
the decode instance's current step cost, polled every ``step / speed`` wall
seconds (at least :data:`MIN_POLL_S`), the last one at the call's finish.

``POST /emulator/lending`` switches decode-memory lending, BASIN's engine
change, which no stock engine lets a client switch; the gateway's
``lending_url`` points here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import signal
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from basin.emulate.calls import ChatCall, RequestError, parse_chat, queue_priority
from basin.emulate.clock import SimClock
from basin.emulate.config import EmulatorConfig
from basin.emulate.engine import EmulatedCall, EmulatedEngine
from basin.emulate.exposition import View, metrics_text

log = logging.getLogger("basin.emulate")

#: Shortest wall time between two polls of a stream's progress. Each poll that
#: finds tokens is a write here, a read and a write in a gateway, and a read in
#: the client (a system call or two in each); at 30x a decode step is
#: about a millisecond of wall time, so the floor sets how many tokens a write
#: carries (some 50 there; at 1x, two), not when the first token or the finish
#: is sent (each at its own time). A client that counts ITL per write sees the
#: mean gap of the tokens it carries (the replay client does so).
MIN_POLL_S = 0.05
#: Largest request body accepted (aiohttp answers 413 beyond it).
MAX_BODY_BYTES = 64 * 1024 * 1024
#: Four-byte tokens: an answer of n tokens is 4n bytes, so a client that sends
#: it back in its next call is counted n tokens again (calls.BYTES_PER_TOKEN).
_VOCAB = (" the", " and", " run", " fix", " log", " api", " bug", " git", " cli", " job", " ack", " set",
          " map", " key", " row", " out", " new", " old", " add", " use", " try", " end", " can", " not")
_DUMPS = json.JSONEncoder(separators=(",", ":")).encode
#: Each vocabulary word as the JSON string an event carries.
_VOCAB_JSON = {w: _DUMPS(w).encode() for w in _VOCAB}
#: The word sequence answers are cut from: an answer's text is the slice at an
#: offset its conversation's digest picks (one draw per answer, not per token;
#: :class:`_Answer`). Long enough that an answer of the largest usual length
#: rarely repeats another's.
_TEXT_CYCLE_TOKENS = 1 << 16
_TEXT_CYCLE = tuple(random.Random(0).choices(_VOCAB, k=_TEXT_CYCLE_TOKENS))
_VIEWS: dict[str, View] = {"all": "all", "prefill": "prefill", "decode": "decode"}


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    """An OpenAI-style error body, naming the offending field in ``param``."""
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                        "code": status}}, status=status)


class _Answer:
    """The text and the JSON shapes of one call's response."""

    def __init__(self, rid: str, model: str, call: ChatCall, seed: int):
        self.rid, self.model, self.call = rid, model, call
        self.created = int(time.time())
        self.tokens = _answer_text(call.output_tokens, random.Random((seed << 64) ^ call.digest))
        self._events: dict[str, bytes] | None = None

    @property
    def finish_reason(self) -> str:
        return "length" if self.call.limited else "stop"

    def usage(self, handle: EmulatedCall) -> dict[str, Any]:
        n = self.call.output_tokens
        p = self.call.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n,
                "prompt_tokens_details": {"cached_tokens": handle.cached_tokens}}

    @staticmethod
    def timings(handle: EmulatedCall, speed: float) -> dict[str, float]:
        """The call's simulated times (seconds), for clients that compare with the simulator."""
        return {"arrival_s": handle.arrival_s, "first_token_s": handle.first_token_s,
                "finished_s": handle.finished_s, "ttft_s": handle.ttft_s, "latency_s": handle.latency_s,
                "speed": speed}

    def whole(self, handle: EmulatedCall, speed: float) -> dict[str, Any]:
        return {
            "id": self.rid, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(self.tokens)},
                         "finish_reason": self.finish_reason}],
            "usage": self.usage(handle), "emulator": self.timings(handle, speed),
        }

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": choices, **extra}
        return b"data: " + _DUMPS(obj).encode() + b"\n\n"

    def token_chunks(self, start: int, stop: int) -> bytes:
        """The stream events of tokens ``start`` to ``stop - 1``, as one write.

        Later tokens share one event shape, so it is encoded once and each
        token's JSON string is put in its place (streams are most of the
        emulator's work).
        """
        out: list[bytes] = []
        if start == 0 and stop > 0:
            first = {"role": "assistant", "content": self.tokens[0]}
            out.append(self.chunk([{"index": 0, "delta": first, "finish_reason": None}]))
            start = 1
        if start < stop:
            if self._events is None:
                # One event per vocabulary word, from the shape every later token shares.
                marker = "\x00token\x00"
                shape = self.chunk([{"index": 0, "delta": {"content": marker}, "finish_reason": None}])
                head, _, tail = shape.partition(_DUMPS(marker).encode())
                self._events = {w: head + text + tail for w, text in _VOCAB_JSON.items()}
            out.extend(map(self._events.__getitem__, self.tokens[start:stop]))
        return b"".join(out)


def _answer_text(n_tokens: int, rng: random.Random) -> list[str]:
    """``n_tokens`` words of the text cycle from a random offset (wrapping round)."""
    start = rng.randrange(_TEXT_CYCLE_TOKENS)
    words: list[str] = []
    while len(words) < n_tokens:
        words.extend(_TEXT_CYCLE[start:start + n_tokens - len(words)])
        start = 0
    return words


class EmulatorServer:
    """``basin emulate``: serve the engine model over HTTP until stopped."""

    def __init__(self, config: EmulatorConfig):
        self.config = config
        hardware, deployment = config.resolve()
        self.engine = EmulatedEngine(hardware, deployment,
                                     reserve_at_prefill_completion=config.reserve_at_prefill_completion)
        self.clock = SimClock(0.0, config.speed)
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._seq = 0

    # ------------------------------------------------------------------ life
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/metrics/{view}", self._metrics)
        app.router.add_get("/emulator/clock", self._clock)
        app.router.add_get("/emulator/lending", self._lending_state)
        app.router.add_post("/emulator/lending", self._lending)
        if self.config.metrics_style == "sglang":
            app.router.add_get("/get_server_info", self._server_info)
            app.router.add_get("/server_info", self._server_info)
        return app

    async def start(self) -> str:
        """Listen (port 0 picks a free one); simulated time 0 is now. Returns the base URL."""
        if self._runner is not None:
            raise RuntimeError("the emulator is already started")
        self._aloop = asyncio.get_running_loop()
        runner = web.AppRunner(self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.config.listen_host, self.config.listen_port)
        await site.start()
        self._runner = runner
        self.clock = SimClock(self._aloop.time(), self.config.speed)
        port = runner.addresses[0][1]
        self.url = f"http://{self.config.listen_host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Close the listener and drop calls in flight; safe to call twice."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ----------------------------------------------------------------- clock
    def sim_now(self) -> float:
        """The simulated time the wall clock says it is."""
        assert self._aloop is not None, "start() the emulator first"
        return self.clock.sim_at(self._aloop.time())

    def sync(self) -> None:
        """Run the model up to now and set the timer for its next event."""
        self.engine.advance(self.sim_now())
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self.engine.next_due_s
        if due is not None and self._aloop is not None:
            self._timer = self._aloop.call_at(self.clock.wall_at(due), self._wake, due)

    def _wake(self, due: float) -> None:
        # Timers may fire a clock tick early: run at least the event they were set for.
        self._timer = None
        self.engine.advance(max(self.sim_now(), due))
        self._arm()

    # ----------------------------------------------------------------- calls
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            call = parse_chat(await _json_body(request), default_max_tokens=self.config.default_max_tokens,
                              routing_key=request.headers.get("X-SMG-Routing-Key"))
            self.engine.check_fits(call)
        except RequestError as exc:
            return _error(400, str(exc), exc.field)
        self.sync()
        handle = self.engine.submit(call, queue_priority(call.priority, self.config.metrics_style),
                                    self.engine.now)
        first, done = asyncio.Event(), asyncio.Event()
        handle.listener = _listener(first, done)
        self._arm()
        self._seq += 1
        answer = _Answer(f"chatcmpl-emu-{self._seq}", call.model or self.config.model_id, call, self.config.seed)
        try:
            if call.stream:
                return await self._stream(request, handle, answer, first, done)
            await done.wait()
            return web.json_response(answer.whole(handle, self.config.speed), dumps=_DUMPS)
        finally:
            if not handle.finished and self.engine.withdraw(handle):
                self._arm()

    async def _stream(self, request: web.Request, handle: EmulatedCall, answer: _Answer,
                      first: asyncio.Event, done: asyncio.Event) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            await self._relay(resp, handle, answer, first, done)
        except ConnectionError:
            pass  # the client went away (before the headers or mid-stream); the call runs to its end in the model
        return resp

    async def _relay(self, resp: web.StreamResponse, handle: EmulatedCall, answer: _Answer,
                     first: asyncio.Event, done: asyncio.Event) -> None:
        await first.wait()
        sent = 0
        speed = self.config.speed
        while not handle.finished:
            ready = self.engine.generated(handle)
            if ready > sent:
                await resp.write(answer.token_chunks(sent, ready))
                sent = ready
            poll = max(self.engine.step_s(handle) / speed, MIN_POLL_S)
            try:
                async with asyncio.timeout(poll):  # no task per poll, as wait_for would make
                    await done.wait()
            except TimeoutError:
                self.sync()
        # The stream's end in one write: the tokens not sent yet, the finish, the usage, [DONE].
        end = [answer.token_chunks(sent, handle.call.output_tokens)] if sent < handle.call.output_tokens else []
        finish = [{"index": 0, "delta": {}, "finish_reason": answer.finish_reason}]
        if handle.call.include_usage:
            end += [answer.chunk(finish), answer.chunk([], usage=answer.usage(handle),
                                                       emulator=answer.timings(handle, speed))]
        else:
            end.append(answer.chunk(finish, emulator=answer.timings(handle, speed)))
        end.append(b"data: [DONE]\n\n")
        await resp.write(b"".join(end))
        await resp.write_eof()

    async def _completions(self, request: web.Request) -> web.Response:
        return _error(404, "the emulator serves chat only: POST /v1/chat/completions with 'messages'", "prompt")

    # ----------------------------------------------------------- information
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.config.model_id, "object": "model", "created": 0, "owned_by": "basin-emulate"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        name = request.match_info.get("view", "all")
        style = self.config.metrics_style
        view = _VIEWS.get(name) if style == "sglang" else _VIEWS.get(name) if name == "all" else None
        if view is None:
            views = "/metrics, /metrics/prefill, /metrics/decode" if style == "sglang" else "/metrics"
            return _error(404, f"no metrics view {name!r}; this emulator serves {views}")
        self.sync()
        text = metrics_text(self.engine, style, self.config.model_id, view)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _clock(self, request: web.Request) -> web.Response:
        self.sync()
        return web.json_response({"sim_s": self.engine.now, "speed": self.config.speed,
                                  "calls_in_flight": self.engine.calls_in_flight,
                                  "calls_finished": self.engine.calls_finished})

    async def _lending(self, request: web.Request) -> web.Response:
        """Switch decode-memory lending at the simulated now; answers the resulting state."""
        try:
            on, cap_fraction = parse_lending(await _json_body(request))
        except RequestError as exc:
            return _error(400, str(exc), exc.field)
        self.sync()
        before = self.engine.lending_on
        state = self.engine.lending(on, cap_fraction)
        self._arm()
        if state.on != before:
            log.info("decode-memory lending %s at simulated %.1f s", "on" if state.on else "off", self.engine.now)
        return web.json_response(dataclasses.asdict(state))

    async def _lending_state(self, request: web.Request) -> web.Response:
        self.sync()
        return web.json_response(dataclasses.asdict(self.engine.lending_state()))

    async def _server_info(self, request: web.Request) -> web.Response:
        """SGLang's server info: priority scheduling on, higher values first (its default)."""
        eng = self.engine
        dep = eng.deployment
        return web.json_response({
            "model_path": self.config.model_id, "served_model_name": self.config.model_id,
            "enable_priority_scheduling": True, "schedule_low_priority_values_first": False,
            "enable_metrics": True, "enable_cache_report": True,
            "max_total_num_tokens": sum(f.pool_tokens for f in eng.cluster.prefill_figures()),
            "page_size": eng.hardware.page_tokens, "version": "basin-emulate",
            "emulator": {"deployment": dep.name, "hardware": dep.hardware, "shape": dep.shape,
                         "host_ratio": dep.host_ratio, "router": dep.router, "speed": self.config.speed},
        })


async def _json_body(request: web.Request) -> object:
    """The request's JSON body; :class:`RequestError` on ``(body)`` when it is not JSON."""
    try:
        return await request.json()
    except ValueError:
        raise RequestError("(body)", "the request body is not valid JSON") from None


def parse_lending(body: object) -> tuple[bool, float | None]:
    """``{"on": true}`` (and optionally ``"cap_fraction"``, the cap of lent memory as a share of decode KV)
    as ``(on, cap_fraction)``; :class:`RequestError` names the bad field."""
    if not isinstance(body, dict):
        raise RequestError("(body)", 'expected a JSON object such as {"on": true}')
    for name in body:
        if name not in ("on", "cap_fraction"):
            raise RequestError(str(name), "unknown; the body takes 'on' (true or false) and optionally "
                               "'cap_fraction' (a share of decode KV in (0, 1])")
    if "on" not in body:
        raise RequestError("on", "required: true to lend idle decode memory as prefix cache, false to stop")
    on = body["on"]
    if not isinstance(on, bool):
        raise RequestError("on", f"expected true or false, got {on!r}")
    cap = body.get("cap_fraction")
    if cap is None:
        return on, None
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0.0 < cap <= 1.0:
        raise RequestError("cap_fraction", f"expected a number in (0, 1], got {cap!r}")
    return on, float(cap)


def _listener(first: asyncio.Event, done: asyncio.Event) -> Callable[[EmulatedCall], None]:
    def hear(handle: EmulatedCall) -> None:
        first.set()
        if handle.finished:
            done.set()
    return hear


async def serve_forever(config: EmulatorConfig, announce: Callable[[str], None] = print) -> None:
    """Serve until SIGINT or SIGTERM."""
    server = EmulatorServer(config)
    url = await server.start()
    dep = server.engine.deployment
    announce(f"basin emulate: {dep.name} ({dep.shape} {dep.hardware}, host ratio {dep.host_ratio:g}, "
             f"{config.metrics_style} metrics) at {config.speed:g}x on {url}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - platforms without signal handlers
            pass
    try:
        await stop.wait()
    finally:
        await server.stop()
