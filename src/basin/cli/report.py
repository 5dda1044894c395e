"""``basin report``: one self-contained HTML page from an output folder."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

_err = Console(stderr=True)


def report(
    directory: Path = typer.Argument(..., help="The --out folder of basin run, compare or sweep."),
    out: Optional[Path] = typer.Option(None, "--out", help="The HTML file to write (default DIR/report.html)."),
) -> None:
    """Render a run, compare or sweep folder to one HTML page: its plots
    (embedded), its table and its provenance; no network needed to view it.

    Example: basin report results/sweeps/demo-surge-size
    """
    from basin.cli.outputs import check_out_file
    from basin.experiments.report import write_report

    check_out_file(out)
    path = write_report(directory, out)
    _err.print(f"report in {path}", highlight=False, soft_wrap=True)
