"""The HTTP side of calibration: one chat call, streamed and timed, and the
engine's side files (/metrics, /v1/models, /props, /get_server_info).

Every call streams (``stream_options.include_usage``), so one call gives its
time to first token, the time of each later chunk and its usage. Where the
answer carries the engine's own timings (llama.cpp's ``timings``, the
emulator's simulated ``emulator`` times) they are kept beside the client's
wall-clock ones, and the fits use them: they leave out the client's and the
loopback's jitter (and, for the emulator, they are its simulated seconds).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from basin.errors import BasinInputError


class CallRefused(Exception):
    """The engine answered a call with an HTTP error (too long a prompt, a bad field)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(slots=True)
class CallSample:
    """One timed call: what the engine counted and when each part arrived (seconds)."""

    prompt_tokens: int
    output_tokens: int
    #: Prompt tokens the engine did not compute (``prompt_tokens_details.cached_tokens``); None when not reported.
    cached_tokens: int | None
    ttft_s: float
    latency_s: float
    #: Arrival of each chunk that carried a choice, from the request's start (wall clock).
    chunk_s: list[float] = field(default_factory=list)
    #: The engine's own time to first token and decode time, when its answer reports them.
    engine_ttft_s: float | None = None
    engine_decode_s: float | None = None
    #: Wall-clock start of the request (monotonic), to line calls of a batch up.
    start_s: float = 0.0

    @property
    def clock(self) -> str:
        return "engine" if self.engine_ttft_s is not None else "wall"

    def first_token_s(self) -> float:
        """Time to first token, by the engine's clock when it reports one."""
        return self.engine_ttft_s if self.engine_ttft_s is not None else self.ttft_s

    def decode_s(self) -> float:
        """From the first token to the last, by the engine's clock when it reports one."""
        if self.engine_decode_s is not None:
            return self.engine_decode_s
        return self.latency_s - self.ttft_s


def _engine_times(body: dict[str, Any]) -> tuple[float | None, float | None]:
    emu = body.get("emulator")
    if isinstance(emu, dict) and "ttft_s" in emu and "latency_s" in emu:
        return float(emu["ttft_s"]), float(emu["latency_s"]) - float(emu["ttft_s"])
    timings = body.get("timings")
    if isinstance(timings, dict) and "prompt_ms" in timings and "predicted_ms" in timings:
        return float(timings["prompt_ms"]) / 1e3, float(timings["predicted_ms"]) / 1e3
    return None, None


class EngineClient:
    """An OpenAI-compatible engine at ``url``, called over one connection pool."""

    def __init__(self, url: str, model: str | None, extra_body: dict[str, Any], timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.model = model
        self.extra_body = extra_body
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EngineClient:
        # A fresh connection a call: some servers (llama.cpp) close a streamed
        # answer's connection, and a reused one then fails to write.
        self._session = aiohttp.ClientSession(timeout=self._timeout,
                                              connector=aiohttp.TCPConnector(limit=0, force_close=True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use EngineClient as an async context manager"
        return self._session

    async def get_text(self, path: str) -> tuple[int, str]:
        """``(status, body)`` of a GET; status 0 when nothing answers there."""
        try:
            async with self.session.get(self.url + path, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                return resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError):
            return 0, ""

    async def get_json(self, path: str) -> Any:
        status, text = await self.get_text(path)
        if status != 200:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    async def reachable(self) -> None:
        """Fail with one line when nothing answers at the URL."""
        try:
            async with self.session.get(self.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=15)) as resp:
                await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            raise BasinInputError(f"--engine {self.url}: cannot reach the engine ({reason}); start it, or give the "
                                  "URL it listens on (e.g. http://127.0.0.1:8000)") from None

    async def chat(self, messages: list[dict[str, str]], max_tokens: int) -> CallSample:
        """One streamed chat completion of exactly ``max_tokens`` output tokens (where the engine obeys)."""
        body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                "stream": True, "stream_options": {"include_usage": True}, **self.extra_body}
        if self.model:
            body["model"] = self.model
        start = time.monotonic()
        chunks: list[float] = []
        usage: dict[str, Any] | None = None
        engine_ttft: float | None = None
        engine_decode: float | None = None
        try:
            async with self.session.post(self.url + "/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    text = await resp.text()
                    raise CallRefused(resp.status, _error_message(text))
                buffer = b""
                async for data in resp.content.iter_any():
                    now = time.monotonic() - start
                    buffer += data
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            continue
                        try:
                            event = json.loads(payload)
                        except ValueError:
                            continue
                        if not isinstance(event, dict):
                            continue
                        if event.get("choices"):
                            chunks.append(now)
                        if isinstance(event.get("usage"), dict):
                            usage = event["usage"]
                        t, d = _engine_times(event)
                        if t is not None:
                            engine_ttft, engine_decode = t, d
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise BasinInputError(f"--engine {self.url}: the engine dropped a call ({exc or type(exc).__name__}); "
                                  "is it still running?") from None
        end = time.monotonic() - start
        if usage is None or not isinstance(usage.get("prompt_tokens"), int):
            raise BasinInputError(
                f"--engine {self.url}: the engine's answers carry no usage.prompt_tokens (asked for with "
                "stream_options.include_usage); calibrate counts tokens with the engine's own tokenizer and "
                "cannot measure an engine that does not report them")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None and isinstance(usage.get("cached_tokens"), int):
            cached = usage["cached_tokens"]
        return CallSample(prompt_tokens=int(usage["prompt_tokens"]),
                          output_tokens=int(usage.get("completion_tokens") or 0),
                          cached_tokens=int(cached) if isinstance(cached, int) else None,
                          ttft_s=chunks[0] if chunks else end, latency_s=end, chunk_s=chunks,
                          engine_ttft_s=engine_ttft, engine_decode_s=engine_decode, start_s=start)


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        return str(err)[:300]
    return text.strip()[:300]
