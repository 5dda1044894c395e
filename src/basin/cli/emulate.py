"""``basin emulate``: an OpenAI-compatible engine timed by the simulator (docs/emulate.md)."""

from __future__ import annotations

from typing import Optional

import typer

from basin.cli import eventloop


def emulate(
    deployment: str = typer.Option(..., "--deployment", help="Deployment to emulate: a file of "
                                   "profiles/deployments/ (e.g. 1p3d-h200) or a shape such as 2P4D-h200."),
    host_ratio: Optional[float] = typer.Option(None, "--host-ratio", help="Host tier as a multiple of the GPU "
                                               "prefix cache; 0 is GPU-only (default: the deployment's)."),
    speed: float = typer.Option(1.0, "--speed", help="Simulated seconds per wall second (30 runs 30x faster "
                                "than real time)."),
    listen: str = typer.Option("127.0.0.1:30000", "--listen", help="HOST:PORT to bind (a bare PORT binds "
                               "127.0.0.1)."),
    metrics_style: str = typer.Option("sglang", "--metrics-style", help="sglang or vllm: the engine whose "
                                      "/metrics names and priority convention it copies."),
    seed: int = typer.Option(0, "--seed", help="Seeds the text of the answers."),
    max_tokens: Optional[int] = typer.Option(None, "--default-max-tokens", help="Output tokens of a call that "
                                             "names no max_tokens (default 256)."),
) -> None:
    """Serve chat completions timed by the simulator's engine model, in real time or accelerated.

    Example:

        basin emulate --deployment 1p3d-h200 --speed 30 --listen 127.0.0.1:30000

    then: basin gateway --engine sglang --upstream http://127.0.0.1:30000
    """
    from basin.emulate.config import emulator_config, parse_listen
    from basin.emulate.server import serve_forever
    from basin.errors import BasinInputError

    if metrics_style not in ("sglang", "vllm"):
        raise BasinInputError(f"--metrics-style {metrics_style!r}: use sglang or vllm")
    host, port = parse_listen(listen)
    cfg = emulator_config(deployment=deployment, host_ratio=host_ratio, speed=speed, listen_host=host,
                          listen_port=port, metrics_style=metrics_style, seed=seed, default_max_tokens=max_tokens)
    cfg.resolve()  # an unknown deployment or hardware fails here, before anything listens
    try:
        eventloop.run(serve_forever(cfg, typer.echo))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise BasinInputError(f"cannot listen on {host}:{port} ({exc}); pick another --listen address") from None
