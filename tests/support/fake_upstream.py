"""A fast, deterministic fake OpenAI-compatible engine.

Real engines are slow or absent on a test machine, so the gateway's fault tests
and its latency benchmark talk to this one instead: it answers in microseconds,
streams in the OpenAI chunk format, emulates a session-keyed prefix cache (so
cached-token accounting can be checked), serves ``/metrics`` in the format of
the engine it impersonates with counters that count what it really served, and
fails on demand (death mid-stream, error statuses, hangs, a refusal of large
prompts, huge /metrics texts and answers, a server still loading its model).

    python -m tests.support.fake_upstream --port 8100 --tokens 16 --engine llamacpp   # from the repository root
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

ENGINES = ("sglang", "vllm", "llamacpp", "none")
MODEL_ID = "fake-model"
# Emulated KV capacity of one cache slot, in tokens: turns resident prompts
# into the engines' KV-usage gauges and SGLang's max_total_num_tokens.
SLOT_TOKENS = 8192
# Deterministic token texts, cycled.
_WORDS = (" the", " fake", " engine", " streams", " one", " word", " per", " chunk")
_STATUS_MODE = re.compile(r"^status:(\d{3})$")
_DUMPS = json.JSONEncoder(separators=(",", ":")).encode
_JSON_KEY = web.RequestKey("fake_upstream_json", object)


@dataclass(frozen=True)
class FakeUpstreamConfig:
    """How the fake engine answers; frozen so a swap via set_config is atomic."""

    completion_tokens: int = 16
    token_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    engine: str = "llamacpp"
    cache_slots: int = 4
    fail_mode: str | None = None
    #: Calls whose body is longer than this get a 400 (a context-length refusal); None: no limit.
    refuse_body_bytes: int | None = None
    #: Unrelated series added to /metrics until it is this long (a huge scrape); 0: none.
    metrics_padding_bytes: int = 0
    #: Extra bytes in every non-streamed answer (a huge answer); 0: none.
    answer_padding_bytes: int = 0
    #: False: /props answers 503 "Loading model", as llama-server does while it starts.
    loaded: bool = True

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.completion_tokens < 1:
            raise ValueError("completion_tokens must be at least 1")
        if self.token_delay_s < 0 or self.first_token_delay_s < 0:
            raise ValueError("delays must be non-negative")
        if self.cache_slots < 0:
            raise ValueError("cache_slots must be non-negative")
        if self.metrics_padding_bytes < 0 or self.answer_padding_bytes < 0:
            raise ValueError("padding sizes must be non-negative")
        if self.refuse_body_bytes is not None and self.refuse_body_bytes < 0:
            raise ValueError("refuse_body_bytes must be non-negative or None")
        if self.fail_mode not in (None, "die_mid_stream", "hang") and not _STATUS_MODE.match(self.fail_mode):
            raise ValueError(
                f"fail_mode must be None, 'die_mid_stream', 'hang' or 'status:NNN', got {self.fail_mode!r}")


def count_tokens(text: str) -> int:
    """The fake tokenizer: four characters a token, never zero."""
    return max(1, len(text) // 4)


class _PrefixCache:
    """LRU of session key -> the last prompt text seen, as many sessions as slots.

    A prompt that extends a resident session's cached prompt (its JSON text
    minus the closing character is a prefix of the new one) reuses it, as a
    growing agent context does on a real engine.
    """

    def __init__(self) -> None:
        self._entries: OrderedDict[str, str] = OrderedDict()

    def admit(self, key: str, text: str, prompt_tokens: int, slots: int) -> int:
        """Cached tokens of this prompt; then the prompt becomes the session's entry."""
        old = self._entries.get(key)
        cached = 0
        if old is not None and text.startswith(old[:-1]):
            # Engines always recompute at least the last prompt token.
            cached = min(count_tokens(old), prompt_tokens - 1)
        if slots > 0:
            self._entries[key] = text
            self._entries.move_to_end(key)
            while len(self._entries) > slots:
                self._entries.popitem(last=False)
        else:
            self._entries.clear()
        return cached

    @property
    def keys(self) -> list[str]:
        """Resident session keys, least recently used first."""
        return list(self._entries)

    @property
    def resident_tokens(self) -> int:
        return sum(count_tokens(t) for t in self._entries.values())


class _Counters:
    """What was served, read by /metrics (all tokens counts include cached ones)."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.running = 0
        self.waiting = 0
        # SGLang's cache_hit_rate is a gauge over its last logging interval:
        # here, over the calls since the previous scrape.
        self.window_prompt = 0
        self.window_cached = 0
        self.hit_rate = 0.0

    def scrape_hit_rate(self) -> float:
        if self.window_prompt:
            self.hit_rate = self.window_cached / self.window_prompt
            self.window_prompt = self.window_cached = 0
        return self.hit_rate


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    """An OpenAI-style error body, as real servers send it."""
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status,
                             headers=headers)


class FakeUpstream:
    """An OpenAI-compatible engine stand-in on aiohttp.web; see the module docstring."""

    def __init__(self, config: FakeUpstreamConfig = FakeUpstreamConfig(), *, record: bool = True) -> None:
        """``record=False`` keeps ``requests`` empty (long benchmark runs)."""
        self.config = config
        self.requests: list[dict[str, Any]] = []
        self._record = record
        self._cache = _PrefixCache()
        self._counters = _Counters()
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self._started_at = time.monotonic()
        self._seq = 0
        self._padding = ""

    def set_config(self, config: FakeUpstreamConfig) -> None:
        """Change behaviour at run time; calls already in progress keep the old one."""
        self.config = config

    @property
    def cached_sessions(self) -> list[str]:
        """Session keys resident in the emulated prefix cache, LRU first."""
        return self._cache.keys

    def _app(self) -> web.Application:
        middlewares = [self._recorder] if self._record else []
        app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_get("/props", self._props)
        app.router.add_get("/health", self._health)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on host:port (0 = any free port); returns the base URL."""
        if self._runner is not None:
            raise RuntimeError("FakeUpstream already started")
        self._stopping = asyncio.Event()
        # handler_cancellation: a call whose client went away ends, as engines
        # abort requests on disconnect (so the running/waiting gauges stay true).
        runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        self._started_at = time.monotonic()
        bound_port = runner.addresses[0][1]
        return f"http://{host}:{bound_port}"

    async def stop(self) -> None:
        """Release hung calls and close the server; safe to call twice."""
        self._stopping.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ---------------------------------------------------------------- requests

    @web.middleware
    async def _recorder(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = await self._body(request) if request.method == "POST" else None
        self.requests.append(
            {
                "path": request.path,
                "headers": dict(request.headers),
                "body": body,
                "at_s": time.monotonic() - self._started_at,
            }
        )
        return await handler(request)

    @staticmethod
    async def _body(request: web.Request) -> Any:
        """The parsed JSON body, or None when absent or malformed (parsed once)."""
        if _JSON_KEY not in request:
            raw = await request.read()
            try:
                request[_JSON_KEY] = json.loads(raw) if raw else None
            except ValueError:
                request[_JSON_KEY] = None
        return request[_JSON_KEY]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        cfg = self.config
        if cfg.refuse_body_bytes is not None and len(await request.read()) > cfg.refuse_body_bytes:
            return _error(400, f"the prompt is longer than the context ({cfg.refuse_body_bytes} bytes)")
        body = await self._body(request)
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "'messages' must be a non-empty list")
            text = _DUMPS(messages)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, (str, list)) or not prompt:
                return _error(400, "'prompt' must be a non-empty string or list")
            text = _DUMPS(prompt)
        if cfg.fail_mode is not None and (m := _STATUS_MODE.match(cfg.fail_mode)):
            status = int(m.group(1))
            return _error(status, f"fake upstream configured to answer {status}", "server_error")
        if cfg.fail_mode == "hang":
            # Held like a request stuck in an engine queue; stop() drops it.
            self._counters.waiting += 1
            try:
                await self._stopping.wait()
            finally:
                self._counters.waiting -= 1
            _drop(request)
            return web.Response(status=503)

        prompt_tokens = count_tokens(text)
        cached = self._cache.admit(_session_key(request, body, chat, text), text, prompt_tokens, cfg.cache_slots)
        n_tokens = cfg.completion_tokens
        finish = "stop"
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if isinstance(max_tokens, int) and 0 < max_tokens < n_tokens:
            n_tokens, finish = max_tokens, "length"
        c = self._counters
        c.prompt_tokens += prompt_tokens
        c.cached_tokens += cached
        c.window_prompt += prompt_tokens
        c.window_cached += cached
        c.running += 1
        self._seq += 1
        call = _Call(
            rid=f"{'chatcmpl' if chat else 'cmpl'}-fake-{self._seq}",
            model=str(body.get("model") or MODEL_ID),
            chat=chat,
            prompt_tokens=prompt_tokens,
            cached=cached,
            n_tokens=n_tokens,
            finish=finish,
        )
        try:
            if body.get("stream"):
                opts = body.get("stream_options")
                include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
                return await self._stream(request, cfg, call, include_usage)
            return await self._whole(request, cfg, call)
        finally:
            c.running -= 1

    async def _stream(
        self, request: web.Request, cfg: FakeUpstreamConfig, call: _Call, include_usage: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            if cfg.first_token_delay_s:
                await asyncio.sleep(cfg.first_token_delay_s)
            for i in range(call.n_tokens):
                if i and cfg.token_delay_s:
                    await asyncio.sleep(cfg.token_delay_s)
                if cfg.fail_mode == "die_mid_stream" and i == 2:
                    _drop(request)
                    return resp
                await resp.write(_sse(call.token_chunk(i)))
                self._counters.completion_tokens += 1
            if include_usage:
                # OpenAI's order: the finish chunk, then a usage chunk without choices.
                await resp.write(_sse(call.chunk([call.finish_choice()], None, None)))
                await resp.write(_sse(call.chunk([], call.usage(), call.timings())))
            else:
                await resp.write(_sse(call.chunk([call.finish_choice()], None, call.timings())))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionError:
            pass  # the client went away; nothing left to send to
        return resp

    async def _whole(self, request: web.Request, cfg: FakeUpstreamConfig, call: _Call) -> web.StreamResponse:
        delay = cfg.first_token_delay_s + cfg.token_delay_s * (call.n_tokens - 1)
        if delay:
            await asyncio.sleep(delay)
        whole = call.whole()
        if cfg.answer_padding_bytes:
            whole["padding"] = "x" * cfg.answer_padding_bytes
        payload = _DUMPS(whole).encode()
        if cfg.fail_mode == "die_mid_stream":
            # Promise the whole body, send half, then drop the connection.
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = len(payload)
            await resp.prepare(request)
            await resp.write(payload[: len(payload) // 2])
            self._counters.completion_tokens += 2
            _drop(request)
            return resp
        self._counters.completion_tokens += call.n_tokens
        return web.Response(body=payload, content_type="application/json")

    # ------------------------------------------------------------ information

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "basin-fake"}]}
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _server_info(self, request: web.Request) -> web.Response:
        """SGLang's /get_server_info: server args plus scheduler facts."""
        return web.json_response(
            {
                "model_path": MODEL_ID,
                "served_model_name": MODEL_ID,
                "enable_priority_scheduling": True,
                "schedule_low_priority_values_first": False,
                "enable_metrics": True,
                "enable_cache_report": True,
                "max_total_num_tokens": self.config.cache_slots * SLOT_TOKENS,
                "version": "fake",
            }
        )

    async def _props(self, request: web.Request) -> web.Response:
        """llama.cpp's /props: one slot per emulated cache session."""
        if not self.config.loaded:
            return _error(503, "Loading model", "unavailable_error")
        return web.json_response(
            {
                "default_generation_settings": {"n_ctx": SLOT_TOKENS, "params": {"cache_prompt": True}},
                "total_slots": self.config.cache_slots,
                "model_path": MODEL_ID,
                "build_info": "fake",
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        engine = self.config.engine
        if engine == "none":
            return web.Response(status=404, text="404: Not Found")
        text = self.metrics_text()
        padding = self.config.metrics_padding_bytes - len(text)
        if padding > 0:
            # Histogram buckets of a series the gateway does not read, as big engines export by the thousand.
            line = 'fake_unread_seconds_bucket{le="0.001",model_name="fake-model",rank="%06d"} 1.0\n'
            text += "".join(line % i for i in range(padding // (len(line) - 2) + 1))
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    def metrics_text(self) -> str:
        """The Prometheus exposition the impersonated engine would send now."""
        c = self._counters
        capacity = self.config.cache_slots * SLOT_TOKENS
        usage = min(1.0, self._cache.resident_tokens / capacity) if capacity else 0.0
        engine = self.config.engine
        out: list[str] = []
        if engine == "llamacpp":
            # llama.cpp's prompt counter excludes tokens reused from the cache.
            _family(out, "llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
                    c.prompt_tokens - c.cached_tokens)
            _family(out, "llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from cache.",
                    c.cached_tokens)
            _family(out, "llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
                    c.completion_tokens)
            _family(out, "llamacpp:requests_processing", "gauge", "Number of requests processing.", c.running)
            _family(out, "llamacpp:requests_deferred", "gauge", "Number of requests deferred.", c.waiting)
        elif engine == "sglang":
            lab = f'{{model_name="{MODEL_ID}"}}'
            _family(out, "sglang:prompt_tokens", "counter", "Number of prefill tokens processed.", c.prompt_tokens, lab,
                    "_total")
            _family(out, "sglang:cached_tokens", "counter", "Number of cached prompt tokens.", c.cached_tokens, lab,
                    "_total")
            _family(out, "sglang:generation_tokens", "counter", "Number of generation tokens processed.",
                    c.completion_tokens, lab, "_total")
            _family(out, "sglang:num_running_reqs", "gauge", "The number of running requests.", c.running, lab)
            _family(out, "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", c.waiting,
                    lab)
            _family(out, "sglang:token_usage", "gauge", "The token usage.", usage, lab)
            _family(out, "sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", c.scrape_hit_rate(), lab)
            _family(out, "sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV pool.",
                    capacity, lab)
        elif engine == "vllm":
            lab = f'{{engine="0",model_name="{MODEL_ID}"}}'
            _family(out, "vllm:prefix_cache_queries", "counter", "Prefix cache queries, in tokens.", c.prompt_tokens,
                    lab, "_total")
            _family(out, "vllm:prefix_cache_hits", "counter", "Prefix cache hits, in tokens.", c.cached_tokens, lab,
                    "_total")
            _family(out, "vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", c.prompt_tokens, lab,
                    "_total")
            _family(out, "vllm:generation_tokens", "counter", "Number of generation tokens processed.",
                    c.completion_tokens, lab, "_total")
            _family(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                    c.running, lab)
            _family(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", c.waiting,
                    lab)
            _family(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage, lab)
        return "\n".join(out) + "\n"


@dataclass
class _Call:
    """One accepted completion call: builds its chunks and its whole response."""

    rid: str
    model: str
    chat: bool
    prompt_tokens: int
    cached: int
    n_tokens: int
    finish: str

    def __post_init__(self) -> None:
        self.created = int(time.time())

    def text(self, i: int) -> str:
        return _WORDS[i % len(_WORDS)]

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.n_tokens,
            "total_tokens": self.prompt_tokens + self.n_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }

    def timings(self) -> dict[str, Any]:
        """llama.cpp's per-response timings: cache_n reused, prompt_n computed."""
        return {"cache_n": self.cached, "prompt_n": self.prompt_tokens - self.cached, "predicted_n": self.n_tokens}

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None,
              timings: dict[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            out["usage"] = usage
        if timings is not None:
            out["timings"] = timings
        return out

    def token_chunk(self, i: int) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"content": self.text(i)}
            if i == 0:
                delta["role"] = "assistant"
            choice = {"index": 0, "delta": delta, "finish_reason": None}
        else:
            choice = {"index": 0, "text": self.text(i), "logprobs": None, "finish_reason": None}
        return self.chunk([choice], None, None)

    def finish_choice(self) -> dict[str, Any]:
        if self.chat:
            return {"index": 0, "delta": {}, "finish_reason": self.finish}
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": self.finish}

    def whole(self) -> dict[str, Any]:
        text = "".join(self.text(i) for i in range(self.n_tokens))
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": self.finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish}
        return {
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
            "timings": self.timings(),
        }


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + _DUMPS(obj).encode() + b"\n\n"


def _drop(request: web.Request) -> None:
    """End the TCP connection without ending the response, as a crashing
    engine does (close, not abort: what was written still reaches the client)."""
    if request.transport is not None:
        request.transport.close()


def _family(
    out: list[str], name: str, kind: str, help_text: str, value: float, labels: str = "", suffix: str = ""
) -> None:
    """One metric family in Prometheus text format (prometheus_client style:
    counters declared without ``_total`` get it on the sample)."""
    out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")
    out.append(f"{name}{suffix}{labels} {float(value)}")


def _session_key(request: web.Request, body: dict[str, Any], chat: bool, text: str) -> str:
    """body session_id, else the X-SMG-Routing-Key header, else the first
    message's content (completions: the prompt's first 64 characters)."""
    sid = body.get("session_id")
    if isinstance(sid, str) and sid:
        return sid
    header = request.headers.get("X-SMG-Routing-Key")
    if header:
        return header
    if chat:
        first = body["messages"][0]
        content = first.get("content") if isinstance(first, dict) else first
        return content if isinstance(content, str) else _DUMPS(content)
    return text[:64]


async def _serve(upstream: FakeUpstream, host: str, port: int) -> None:
    url = await upstream.start(host, port)
    print(f"fake upstream ({upstream.config.engine}) listening on {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await upstream.stop()


def main(argv: list[str] | None = None) -> None:
    """CLI: serve until Ctrl-C; prints the base URL on its first line."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.fake_upstream", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100, help="0 = any free port")
    parser.add_argument("--tokens", type=int, default=16, help="completion tokens per response")
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds between streamed chunks")
    parser.add_argument("--first-token-delay", type=float, default=0.0)
    parser.add_argument("--engine", default="llamacpp", choices=ENGINES)
    parser.add_argument("--cache-slots", type=int, default=4)
    parser.add_argument("--fail-mode", default=None, help="die_mid_stream | hang | status:NNN")
    parser.add_argument("--record", action="store_true", help="keep every request in memory (off: long runs)")
    args = parser.parse_args(argv)
    config = FakeUpstreamConfig(
        completion_tokens=args.tokens,
        token_delay_s=args.token_delay,
        first_token_delay_s=args.first_token_delay,
        engine=args.engine,
        cache_slots=args.cache_slots,
        fail_mode=args.fail_mode,
    )
    try:
        asyncio.run(_serve(FakeUpstream(config, record=args.record), args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
