"""The request-log importers on logs written by real tools, not by hand.

OpenTelemetry's own GenAI instrumentation of the OpenAI client traces an agent
loop against the fake engine, and its OTLP JSON file exporter writes the spans;
the importer must recover every session, call and token count the engine
reported, and count a call seen at two hops (client and proxy) once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.exporter.otlp.json.file.trace_exporter import FileSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from tests.support.fake_upstream import FakeUpstream, FakeUpstreamConfig
from tests.support.local_app import start_app

from basin.workload.logs import read_otel_log

SESSIONS = 3
CALLS = 4


def _tracing(path: Path) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path)))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    return provider


async def _agent_runs(base_url: str, provider: TracerProvider, *, propagate_context: bool,
                      stream: bool) -> list[list[dict[str, Any]]]:
    """SESSIONS agent loops of CALLS calls each (with ``stream``, streamed and not
    alternating), each under one ``invoke_agent`` span; returns the usage every call received."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="not-used", max_retries=0)
    tracer = provider.get_tracer("agent-under-test")
    usages: list[list[dict[str, Any]]] = []
    try:
        for s in range(SESSIONS):
            seen: list[dict[str, Any]] = []
            with tracer.start_as_current_span("invoke_agent"):
                messages: list[Any] = [
                    {"role": "system", "content": "You are a coding agent. " * 40},
                    {"role": "user", "content": f"Fix issue {s} in the repository."}]
                for k in range(CALLS):
                    headers: dict[str, str] = {}
                    if propagate_context:
                        propagate.inject(headers)
                    if stream and k % 2:
                        chunks = await client.chat.completions.create(
                            model="fake-model", messages=messages, stream=True,
                            stream_options={"include_usage": True}, extra_headers=headers)
                        text, usage = "", None
                        async for chunk in chunks:
                            if chunk.choices:
                                text += chunk.choices[0].delta.content or ""
                            if chunk.usage is not None:
                                usage = chunk.usage
                    else:
                        reply = await client.chat.completions.create(
                            model="fake-model", messages=messages, extra_headers=headers)
                        text, usage = reply.choices[0].message.content or "", reply.usage
                    assert usage is not None
                    seen.append({"prompt": usage.prompt_tokens, "output": usage.completion_tokens})
                    messages += [{"role": "assistant", "content": text},
                                 {"role": "user", "content": f"tool output {k}: " + "ok " * 30}]
                    await asyncio.sleep(0.01)  # the tool gap
            usages.append(seen)
    finally:
        await client.close()
    return usages


async def _proxy(upstream_url: str) -> tuple[web.AppRunner, str]:
    """A pass-through proxy that traces its own upstream call as a child of the client's context."""
    client = openai.AsyncOpenAI(base_url=upstream_url + "/v1", api_key="not-used", max_retries=0)

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        token = otel_context.attach(propagate.extract(dict(request.headers)))
        try:
            reply = await client.chat.completions.create(**body)
        finally:
            otel_context.detach(token)
        return web.json_response(reply.model_dump(exclude_none=True))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.on_cleanup.append(lambda _app: client.close())
    return await start_app(app, access_log=None)


@pytest.fixture
def instrumented(tmp_path: Path) -> Any:
    path = tmp_path / "spans.jsonl"
    provider = _tracing(path)
    yield path, provider
    OpenAIInstrumentor().uninstrument()
    provider.shutdown()


def test_otel_spans_of_the_real_instrumentation_give_back_every_session_and_token(instrumented: Any) -> None:
    path, provider = instrumented

    async def scenario() -> list[list[dict[str, Any]]]:
        upstream = FakeUpstream(FakeUpstreamConfig(completion_tokens=8))
        url = await upstream.start()
        try:
            return await _agent_runs(url, provider, propagate_context=False, stream=True)
        finally:
            await upstream.stop()

    usages = asyncio.run(scenario())
    provider.force_flush()
    workload = read_otel_log(path)
    assert len(workload.sessions) == SESSIONS
    assert workload.extra["skipped_records"] == SESSIONS  # the invoke_agent spans
    assert workload.extra["duplicate_spans"] == 0
    got = sorted([[(c.prompt_tokens, c.output_tokens) for c in s.calls] for s in workload.sessions])
    want = sorted([[(u["prompt"], u["output"]) for u in seen] for seen in usages])
    assert got == want
    for session in workload.sessions:
        gaps = [c.tool_gap_s for c in session.calls[:-1]]
        assert all(0.005 < g < 5.0 for g in gaps), gaps  # the agent's sleeps, measured from span times
        assert session.calls[0].new_tokens == session.calls[0].prompt_tokens
        assert all(c.new_tokens < c.prompt_tokens for c in session.calls[1:])  # the resent conversation


def test_a_call_traced_by_the_client_and_by_a_proxy_is_one_request(instrumented: Any) -> None:
    path, provider = instrumented

    async def scenario() -> list[list[dict[str, Any]]]:
        upstream = FakeUpstream(FakeUpstreamConfig(completion_tokens=8))
        url = await upstream.start()
        runner, proxy_url = await _proxy(url)
        try:
            return await _agent_runs(proxy_url, provider, propagate_context=True, stream=False)
        finally:
            await runner.cleanup()
            await upstream.stop()

    usages = asyncio.run(scenario())
    provider.force_flush()
    workload = read_otel_log(path)
    assert workload.extra["duplicate_spans"] == SESSIONS * CALLS  # each call's proxy span
    assert len(workload.sessions) == SESSIONS
    assert sum(len(s.calls) for s in workload.sessions) == SESSIONS * CALLS
    got = sorted([[c.prompt_tokens for c in s.calls] for s in workload.sessions])
    assert got == sorted([[u["prompt"] for u in seen] for seen in usages])
