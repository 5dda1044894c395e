"""``basin replay``: replay a workload's agent sessions against a real endpoint."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table


def replay(
    workload: str = typer.Argument(..., help="Workload preset or file (see `basin workload list`)."),
    target: str = typer.Option(..., "--target", help="OpenAI-compatible base URL: the gateway or an engine."),
    rate: float = typer.Option(2.0, "--rate", help="Session arrivals per minute (Poisson, wall clock)."),
    duration_s: float = typer.Option(600.0, "--duration-s", help="Seconds over which sessions arrive."),
    sessions: Optional[int] = typer.Option(None, "--sessions", help="Stop after this many arrivals."),
    token_scale: float = typer.Option(1.0, "--token-scale", help="Multiply prompt and output tokens (e.g. 0.02 "
                                      "for a small local engine)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Multiply tool gaps."),
    model: str = typer.Option("default", "--model", help="Model name sent in each call."),
    seed: int = typer.Option(0, "--seed", help="Seed of the arrivals, the session draw and the text."),
    out: Path = typer.Option(Path("results/replay"), "--out", help="Directory for calls.parquet and summary.json."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
) -> None:
    """Replay agent sessions (closed loop, with tool gaps) against an endpoint and record every call.

    Example:

        basin replay terminal-bench --target http://127.0.0.1:8400 --rate 6 --sessions 20 --token-scale 0.02
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from basin.errors import BasinInputError
    from basin.gateway.replay import ReplaySettings, schedule_sessions, write_calls
    from basin.gateway.replay import replay as run_replay
    from basin.jsonvalues import json_values

    if sessions is not None and sessions <= 0:
        raise BasinInputError(f"--sessions: expected a whole number > 0, got {sessions}")
    cfg = ReplaySettings(target=target, model=model, rate_per_min=rate, duration_s=duration_s, seed=seed,
                         token_scale=token_scale, time_scale=time_scale)
    arrivals = schedule_sessions(workload, cfg, sessions)
    if not arrivals:
        raise BasinInputError(f"no session arrives in {duration_s:g} s at {rate:g}/min; raise --rate or --duration-s")
    console = Console(stderr=True)
    with Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=as_json) as bar:
        job = bar.add_task("sessions", total=len(arrivals))
        records, summary = asyncio.run(run_replay(arrivals, cfg, lambda n: bar.update(job, completed=n)))
    calls_path = write_calls(records, out / "calls.parquet")
    plain = json_values(asdict(summary))
    (out / "summary.json").write_text(json.dumps({**plain, "workload": workload, "target": target}, indent=2))
    if as_json:
        print(json.dumps(plain))
        return
    table = Table(title=f"replay of {workload} against {target}")
    for name in ("sessions", "completed", "shed", "failed", "calls", "TTFT p50", "TTFT p90", "hit rate",
                 "completed/h"):
        table.add_column(name, justify="right")
    table.add_row(str(summary.sessions), str(summary.completed), str(summary.shed), str(summary.failed),
                  str(summary.calls), f"{summary.ttft_p50_s:.3f}s", f"{summary.ttft_p90_s:.3f}s",
                  f"{summary.hit_rate:.2f}", f"{summary.completed_per_h:.1f}")
    Console().print(table)
    Console().print(f"calls in {calls_path}")
