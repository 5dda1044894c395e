"""``basin workload ...``: list, inspect, synthesise and import workloads."""

from __future__ import annotations

import typer

app = typer.Typer(help="Agent workloads: presets, statistics, synthesis and import.", no_args_is_help=True)
