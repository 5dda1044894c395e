"""The fake upstream behaves like the engines the gateway fronts: OpenAI shapes,
cached-token accounting of a session-keyed LRU cache, each failure mode, and
metrics counters that count what was served."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.support.fake_upstream import FakeUpstream, FakeUpstreamConfig, count_tokens

#: Where ``python -m tests.support.fake_upstream`` resolves.
REPO_ROOT = Path(__file__).resolve().parents[2]

Scenario = Callable[[FakeUpstream, str, aiohttp.ClientSession], Awaitable[Any]]


def run(scenario: Scenario, config: FakeUpstreamConfig = FakeUpstreamConfig()) -> Any:
    """Start a fake upstream, run the scenario against it, always stop it."""

    async def main() -> Any:
        up = FakeUpstream(config)
        url = await up.start()
        try:
            async with aiohttp.ClientSession() as session:
                return await scenario(up, url, session)
        finally:
            await up.stop()

    return asyncio.run(main())


def chat_body(*contents: str, stream: bool = False, usage: bool = False, **extra: Any) -> dict[str, Any]:
    """A chat call whose messages alternate user/assistant, as an agent's do."""
    roles = ("user", "assistant")
    body: dict[str, Any] = {
        "model": "fake-model",
        "messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)],
        "stream": stream,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


async def sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    """The data payloads of an SSE body, in order."""
    text = (await resp.read()).decode()
    assert text.endswith("\n\n")
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block]


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    async with session.post(url + "/v1/chat/completions", json=body, **kw) as r:
        assert r.status == 200
        return await r.json()


def metric(text: str, name: str) -> float:
    """The value of one sample, matched by name with or without labels."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


async def scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as r:
        assert r.status == 200
        assert r.content_type == "text/plain"
        return await r.text()


# ------------------------------------------------------------------ shapes


def test_streaming_chat_shape_with_usage() -> None:
    body = chat_body("please stream", stream=True, usage=True)

    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = await sse_events(r)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        tokens, finish, usage = chunks[:5], chunks[5], chunks[6]
        assert len(chunks) == 7
        assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
        assert all(c["choices"][0]["finish_reason"] is None and c["choices"][0]["delta"]["content"] for c in tokens)
        assert finish["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
        assert "usage" not in finish
        prompt = count_tokens(json.dumps(body["messages"], separators=(",", ":")))
        assert usage["choices"] == []
        assert usage["usage"] == {
            "prompt_tokens": prompt,
            "completion_tokens": 5,
            "total_tokens": prompt + 5,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        assert usage["timings"] == {"cache_n": 0, "prompt_n": prompt, "predicted_n": 5}

    run(scenario, FakeUpstreamConfig(completion_tokens=5))


def test_streaming_without_include_usage_ends_with_timings_only() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        async with s.post(url + "/v1/chat/completions", json=chat_body("hi there", stream=True)) as r:
            events = await sse_events(r)
        chunks = [json.loads(e) for e in events[:-1]]
        assert len(chunks) == 3 + 1
        assert all("usage" not in c for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["timings"]["predicted_n"] == 3

    run(scenario, FakeUpstreamConfig(completion_tokens=3))


def test_non_stream_chat_and_completions_always_carry_usage() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        out = await post(s, url, chat_body("a question"))
        assert out["object"] == "chat.completion"
        msg = out["choices"][0]["message"]
        assert msg["role"] == "assistant" and len(msg["content"].split()) == 4
        assert out["usage"]["completion_tokens"] == 4
        assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 4
        async with s.post(url + "/v1/completions", json={"model": "m", "prompt": "x" * 40}) as r:
            comp = await r.json()
        assert comp["object"] == "text_completion"
        assert len(comp["choices"][0]["text"].split()) == 4
        # json text of the prompt is 42 characters (quotes included): 10 tokens
        assert comp["usage"]["prompt_tokens"] == 10
        assert comp["timings"] == {"cache_n": 0, "prompt_n": 10, "predicted_n": 4}

    run(scenario, FakeUpstreamConfig(completion_tokens=4))


def test_streaming_completions_carry_text_chunks() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        body = {"model": "m", "prompt": "once upon a time", "stream": True, "stream_options": {"include_usage": True}}
        async with s.post(url + "/v1/completions", json=body) as r:
            events = await sse_events(r)
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(c["object"] == "text_completion" for c in chunks)
        assert [c["choices"][0]["text"] for c in chunks[:3]] == [" the", " fake", " engine"]
        assert chunks[-1]["usage"]["completion_tokens"] == 3

    run(scenario, FakeUpstreamConfig(completion_tokens=3))


def test_max_tokens_caps_the_answer_with_finish_reason_length() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        out = await post(s, url, chat_body("short please", max_tokens=2))
        assert out["usage"]["completion_tokens"] == 2
        assert out["choices"][0]["finish_reason"] == "length"

    run(scenario, FakeUpstreamConfig(completion_tokens=16))


def test_malformed_requests_get_400_not_500() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        for path, data in [
            ("/v1/chat/completions", b"{not json"),
            ("/v1/chat/completions", b"[1, 2]"),
            ("/v1/chat/completions", b'{"messages": []}'),
            ("/v1/completions", b'{"model": "m"}'),
        ]:
            async with s.post(url + path, data=data, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400, data
                assert "message" in (await r.json())["error"]

    run(scenario)


# ------------------------------------------------------------ prefix cache


def test_second_call_of_a_session_reports_the_first_prompt_as_cached() -> None:
    first = chat_body("system and task " * 8, session_id="s1")
    second = chat_body("system and task " * 8, "a first answer", "a follow-up", session_id="s1")
    p1 = count_tokens(json.dumps(first["messages"], separators=(",", ":")))
    p2 = count_tokens(json.dumps(second["messages"], separators=(",", ":")))

    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        a = await post(s, url, first)
        b = await post(s, url, second)
        assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert b["usage"]["prompt_tokens"] == p2
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == p1
        assert b["timings"] == {"cache_n": p1, "prompt_n": p2 - p1, "predicted_n": 16}
        text = await scrape(s, url)
        assert metric(text, "llamacpp:prompt_tokens_total") == p1 + p2 - p1
        assert metric(text, "llamacpp:prompt_tokens_cached_total") == p1
        assert metric(text, "llamacpp:tokens_predicted_total") == 32
        # The same prompt again: all but the last token come from the cache.
        c = await post(s, url, second)
        assert c["usage"]["prompt_tokens_details"]["cached_tokens"] == p2 - 1
        # A prompt that does not extend the cached one reuses nothing.
        d = await post(s, url, chat_body("an unrelated task " * 8, session_id="s1"))
        assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    run(scenario)


def test_streamed_usage_reports_cached_tokens_too() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        await post(s, url, chat_body("the task text, long enough", session_id="k"))
        body = chat_body("the task text, long enough", "answer", "next", session_id="k", stream=True, usage=True)
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            events = await sse_events(r)
        usage = json.loads(events[-2])["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0

    run(scenario)


def test_lru_eviction_beyond_cache_slots() -> None:
    def call(name: str, turn: int) -> dict[str, Any]:
        contents = [f"task of {name} " * 4] + [f"turn {i}" for i in range(turn)]
        return chat_body(*contents, session_id=name)

    async def cached(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
        return (await post(s, url, body))["usage"]["prompt_tokens_details"]["cached_tokens"]

    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        for name in ("a", "b", "c"):
            assert await cached(s, url, call(name, 0)) == 0
        assert up.cached_sessions == ["b", "c"]
        assert await cached(s, url, call("b", 1)) > 0  # b resident, now most recent
        assert up.cached_sessions == ["c", "b"]
        assert await cached(s, url, call("a", 1)) == 0  # a was evicted; a evicts c
        assert up.cached_sessions == ["b", "a"]
        assert await cached(s, url, call("c", 1)) == 0
        assert await cached(s, url, call("a", 2)) > 0

    run(scenario, FakeUpstreamConfig(cache_slots=2))


def test_zero_cache_slots_never_caches() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        await post(s, url, chat_body("a task", session_id="x"))
        out = await post(s, url, chat_body("a task", "more", session_id="x"))
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert up.cached_sessions == []

    run(scenario, FakeUpstreamConfig(cache_slots=0))


def test_session_key_is_body_then_routing_header_then_first_message() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        await post(s, url, chat_body("shared task", session_id="by-body"))
        await post(s, url, chat_body("shared task"), headers={"X-SMG-Routing-Key": "by-header"})
        await post(s, url, chat_body("shared task"))
        assert up.cached_sessions == ["by-body", "by-header", "shared task"]
        out = await post(s, url, chat_body("shared task", "x", session_id="by-body"),
                         headers={"X-SMG-Routing-Key": "other"})
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert "other" not in up.cached_sessions

    run(scenario)


# ------------------------------------------------------------- fail modes


@pytest.mark.parametrize("status", [503, 429])
def test_status_fail_modes_answer_an_openai_error_with_retry_after(status: int) -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        async with s.post(url + "/v1/chat/completions", json=chat_body("hi", stream=True)) as r:
            assert r.status == status
            assert r.headers["Retry-After"] == "1"
            assert (await r.json())["error"]["code"] == status
        up.set_config(FakeUpstreamConfig())
        await post(s, url, chat_body("hi"))  # healthy again once reconfigured

    run(scenario, FakeUpstreamConfig(fail_mode=f"status:{status}"))


def test_die_mid_stream_delivers_two_chunks_then_drops_the_connection() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        received: list[bytes] = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/chat/completions", json=chat_body("hi", stream=True, usage=True)) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data: "):
                        received.append(line)
        assert len(received) == 2
        assert all(json.loads(line[6:])["choices"][0]["delta"]["content"] for line in received)
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/chat/completions", json=chat_body("hi")) as r:
                await r.read()
        text = await scrape(s, url)
        assert metric(text, "llamacpp:tokens_predicted_total") == 4
        assert metric(text, "llamacpp:requests_processing") == 0

    run(scenario, FakeUpstreamConfig(fail_mode="die_mid_stream"))


def test_hang_holds_calls_as_queued_until_stop_drops_them() -> None:
    async def held_call(s: aiohttp.ClientSession, url: str) -> None:
        async with s.post(url + "/v1/chat/completions", json=chat_body("hi")) as r:
            await r.read()

    async def main() -> None:
        up = FakeUpstream(FakeUpstreamConfig(fail_mode="hang", engine="vllm"))
        url = await up.start()
        async with aiohttp.ClientSession() as s:
            held = asyncio.ensure_future(held_call(s, url))
            with pytest.raises(asyncio.TimeoutError):
                async with s.post(url + "/v1/chat/completions", json=chat_body("hi"),
                                  timeout=aiohttp.ClientTimeout(total=0.3)):
                    pass
            assert not held.done()
            await asyncio.sleep(0.05)  # the timed-out call's disconnect reaches the server
            assert metric(await scrape(s, url), "vllm:num_requests_waiting") == 1
            t0 = time.monotonic()
            await up.stop()
            assert time.monotonic() - t0 < 2.0
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await held

    asyncio.run(main())


def test_invalid_configs_are_refused() -> None:
    for kwargs in ({"engine": "tgi"}, {"fail_mode": "explode"}, {"completion_tokens": 0}, {"cache_slots": -1}):
        with pytest.raises(ValueError):
            FakeUpstreamConfig(**kwargs)


# ----------------------------------------------------------------- metrics


def test_sglang_metrics_count_and_rate_since_last_scrape() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        a = await post(s, url, chat_body("sglang task " * 10, session_id="s"))
        b = await post(s, url, chat_body("sglang task " * 10, "ans", session_id="s"))
        p = a["usage"]["prompt_tokens"] + b["usage"]["prompt_tokens"]
        hit = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        text = await scrape(s, url)
        assert metric(text, "sglang:prompt_tokens_total") == p
        assert metric(text, "sglang:cached_tokens_total") == hit
        assert metric(text, "sglang:cache_hit_rate") == pytest.approx(hit / p)
        assert metric(text, "sglang:max_total_num_tokens") == 3 * 8192
        assert 0 < metric(text, "sglang:token_usage") < 1
        assert metric(text, "sglang:num_running_reqs") == 0
        assert metric(text, "sglang:num_queue_reqs") == 0
        assert 'sglang:cache_hit_rate{model_name="fake-model"}' in text
        # A miss-only window drops the gauge; an idle window keeps it.
        await post(s, url, chat_body("something else entirely", session_id="t"))
        assert metric(await scrape(s, url), "sglang:cache_hit_rate") == 0.0
        assert metric(await scrape(s, url), "sglang:cache_hit_rate") == 0.0

    run(scenario, FakeUpstreamConfig(engine="sglang", cache_slots=3))


def test_vllm_metrics_count_hits_and_queries_in_tokens() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        a = await post(s, url, chat_body("vllm task " * 10, session_id="v"))
        b = await post(s, url, chat_body("vllm task " * 10, "ans", session_id="v"))
        text = await scrape(s, url)
        assert metric(text,
                      "vllm:prefix_cache_queries_total") == a["usage"]["prompt_tokens"] + b["usage"]["prompt_tokens"]
        assert metric(text, "vllm:prefix_cache_hits_total") == b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert "# TYPE vllm:prefix_cache_hits counter" in text
        assert metric(text, "vllm:num_requests_running") == 0
        assert metric(text, "vllm:num_requests_waiting") == 0
        assert 0 < metric(text, "vllm:kv_cache_usage_perc") < 1

    run(scenario, FakeUpstreamConfig(engine="vllm"))


def test_running_gauge_counts_calls_in_progress() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        slow = [asyncio.ensure_future(post(s, url, chat_body(f"slow {i}"))) for i in range(3)]
        await asyncio.sleep(0.15)
        assert metric(await scrape(s, url), "llamacpp:requests_processing") == 3
        await asyncio.gather(*slow)
        assert metric(await scrape(s, url), "llamacpp:requests_processing") == 0

    run(scenario, FakeUpstreamConfig(completion_tokens=4, first_token_delay_s=0.3))


def test_engine_none_has_no_metrics_and_info_endpoints_answer() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        async with s.get(url + "/metrics") as r:
            assert r.status == 404
        async with s.get(url + "/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "fake-model"
        async with s.get(url + "/get_server_info") as r:
            assert (await r.json())["enable_priority_scheduling"] is True
        async with s.get(url + "/props") as r:
            assert (await r.json())["total_slots"] == 7

    run(scenario, FakeUpstreamConfig(engine="none", cache_slots=7))


def test_every_request_is_recorded_in_order() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        await post(s, url, chat_body("one", session_id="r"), headers={"X-Session-Id": "abc"})
        async with s.get(url + "/v1/models"):
            pass
        assert [r["path"] for r in up.requests] == ["/v1/chat/completions", "/v1/models"]
        first = up.requests[0]
        assert first["headers"]["X-Session-Id"] == "abc"
        assert first["body"]["session_id"] == "r"
        assert up.requests[1]["body"] is None
        assert 0 <= first["at_s"] <= up.requests[1]["at_s"]

    run(scenario)


def test_token_delays_pace_the_stream() -> None:
    async def scenario(up: FakeUpstream, url: str, s: aiohttp.ClientSession) -> None:
        t0 = time.perf_counter()
        async with s.post(url + "/v1/chat/completions", json=chat_body("paced", stream=True)) as r:
            await r.content.readuntil(b"\n\n")
            ttfb = time.perf_counter() - t0
            await r.read()
        total = time.perf_counter() - t0
        assert 0.1 <= ttfb < 0.25
        assert total >= 0.1 + 4 * 0.05

    run(scenario, FakeUpstreamConfig(completion_tokens=5, first_token_delay_s=0.1, token_delay_s=0.05))


def test_cli_serves_until_interrupted(tmp_path: Path) -> None:
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as err:
        proc = subprocess.Popen(
            # -X faulthandler: if it does not stop, SIGABRT below makes it print where every thread is.
            [sys.executable, "-X", "faulthandler", "-m", "tests.support.fake_upstream", "--port", "0", "--tokens",
             "3", "--engine", "sglang"],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # A shell starts background jobs with SIGINT ignored and children inherit that: give the
            # server the default disposition, as a terminal would, so that Ctrl-C is what is tested.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.rsplit(" ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:")

        async def check() -> None:
            async with aiohttp.ClientSession() as s:
                out = await post(s, url, chat_body("via the cli"))
                assert out["usage"]["completion_tokens"] == 3
                assert metric(await scrape(s, url), "sglang:generation_tokens_total") == 3

        asyncio.run(check())
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=10)
            pytest.fail("the fake upstream did not stop within 30 s of SIGINT; its threads:\n"
                        + errors.read_text(errors="replace")[-6000:])
        assert code == 0, errors.read_text(errors="replace")[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
