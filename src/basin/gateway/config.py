"""The gateway's settings: one validated model, read from a YAML file and
overridden by command-line flags.

The upstream is fixed here and nowhere else: a client can never choose where
the gateway forwards a call.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from basin.errors import BasinInputError
from basin.gateway.adapters import EngineName  # the engine registry's names
from basin.hostport import split_host_port
from basin.yamlfile import load_yaml, validation_message

_HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,64}$")
#: Upper ends of the durations' ranges, in seconds.
HOUR_S = 3_600.0
DAY_S = 24 * HOUR_S
WEEK_S = 7 * DAY_S


class GatewayConfig(BaseModel):
    """Everything ``basin gateway`` needs; every field has a safe default but the upstream."""

    # Every duration and rate is a finite number within its stated range (an infinite
    # timeout or interval would be accepted by "> 0" and mean "never").
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    upstream: str = Field(description="Base URL of the engine or its router, e.g. http://127.0.0.1:30000")
    engine: EngineName = "openai"
    metrics_urls: tuple[str, ...] | None = Field(
        default=None, description="/metrics of the engine or of its prefill servers (they hold the prefix "
        "cache); default UPSTREAM/metrics, none for engine 'openai'; [] turns scraping off")
    decode_metrics_urls: tuple[str, ...] = Field(
        default=(), description="/metrics of PD decode servers (requests waiting for decode memory, its usage)")
    lending_url: str | None = Field(
        default=None, description="Where to POST the policy's decode-memory lending switch ({\"on\": true}), "
        "e.g. basin emulate's UPSTREAM/emulator/lending; a stock engine has no such control. Unset: a "
        "policy runs with lending off and is told of no lent memory")
    low_priority_first: bool | None = Field(
        default=None, description="SGLang only: the server runs --schedule-low-priority-values-first "
        "(default: read from the server's info)")
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=8400, ge=0, le=65535)
    # policy
    policy: str = "basin"
    policy_params: dict[str, Any] = Field(default_factory=dict)
    profile: str | None = Field(default=None, description="BASIN cliff profile (YAML from `basin profile`)")
    predictor: str = Field(default="growth:1.5", description="Peak-context predictor: growth:F (F times "
                           "the first prompt) or ridge:FILE")
    cache_tokens: int | None = Field(default=None, gt=0, description="Prefix-cache capacity in tokens; "
                                     "default: what the engine reports")
    host_cache_tokens: int = Field(default=0, ge=0)
    # sessions
    session_header: str = Field(default="X-Session-Id", description="Request header that carries the session "
                                "id; it wins over the body fields")
    session_body_fields: tuple[str, ...] = Field(
        default=("session_id",), description="Body fields tried in order when the header is absent (OpenAI's "
        "`user` names an end user, not a conversation, so it is not among them by default)")
    session_binding: str | None = Field(
        default=None, description="Request header whose value a session is bound to at its first call (e.g. "
        "Authorization); a later call with another value gets a 403. Unset: sessions are not bound")
    end_header: str = "X-Session-End"
    end_body_field: str = "session_end"
    idle_timeout_s: float = Field(default=600.0, gt=0, le=WEEK_S)
    chars_per_token: float = Field(default=4.0, gt=0, le=64, description="Estimate of prompt tokens before the "
                                   "engine reports them")
    request_stream_usage: bool = Field(default=True, description="Ask for usage in streamed responses "
                                       "(stream_options.include_usage) so contexts are tracked exactly")
    # timing and limits
    scrape_interval_s: float = Field(default=5.0, gt=0, le=HOUR_S)
    stale_after_s: float = Field(default=15.0, gt=0, le=DAY_S)
    keepalive_s: float = Field(default=10.0, gt=0, le=HOUR_S)
    retry_after_s: int = Field(default=60, ge=1, le=DAY_S)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0, description="Largest request body, "
                                "before and after decompression (413 above)")
    offload_body_bytes: int = Field(default=1024 * 1024, ge=0, description="Bodies larger than this (and "
                                    "every compressed one) are parsed in a worker process, off the event loop")
    max_upstream_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0, description="Largest non-streamed "
                                         "engine answer the gateway buffers (502 above)")
    max_metrics_bytes: int = Field(default=8 * 1024 * 1024, gt=0, description="Largest engine /metrics "
                                   "text read (a larger one counts as a failed scrape)")
    upstream_timeout_s: float = Field(default=600.0, gt=0, le=DAY_S)
    client_idle_timeout_s: float = Field(default=30.0, gt=0, le=HOUR_S,
                                         description="A client connection is closed when "
                                         "it has not completed a request's headers this long after opening or "
                                         "after its last answer (idle keep-alive and slow headers alike)")
    client_body_timeout_s: float = Field(default=30.0, gt=0, le=HOUR_S,
                                         description="Longest time to receive a request's "
                                         "body (408 above)")
    max_connections: int = Field(default=1000, ge=1, description="Client connections served at once; a call "
                                 "on one more gets a 503 and the connection is closed")
    shutdown_timeout_s: float = Field(default=30.0, ge=0, le=HOUR_S,
                                      description="On SIGTERM or SIGINT, how long calls in "
                                      "flight may take to finish before they are cut")
    # control loop
    control_retry_s: float = Field(default=1.0, gt=0, le=HOUR_S, description="First retry delay after a control step "
                                   "fails (doubling up to 30 s)")
    control_failure_limit: int = Field(default=3, ge=1, description="Control steps failed in a row after which "
                                       "/healthz reports unhealthy and parked sessions are shed")
    hit_window_s: float = Field(default=60.0, gt=0, le=DAY_S)
    # recording (docs/gateway.md, "Recording your own traffic")
    record: str | None = Field(default=None, description="Write each ended session's calls to this .jsonl "
                               "file in the workload schema (task text hashed, no content)")
    record_max_bytes: int = Field(default=256 * 2**20, gt=0, description="Rotate the record file past this size")
    record_keep: int = Field(default=5, ge=1, description="Rotated record files kept (NAME.1.jsonl is the newest)")
    # vulnerability monitor (docs/gateway.md, "The vulnerability monitor")
    monitor_deployment: str | None = Field(default=None, description="Deployment profile of the engine behind "
                                           "(as for `basin model analyze -d`): turns on the live fluid-model "
                                           "monitor and its basin_gateway_monitor_* gauges")
    monitor_workload: str = Field(default="terminal-bench", description="Prior workload the monitor starts from "
                                  "(a preset or file); contexts and tool time are then fitted to what it sees")
    monitor_host_ratio: float | None = Field(default=None, ge=0, description="Host tier as a multiple of the GPU "
                                             "cache (default: the deployment's)")
    monitor_curve: str = Field(default="paper", description="Hit curve of the model: paper, simulator or a CSV")
    monitor_time_scale: float = Field(default=1.0, gt=0, le=1e6, description="Engine seconds per gateway second: 1 for "
                                      "a real engine, an accelerated emulator's --speed")
    monitor_window_s: float = Field(default=300.0, gt=0, le=WEEK_S, description="Engine seconds over which the monitor "
                                    "takes rates and means")
    monitor_surge_min: float = Field(default=10.0, gt=0, le=DAY_S / 60,
                                     description="Length of the trapping surge searched for")
    monitor_surge_interval_s: float = Field(default=60.0, gt=0, le=DAY_S,
                                            description="Gateway seconds between searches "
                                            "for the smallest trapping surge (each costs about a CPU-second)")
    # state across restarts (docs/gateway.md, "Restarts")
    state_store: str | None = Field(default=None, description="Keep sessions, the parked order and the "
                                    "policy's state across restarts: a SQLite file path, or redis://HOST:PORT/DB "
                                    "shared by several replicas. Unset: a restart starts afresh")
    state_replica: str = Field(default="gateway", description="This replica's name in a shared store (each "
                               "replica keeps its own sessions; a replica restarted under its name takes them "
                               "back)")
    state_flush_s: float = Field(default=0.5, gt=0, le=60, description="Seconds between writes to the state "
                                 "store (what a crash can lose), off the request path")
    admin_token: str | None = Field(default=None, min_length=16)

    @field_validator("predictor")
    @classmethod
    def _gateway_predictor(cls, value: str) -> str:
        kind, _, arg = value.strip().partition(":")
        if kind == "growth" or (kind == "ridge" and arg):
            return value.strip()
        raise ValueError("a gateway never knows a session's true peak or its workload's name: use growth:F "
                         "(e.g. growth:1.5) or ridge:FILE (a model from `basin predict fit --out FILE`)")

    @model_validator(mode="after")
    def _metrics_need_an_engine(self) -> GatewayConfig:
        if self.engine == "openai" and (self.metrics_urls or self.decode_metrics_urls):
            raise ValueError("engine 'openai' has no metrics mapping; name the engine (sglang, vllm, llamacpp) "
                             "to scrape its metrics, or drop metrics_urls")
        return self

    @field_validator("upstream")
    @classmethod
    def _http_url(cls, value: str) -> str:
        url = _check_url(value)
        # The gateway appends /v1/...; a base URL that already ends in /v1 would send every call to /v1/v1.
        while url.endswith("/v1"):
            url = url[: -len("/v1")].rstrip("/")
        if not urlsplit(url).hostname:
            raise ValueError("expected an http(s) URL such as http://127.0.0.1:30000")
        return url

    @field_validator("lending_url")
    @classmethod
    def _lending_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)

    @field_validator("metrics_urls", "decode_metrics_urls")
    @classmethod
    def _http_urls(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(_check_url(v) for v in value)

    @field_validator("session_header", "end_header", "session_binding")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is not None and not _HEADER_NAME.match(value):
            raise ValueError("a header name is 1-64 letters, digits or '-'")
        return value

    @property
    def effective_metrics_urls(self) -> tuple[str, ...]:
        if self.metrics_urls is not None:
            return self.metrics_urls
        return () if self.engine == "openai" else (f"{self.upstream}/metrics",)


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http(s) URL such as http://127.0.0.1:30000")
    if parts.query or parts.fragment:
        raise ValueError("a base URL takes no query or fragment")
    return value.rstrip("/")


def load_gateway_config(path: str | Path | None = None, **overrides: Any) -> GatewayConfig:
    """The config from a YAML file (optional) with flag overrides on top; bad
    input raises :class:`BasinInputError` naming the field."""
    data: dict[str, Any] = {}
    source = "gateway flags"
    if path is not None:
        loaded = load_yaml(Path(path))
        if not isinstance(loaded, dict):
            raise BasinInputError(f"{path}: expected a mapping of gateway settings, got {type(loaded).__name__}")
        data.update(loaded)
        source = str(path)
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "policy_params" and isinstance(data.get(key), dict) and isinstance(value, dict):
            value = {**data[key], **value}
        data[key] = value
    if "upstream" not in data:
        raise BasinInputError(f"{source}: field 'upstream' is required; pass --upstream URL "
                              "(e.g. http://127.0.0.1:30000) or set it in the config file")
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise BasinInputError(validation_message(source, exc)) from None


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``PORT``) as given to ``--listen``."""
    address = split_host_port(value)
    if address is None:
        raise BasinInputError(f"field 'listen': expected HOST:PORT such as 127.0.0.1:8400, got {value!r}")
    return address
