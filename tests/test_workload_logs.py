"""Request logs as workloads: grouping, reuse, gaps, start times, and clean errors per format."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from basin.errors import BasinInputError
from basin.workload.io import SESSION_START_KEY, read_workload
from basin.workload.logs import load_request_log
from basin.workload.records import Call
from cli_helpers import run_basin as _run

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


def _write(tmp_path: Path, name: str, lines: Sequence[object]) -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _by_id(fmt: str, path: Path, **kw: str) -> dict[str, tuple[Call, ...]]:
    w = load_request_log(fmt, path, **kw)  # type: ignore[arg-type]
    return {s.session_id: s.calls for s in w.sessions}


# ---------------------------------------------------------------------------
# OpenAI-format request/response logs


def test_openai_groups_by_session_id_then_by_conversation_prefix() -> None:
    w = load_request_log("openai", FIXTURES / "openai.jsonl")
    assert [s.session_id for s in w.sessions] == ["openai-r1", "chat-7", "openai-s1"]
    calls = {s.session_id: s.calls for s in w.sessions}
    # r2 resends r1's messages plus its reply: same session, reuse = r1's prompt + output.
    assert calls["openai-r1"] == (Call(100, 100, 20, 0.5), Call(130, 10, 8))
    assert calls["chat-7"] == (Call(10, 10, 5, 7.5), Call(22, 7, 3))
    assert calls["openai-s1"] == (Call(40, 40, 4),)
    assert w.extra[SESSION_START_KEY] == {"openai-r1": 0.0, "chat-7": 1.0, "openai-s1": 5.0}


def test_openai_cached_reuse_rule_uses_reported_cached_tokens(tmp_path: Path) -> None:
    lines = [json.loads(t) for t in (FIXTURES / "openai.jsonl").read_text().splitlines()]
    path = _write(tmp_path, "agent.jsonl", [lines[0], lines[2]])
    assert _by_id("openai", path, reuse="cached")["openai-r1"][1] == Call(130, 34, 8)
    with pytest.raises(BasinInputError, match=r"line 2, field 'cached_tokens': missing.*'append'"):
        load_request_log("openai", _write(tmp_path, "chat.jsonl", [lines[1], lines[3]]), reuse="cached")


def test_openai_without_end_times_uses_created(tmp_path: Path) -> None:
    rows = [{"request": {"metadata": {"session_id": "s"}, "messages": []},
             "response": {"created": t, "usage": {"prompt_tokens": p, "completion_tokens": 2}}}
            for t, p in ((1000, 10), (1003, 15))]
    assert _by_id("openai", _write(tmp_path, "c.jsonl", rows))["s"] == (Call(10, 10, 2, 3.0), Call(15, 3, 2))


_GOOD = {"start_time": 1.0, "end_time": 2.0, "request": {"messages": []},
         "response": {"usage": {"prompt_tokens": 5, "completion_tokens": 1}}}


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ({**_GOOD, "response": {"id": "x"}}, "line 2, field 'response.usage': missing; log responses with usage"),
        ({**_GOOD, "response": {"usage": {"prompt_tokens": 5}}}, "field 'response.usage.completion_tokens': missing"),
        ({**_GOOD, "response": {"usage": {"prompt_tokens": "5", "completion_tokens": -1}}},
         "field 'response.usage.completion_tokens': expected a whole number"),
        ({**_GOOD, "end_time": 0.5}, "line 2, field 'end_time': ends 0.500 s before it starts"),
        ({**_GOOD, "start_time": "yesterday"}, "field 'start_time': expected an ISO 8601 time"),
        ({"response": _GOOD["response"], "start_time": 1.0}, "field 'request': missing"),
        ({k: v for k, v in _GOOD.items() if k not in ("start_time", "end_time")}, "field 'start_time': missing"),
    ],
)
def test_openai_bad_records_name_line_and_field(tmp_path: Path, record: dict[str, object], fragment: str) -> None:
    path = _write(tmp_path, "bad.jsonl", [_GOOD, record])
    with pytest.raises(BasinInputError) as exc:
        load_request_log("openai", path)
    assert str(path) in str(exc.value) and fragment in str(exc.value)


def test_openai_overlapping_calls_of_a_session_are_an_error(tmp_path: Path) -> None:
    rows = [{**_GOOD, "session_id": "s", "start_time": t, "end_time": t + 2} for t in (0.0, 1.0)]
    with pytest.raises(BasinInputError, match=r"line 2: starts 1.000 s before the previous call of session 's' "
                                              r"\(.*line 1\) ended; a session's calls must not overlap"):
        load_request_log("openai", _write(tmp_path, "o.jsonl", rows))


def test_openai_malformed_and_empty_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_GOOD) + "\n{not json\n")
    with pytest.raises(BasinInputError, match="line 2: malformed JSON"):
        load_request_log("openai", bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(BasinInputError, match="empty"):
        load_request_log("openai", empty)
    with pytest.raises(BasinInputError, match="no such file"):
        load_request_log("openai", tmp_path / "missing.jsonl")


def test_unknown_format_and_reuse_rule() -> None:
    with pytest.raises(BasinInputError, match="unknown log format 'helicone'; use one of"):
        load_request_log("helicone", FIXTURES / "openai.jsonl")
    with pytest.raises(BasinInputError, match="--reuse 'prefix'"):
        load_request_log("openai", FIXTURES / "openai.jsonl", reuse="prefix")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# The CLI and the round trip to the workload schema


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_cli_import_round_trips_with_start_times(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 suffix: str) -> None:
    out = tmp_path / f"w{suffix}"
    code, stdout, err = _run(capsys, "workload", "import", "openai", str(FIXTURES / "openai.jsonl"), "--out", str(out))
    assert code == 0 and "wrote 3 sessions, 5 calls" in stdout
    assert "only 3 sessions" in err  # a small log is flagged
    back = read_workload(out)
    w = load_request_log("openai", FIXTURES / "openai.jsonl")
    assert back.sessions == w.sessions
    assert back.extra[SESSION_START_KEY] == w.extra[SESSION_START_KEY]


def test_cli_bad_log_exits_2_without_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.jsonl", [{**_GOOD, "response": {}}])
    code, _, err = _run(capsys, "workload", "import", "openai", str(path), "--out", str(tmp_path / "o.jsonl"))
    assert code == 2 and "field 'response.usage': missing" in err and "Traceback" not in err
    code, _, err = _run(capsys, "workload", "import", "mooncake", str(path), "--reuse", "cached",
                        "--out", str(tmp_path / "o.jsonl"))
    assert code == 2 and "--reuse applies to the request-log formats" in err


def test_small_trace_warning() -> None:
    from basin.workload.presets import small_trace_warning, warn_if_reused

    w = load_request_log("openai", FIXTURES / "openai.jsonl")
    assert small_trace_warning(w, 3) is None
    assert "replay each about 10.0 times" in (small_trace_warning(w, 30) or "")
    with pytest.warns(UserWarning, match="only 3 sessions"):
        warn_if_reused(w, 30)


# ---------------------------------------------------------------------------
# OpenTelemetry GenAI spans, and vLLM's request spans


def _span(attrs: dict[str, object], start: str = "1000000000", end: str = "2000000000") -> dict[str, object]:
    return {"traceId": "t", "spanId": "s", "startTimeUnixNano": start, "endTimeUnixNano": end,
            "attributes": [{"key": k, "value": {"intValue": v} if isinstance(v, int) else {"stringValue": v}}
                           for k, v in attrs.items()]}


def _otlp(tmp_path: Path, *spans: dict[str, object]) -> Path:
    path = tmp_path / "spans.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}))
    return path


def test_otel_groups_by_conversation_id_then_trace_and_skips_tool_spans() -> None:
    w = load_request_log("otel", FIXTURES / "otel.json")
    calls = {s.session_id: s.calls for s in w.sessions}
    # Tool gap = next chat start - previous chat end (the execute_tool span is inside it).
    assert calls == {"conv-1": (Call(200, 200, 30, 2.0), Call(260, 30, 12)), "t2": (Call(50, 50, 5),)}
    assert w.extra[SESSION_START_KEY] == {"conv-1": 0.0, "t2": 3.0}
    assert w.extra["skipped_records"] == 1


def test_vllm_spans_use_legacy_usage_names_and_group_by_trace() -> None:
    calls = _by_id("vllm", FIXTURES / "vllm_otlp.jsonl")
    assert calls == {"c0ffee": (Call(1000, 1000, 40, 2.0), Call(1100, 60, 20)), "beef": (Call(10, 10, 2),)}


@pytest.mark.parametrize(
    ("span", "fragment"),
    [
        (_span({"gen_ai.operation.name": "chat", "gen_ai.usage.output_tokens": 3}),
         "spans[0], field 'gen_ai.usage.input_tokens': missing on a GenAI inference span"),
        (_span({"gen_ai.usage.input_tokens": 3}), "field 'gen_ai.usage.output_tokens': missing"),
        (_span({"gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 1}, end="10"),
         "field 'endTimeUnixNano': ends"),
        ({**_span({"gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 1}), "startTimeUnixNano": None},
         "field 'startTimeUnixNano': missing"),
        (_span({"gen_ai.usage.input_tokens": "many", "gen_ai.usage.output_tokens": 1}),
         "field 'gen_ai.usage.input_tokens': expected a whole number"),
    ],
)
def test_otel_bad_spans(tmp_path: Path, span: dict[str, object], fragment: str) -> None:
    path = _otlp(tmp_path, span)
    with pytest.raises(BasinInputError) as exc:
        load_request_log("otel", path)
    assert str(path) in str(exc.value) and fragment in str(exc.value)


def test_otel_file_that_is_not_an_export(tmp_path: Path) -> None:
    path = _write(tmp_path, "x.json", [{"spans": []}])
    with pytest.raises(BasinInputError, match="field 'resourceSpans': missing; expected an OTLP JSON"):
        load_request_log("otel", path)
    with pytest.raises(BasinInputError, match="no LLM requests with token usage found in this otel log"):
        load_request_log("otel", _otlp(tmp_path, _span({"http.method": "GET"})))


# ---------------------------------------------------------------------------
# LiteLLM spend logs


@pytest.mark.parametrize("name", ["litellm_spend.json", "litellm_spend.csv"])
def test_litellm_groups_by_session_id_and_skips_failures(name: str) -> None:
    w = load_request_log("litellm", FIXTURES / name)
    calls = {s.session_id: s.calls for s in w.sessions}
    assert calls == {"agent-run-1": (Call(1000, 1000, 50, 1.5), Call(1100, 50, 30)),
                     "litellm-chatcmpl-c1": (Call(80, 80, 8),)}
    assert w.extra[SESSION_START_KEY] == {"agent-run-1": 0.0, "litellm-chatcmpl-c1": 2.0}
    assert w.extra["skipped_records"] == (1 if name.endswith(".json") else 0)


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({"request_id": "x", "startTime": "2025-03-01T10:00:00Z", "endTime": "2025-03-01T10:00:01Z",
          "prompt_tokens": 5}, "line 1, field 'completion_tokens': missing; a LiteLLM spend-log row needs"),
        ({"request_id": "x", "startTime": "2025-03-01T10:00:05Z", "endTime": "2025-03-01T10:00:01Z",
          "prompt_tokens": 5, "completion_tokens": 1}, "field 'endTime': ends 4.000 s before it starts"),
        ({"request_id": "x", "startTime": "noon", "endTime": "2025-03-01T10:00:01Z",
          "prompt_tokens": 5, "completion_tokens": 1}, "field 'startTime': expected an ISO 8601 time"),
    ],
)
def test_litellm_bad_rows(tmp_path: Path, row: dict[str, object], fragment: str) -> None:
    path = _write(tmp_path, "spend.jsonl", [row])
    with pytest.raises(BasinInputError) as exc:
        load_request_log("litellm", path)
    assert str(path) in str(exc.value) and fragment in str(exc.value)


def test_litellm_csv_with_ragged_row(tmp_path: Path) -> None:
    path = tmp_path / "spend.csv"
    path.write_text("request_id,startTime,endTime,prompt_tokens,completion_tokens\nx,1,2,3\n")
    with pytest.raises(BasinInputError, match=r"spend.csv line 2: expected 5 columns as in the header, got 4"):
        load_request_log("litellm", path)


# ---------------------------------------------------------------------------
# SGLang --log-requests


def test_sglang_finish_lines_become_one_call_sessions() -> None:
    w = load_request_log("sglang", FIXTURES / "sglang.log")
    assert {s.session_id: s.calls for s in w.sessions} == {
        "sglang-aa11": (Call(120, 120, 16),), "sglang-bb22": (Call(300, 300, 8),)}
    # start = the line's time stamp minus e2e_latency; the startup line is skipped.
    assert w.extra[SESSION_START_KEY] == {"sglang-aa11": 0.0, "sglang-bb22": 4.25}
    assert w.extra["skipped_records"] == 1


def test_sglang_finish_line_without_usage(tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    path.write_text("[2025-03-01 10:00:02] Finish: obj=GenerateReqInput(rid='x'), out={'meta_info': {'id': 'x'}}\n")
    with pytest.raises(BasinInputError, match=r"s.log line 1, field 'meta_info.prompt_tokens': missing"):
        load_request_log("sglang", path)
    path.write_text("[2025-03-01 10:00:02] Finish: obj=GenerateReqInput(rid='x')\n")
    with pytest.raises(BasinInputError, match=r"line 1, field 'out': missing from the Finish line"):
        load_request_log("sglang", path)


def _sglang_finished(rid: str, when: str, prompt: int, output: int, latency: float, *,
                     session: str | None = None, cached: int | None = 0) -> dict[str, object]:
    """A ``request.finished`` record as SGLang's JSON request log writes it (--log-requests-format json)."""
    obj: dict[str, object] = {"rid": rid, "text": "...", "sampling_params": {"max_new_tokens": output}}
    if session is not None:
        obj["session_params"] = {"id": session, "rid": None, "offset": None, "replace": None}
    meta: dict[str, object] = {"id": rid, "prompt_tokens": prompt, "completion_tokens": output,
                               "e2e_latency": latency}
    if cached is not None:
        meta["cached_tokens"] = cached
    return {"timestamp": when, "event": "request.finished", "rid": rid, "obj": obj,
            "out": {"text": "done", "meta_info": meta}}


def test_sglang_json_log_uses_microsecond_times_and_sglang_sessions(tmp_path: Path) -> None:
    path = _write(tmp_path, "sglang.log", [
        {"timestamp": "2026-03-01T10:00:00.000000", "event": "request.received", "rid": "a", "obj": {}},
        _sglang_finished("a", "2026-03-01T10:00:01.500000", 100, 10, 1.0, session="s1"),
        _sglang_finished("b", "2026-03-01T10:00:04.250000", 160, 5, 0.5, session="s1", cached=100),
        _sglang_finished("c", "2026-03-01T10:00:02.000000", 40, 4, 0.25, cached=None),
    ])
    w = load_request_log("sglang", path)
    calls = {s.session_id: s.calls for s in w.sessions}
    # s1: a ends at 1.5 s, b starts at 4.25 - 0.5 = 3.75 s, so the tool gap is 2.25 s.
    assert calls == {"s1": (Call(100, 100, 10, 2.25), Call(160, 50, 5)), "sglang-c": (Call(40, 40, 4),)}
    assert w.extra[SESSION_START_KEY] == {"s1": 0.0, "sglang-c": 1.25}
    assert w.extra["skipped_records"] == 1  # the request.received line
    assert _by_id("sglang", path, reuse="cached")["s1"][1] == Call(160, 60, 5)


def test_sglang_json_batched_request_is_one_request_per_output(tmp_path: Path) -> None:
    record = _sglang_finished("x", "2026-03-01T10:00:01", 10, 2, 0.5)
    out = record["out"]
    assert isinstance(out, dict)
    second = {"text": "", "meta_info": {**out["meta_info"], "id": "y", "prompt_tokens": 12}}
    path = _write(tmp_path, "batch.log", [{**record, "out": [out, second]}])
    assert sorted(c[0].prompt_tokens for c in _by_id("sglang", path).values()) == [10, 12]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"timestamp": None}, "field 'timestamp': expected an ISO 8601 time"),
        ({"out": None}, "field 'out': missing; SGLang writes it for text generation"),
        ({"out": {"text": "x"}}, "field 'out.meta_info': missing or not an object"),
        ({"out": {"meta_info": {"completion_tokens": 1, "e2e_latency": 0.1}}},
         "field 'out.meta_info.prompt_tokens': missing"),
        ({"out": {"meta_info": {"prompt_tokens": 1, "completion_tokens": 1, "e2e_latency": -1}}},
         "field 'out.meta_info.e2e_latency': expected seconds >= 0"),
        ({"out": {"meta_info": {"prompt_tokens": "ten", "completion_tokens": 1}}},
         "field 'out.meta_info.prompt_tokens': expected a whole number"),
    ],
)
def test_sglang_json_bad_records(tmp_path: Path, change: dict[str, object], fragment: str) -> None:
    path = _write(tmp_path, "bad.log", [{**_sglang_finished("a", "2026-03-01T10:00:01", 10, 1, 0.1), **change}])
    with pytest.raises(BasinInputError) as exc:
        load_request_log("sglang", path)
    assert "bad.log line 1" in str(exc.value) and fragment in str(exc.value)


def test_sglang_json_line_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "cut.log"
    path.write_text('{"timestamp": "2026-03-01T10:00:01", "event": "request.fin\n')
    with pytest.raises(BasinInputError, match=r"cut.log line 1: malformed JSON .*one object per line"):
        load_request_log("sglang", path)


def test_otel_call_seen_by_client_and_proxy_counts_once(tmp_path: Path) -> None:
    usage = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 30, "gen_ai.usage.output_tokens": 3}
    client = {**_span({**usage, "gen_ai.response.id": "r1"}, "1000000000", "2000000000"), "spanId": "c1"}
    http = {**_span({"http.request.method": "POST"}, "1100000000", "1900000000"), "spanId": "h1",
            "parentSpanId": "c1"}
    proxy = {**_span(usage, "1200000000", "1800000000"), "spanId": "p1", "parentSpanId": "h1"}
    # A second hop that is not below the client span but repeats its response id.
    engine = {**_span({**usage, "gen_ai.response.id": "r1"}, "1300000000", "1700000000"), "spanId": "e1"}
    later = {**_span({**usage, "gen_ai.response.id": "r2"}, "3000000000", "4000000000"), "spanId": "c2"}
    # The proxy's span is listed first: which one is kept must not depend on the file's order.
    w = load_request_log("otel", _otlp(tmp_path, proxy, engine, http, later, client))
    assert [[(c.prompt_tokens, c.tool_gap_s) for c in s.calls] for s in w.sessions] == [[(30, 1.0), (30, 0.0)]]
    assert w.extra["duplicate_spans"] == 2 and w.extra["skipped_records"] == 1


def test_litellm_rows_built_by_litellm_itself() -> None:
    """Rows from LiteLLM's own spend-log builder (scripts/litellm_spend_rows.py against the fake engine)."""
    rows = json.loads((FIXTURES / "litellm-spend-real.json").read_text())
    w = load_request_log("litellm", FIXTURES / "litellm-spend-real.json")
    assert sorted(s.session_id for s in w.sessions) == ["agent-0", "agent-1", "agent-2"]
    by_session: dict[str, list[tuple[int, int]]] = {}
    for row in sorted(rows, key=lambda r: r["startTime"]):
        by_session.setdefault(row["session_id"], []).append((row["prompt_tokens"], row["completion_tokens"]))
    assert {s.session_id: [(c.prompt_tokens, c.output_tokens) for c in s.calls] for s in w.sessions} == by_session
    assert all(c.tool_gap_s >= 0.04 for s in w.sessions for c in s.calls[:-1])  # the loop's 50 ms sleeps
    # The engine's cached tokens, which LiteLLM keeps in the row's metadata, drive the 'cached' rule.
    reported = {}
    for row in rows:
        details = json.loads(row["metadata"])["additional_usage_values"]["prompt_tokens_details"]
        reported[(row["session_id"], row["prompt_tokens"])] = details["cached_tokens"]
    cached = load_request_log("litellm", FIXTURES / "litellm-spend-real.json", reuse="cached")
    for s in cached.sessions:
        assert s.calls[0].new_tokens == s.calls[0].prompt_tokens
        for c in s.calls[1:]:
            assert 0 < reported[(s.session_id, c.prompt_tokens)] == c.prompt_tokens - c.new_tokens
    # Without litellm_session_id, LiteLLM writes each request's own trace id: a session per request.
    alone = load_request_log("litellm", FIXTURES / "litellm-spend-real-nosession.json")
    assert len(alone.sessions) == 12 and all(len(s.calls) == 1 for s in alone.sessions)


def test_litellm_cached_tokens_from_metadata(tmp_path: Path) -> None:
    row = {"request_id": "r1", "startTime": "2026-03-01T10:00:00", "endTime": "2026-03-01T10:00:01",
           "prompt_tokens": 100, "completion_tokens": 5, "session_id": "s", "status": "success"}
    meta = {"additional_usage_values": {"prompt_tokens_details": {"cached_tokens": 70}}}
    second = {**row, "request_id": "r2", "startTime": "2026-03-01T10:00:03", "endTime": "2026-03-01T10:00:04",
              "prompt_tokens": 140, "metadata": json.dumps(meta)}
    path = _write(tmp_path, "spend.jsonl", [row, second])
    assert _by_id("litellm", path, reuse="cached")["s"][1] == Call(140, 70, 5)
    path = _write(tmp_path, "bad.jsonl", [{**row, "metadata": "{not json"}])
    with pytest.raises(BasinInputError, match=r"bad.jsonl line 1, field 'metadata': not valid JSON"):
        load_request_log("litellm", path)
