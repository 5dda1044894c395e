"""``basin gateway``: the session gateway in front of a real engine (docs/gateway.md)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional

import typer

from basin.cli import eventloop
from basin.gateway.adapters import engines_help


def gateway(
    upstream: Optional[str] = typer.Option(None, "--upstream", help="Engine or router base URL, e.g. "
                                           "http://127.0.0.1:30000 (required here or in --config)."),
    engine: Optional[str] = typer.Option(None, "--engine", help=f"{engines_help()}; openai (the default) is "
                                         "any OpenAI-compatible server and has no metrics."),
    metrics_url: list[str] = typer.Option([], "--metrics-url", help="/metrics of the engine or of each PD "
                                          "prefill server; repeatable (default UPSTREAM/metrics)."),
    decode_metrics_url: list[str] = typer.Option([], "--decode-metrics-url", help="/metrics of each PD decode "
                                                 "server (decode-memory queue); repeatable."),
    lending_url: Optional[str] = typer.Option(None, "--lending-url", help="Engine endpoint taking the policy's "
                                              "decode-memory lending switch, e.g. http://127.0.0.1:30000/emulator/"
                                              "lending (basin emulate's; a stock engine has none). Unset: lending "
                                              "stays off."),
    policy: Optional[str] = typer.Option(None, "--policy", help="Control policy by name (default basin)."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="BASIN cliff profile from `basin profile`."),
    listen: Optional[str] = typer.Option(None, "--listen", help="HOST:PORT to bind (default 127.0.0.1:8400)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file with any gateway setting "
                                          "(flags win over it)."),
    cache_tokens: Optional[int] = typer.Option(None, "--cache-tokens", help="Tokens the engine's prefix cache "
                                               "holds (default: what the engine reports)."),
    param: list[str] = typer.Option([], "--param", help="Policy parameter NAME=VALUE (JSON value); repeatable."),
    session_binding: Optional[str] = typer.Option(None, "--session-binding", help="Bind each session to this "
                                                  "request header's value at its first call, e.g. Authorization "
                                                  "(calls with another value get a 403)."),
    record: Optional[Path] = typer.Option(None, "--record", help="Write each ended session's calls to this "
                                          ".jsonl file in the workload schema (task text hashed, no content); "
                                          "`basin run` and `basin replay` read it."),
    monitor: Optional[str] = typer.Option(None, "--monitor", help="Deployment behind the gateway (as for "
                                          "`basin model analyze -d`): export the live vulnerability monitor's "
                                          "gauges (tipping population, vulnerable band, smallest trapping surge)."),
    monitor_workload: Optional[str] = typer.Option(None, "--monitor-workload", help="The monitor's prior "
                                                   "workload (default terminal-bench)."),
    monitor_time_scale: Optional[float] = typer.Option(None, "--monitor-time-scale", help="Engine seconds per "
                                                       "gateway second: an accelerated emulator's --speed (1)."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Run the BASIN session gateway: an OpenAI-compatible proxy that parks, orders and sheds agent sessions.

    SIGTERM and SIGINT drain it: new sessions are refused, parked calls get a retryable 503, and calls in
    flight get shutdown_timeout_s (30 s) to finish.

    Example:

        basin gateway --upstream http://127.0.0.1:30000 --engine sglang --profile profiles/basin/1p3d-h200.yaml
    """
    from basin.errors import BasinInputError
    from basin.gateway.config import load_gateway_config, parse_listen
    from basin.gateway.server import build_policy, serve_forever

    params: dict[str, object] = {}
    for item in param:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise BasinInputError(f"--param {item!r}: write NAME=VALUE, e.g. --param budget_high=2.5")
        try:
            params[name.strip()] = json.loads(value)
        except ValueError:
            params[name.strip()] = value
    overrides: dict[str, object] = {
        "upstream": upstream, "engine": engine, "metrics_urls": metrics_url or None,
        "decode_metrics_urls": decode_metrics_url or None, "lending_url": lending_url, "policy": policy,
        "profile": str(profile) if profile else None, "cache_tokens": cache_tokens,
        "admin_token": os.environ.get("BASIN_ADMIN_TOKEN") or None, "session_binding": session_binding,
        "record": str(record) if record else None, "monitor_deployment": monitor,
        "monitor_workload": monitor_workload, "monitor_time_scale": monitor_time_scale,
    }
    if listen is not None:
        overrides["listen_host"], overrides["listen_port"] = parse_listen(listen)
    if params:
        overrides["policy_params"] = params
    cfg = load_gateway_config(config, **overrides)
    if cfg.record is not None:
        from basin.gateway.record import check_record_path

        check_record_path(cfg.record)
    if cfg.monitor_deployment is not None:
        from basin.gateway.monitor import build_monitor

        build_monitor(cfg.monitor_deployment, cfg.monitor_workload, cfg.monitor_host_ratio, cfg.monitor_curve)
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise BasinInputError(f"--log-level {log_level!r}: use debug, info, warning or error")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    gateway_policy = build_policy(cfg)  # refused here, before anything listens, if a gateway cannot run it
    try:
        eventloop.run(serve_forever(cfg, gateway_policy))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise BasinInputError(f"cannot listen on {cfg.listen_host}:{cfg.listen_port} ({exc}); "
                              "pick another --listen address") from None
