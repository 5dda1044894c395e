"""Usage read from responses and streams; the gateway's settings and their errors."""

from __future__ import annotations

import json

import pytest

from basin.errors import BasinInputError
from basin.gateway.config import load_gateway_config, parse_listen
from basin.gateway.usage import CallUsage, usage_from_body, usage_from_stream_tail


def test_usage_from_openai_body_with_cached_tokens():
    body = {"usage": {"prompt_tokens": 900, "completion_tokens": 50,
                      "prompt_tokens_details": {"cached_tokens": 800}}}
    usage = usage_from_body(json.dumps(body).encode())
    assert usage == CallUsage(900, 50, 800) and usage.context_tokens == 950


def test_usage_from_llamacpp_timings_only():
    body = {"timings": {"cache_n": 700, "prompt_n": 200, "predicted_n": 32}}
    assert usage_from_body(json.dumps(body).encode()) == CallUsage(900, 32, 700)


def test_usage_missing_or_malformed_is_none():
    assert usage_from_body(b"not json") is None
    assert usage_from_body(b'{"usage": {"prompt_tokens": -3}}') is None
    assert usage_from_body(b'{"choices": []}') is None
    assert usage_from_body(b'[1, 2]') is None


def test_usage_from_the_last_event_of_a_stream():
    events = [
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,'
        b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n',
        b"data: [DONE]\n\n",
    ]
    assert usage_from_stream_tail(b"".join(events)) == CallUsage(10, 2, 4)
    assert usage_from_stream_tail(b'data: {"choices":[]}\n\ndata: [DONE]\n\n') is None


def test_config_needs_an_upstream_and_names_bad_fields(tmp_path):
    with pytest.raises(BasinInputError, match="field 'upstream' is required"):
        load_gateway_config()
    with pytest.raises(BasinInputError, match="upstream"):
        load_gateway_config(upstream="ftp://engine")
    with pytest.raises(BasinInputError, match="engine"):
        load_gateway_config(upstream="http://127.0.0.1:1", engine="tgi")
    with pytest.raises(BasinInputError, match="session_header"):
        load_gateway_config(upstream="http://127.0.0.1:1", session_header="X Session\r\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstream: http://127.0.0.1:1\nlisten_port: 99999\n")
    with pytest.raises(BasinInputError, match=r"(?s)bad.yaml.*listen_port"):
        load_gateway_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(BasinInputError, match="expected a mapping"):
        load_gateway_config(bad)
    bad.write_text("upstream: http://127.0.0.1:1\ntypo_field: 3\n")
    with pytest.raises(BasinInputError, match="typo_field"):
        load_gateway_config(bad)


def test_flags_win_over_the_file_and_policy_params_merge(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_text("upstream: http://127.0.0.1:1/\nengine: vllm\npolicy_params: {budget_high: 3.0, margin: 0.8}\n")
    cfg = load_gateway_config(path, engine="sglang", policy_params={"margin": 0.7})
    assert cfg.upstream == "http://127.0.0.1:1" and cfg.engine == "sglang"
    assert cfg.policy_params == {"budget_high": 3.0, "margin": 0.7}
    assert cfg.effective_metrics_urls == ("http://127.0.0.1:1/metrics",)
    assert load_gateway_config(upstream="http://h:1", engine="openai").effective_metrics_urls == ()
    pd = load_gateway_config(upstream="http://router:1", engine="sglang",
                             metrics_urls=["http://p0:30000/metrics/", "http://p1:30000/metrics"],
                             decode_metrics_urls=["http://d0:30000/metrics"])
    assert pd.effective_metrics_urls == ("http://p0:30000/metrics", "http://p1:30000/metrics")
    assert pd.decode_metrics_urls == ("http://d0:30000/metrics",)
    with pytest.raises(BasinInputError, match="decode_metrics_urls"):
        load_gateway_config(upstream="http://router:1", decode_metrics_urls=["d0:30000"])


def test_parse_listen():
    assert parse_listen("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert parse_listen("9001") == ("127.0.0.1", 9001)
    assert parse_listen("[::1]:80") == ("::1", 80)
    with pytest.raises(BasinInputError, match="HOST:PORT"):
        parse_listen("host:port")
