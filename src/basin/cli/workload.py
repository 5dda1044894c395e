"""``basin workload ...``: list, inspect, synthesise and import workloads."""

from __future__ import annotations

import enum
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from basin.errors import BasinInputError

app = typer.Typer(help="Agent workloads: presets, statistics, synthesis and import.", no_args_is_help=True)


class ImportSource(str, enum.Enum):
    """Foreign formats ``basin workload import`` understands."""

    AGENT_TABLE = "agent-table"
    MOONCAKE = "mooncake"
    AZURE = "azure"
    SERVEGEN = "servegen"
    OPENAI = "openai"
    OTEL = "otel"
    LITELLM = "litellm"
    VLLM = "vllm"
    SGLANG = "sglang"


#: Sources read by :mod:`basin.workload.logs` (request logs with their own arrival times).
_LOG_SOURCES = ("openai", "otel", "litellm", "vllm", "sglang")
#: Below this many sessions an imported log is flagged as likely to be replayed many times over.
_SMALL_LOG_SESSIONS = 50


def _check_workload_out(out: Path) -> None:
    from basin.workload.io import WORKLOAD_SUFFIXES, workload_suffix

    if workload_suffix(out) is None:
        raise BasinInputError(f"--out {out}: use a workload file ending in {', '.join(WORKLOAD_SUFFIXES)}")
    from basin.cli.outputs import check_out_file

    check_out_file(out)


def _wrote(out: Path, sessions: int, calls: int) -> None:
    typer.echo(f"wrote {sessions} sessions, {calls} calls to {out}")


@app.command("list")
def list_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, one object per preset "
                                                       "(name, kind, sessions, description)."),
) -> None:
    """List the workload presets any command accepts in place of a file.

    Example:

        basin workload list --json
    """
    from dataclasses import asdict

    from basin.workload.presets import list_presets

    if as_json:
        typer.echo(json.dumps([asdict(p) for p in list_presets()]))
        return
    table = Table(title="workload presets")
    for column in ("name", "kind", "sessions", "description"):
        table.add_column(column, justify="right" if column == "sessions" else "left")
    for p in list_presets():
        table.add_row(p.name, p.kind, f"{p.sessions:,}", p.description)
    Console().print(table)


@app.command("stats")
def stats_cmd(
    spec: str = typer.Argument(..., metavar="NAME|FILE", help="A preset name or a workload file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    sessions: int | None = typer.Option(None, "--sessions", help="Synthetic size, or a seeded sample."),
    seed: int = typer.Option(0, "--seed", help="Seed for synthetic presets and sampling."),
) -> None:
    """Print a workload's headline statistics (docs/workloads.md defines them).

    Example:

        basin workload stats swebench-deepseek --json
    """
    from basin.workload.presets import resolve_workload
    from basin.workload.stats import workload_stats

    st = workload_stats(resolve_workload(spec, seed=seed, n_sessions=sessions))
    if as_json:
        typer.echo(json.dumps(st.to_dict()))
        return
    table = Table(title=f"workload {spec}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for key, value in st.to_dict().items():
        table.add_row(key, _format_stat(key, value))
    Console().print(table)


def _format_stat(key: str, value: float | int | None) -> str:
    if value is None:
        return "-"
    if key == "reuse_fraction":
        return f"{100 * value:.1f} %"
    if key.startswith("tool_gap_s"):
        return f"{value:.3f} s"
    return f"{value:,.0f}" if float(value).is_integer() or value >= 100 else f"{value:,.1f}"


@app.command("synth")
def synth_cmd(
    preset: str = typer.Option(..., "--preset", help="A synthetic preset (see `basin workload list`)."),
    out: Path = typer.Option(..., "--out", help="Output file: .jsonl, .jsonl.gz or .parquet."),
    sessions: int | None = typer.Option(None, "--sessions", help="Sessions to generate (default: preset's)."),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed gives the same workload."),
) -> None:
    """Generate a synthetic workload and write it to a file.

    Example:

        basin workload synth --preset terminal-bench --sessions 500 --seed 1 --out tb500.parquet
    """
    from basin.workload.io import write_workload
    from basin.workload.synthetic import synthesize

    _check_workload_out(out)
    w = synthesize(preset, n_sessions=sessions, seed=seed)
    write_workload(w, out)
    _wrote(out, len(w.sessions), w.n_calls)


@app.command("import")
def import_cmd(
    source: ImportSource = typer.Argument(..., help="Format of PATH."),
    path: Path = typer.Argument(..., help="The file to import."),
    out: Path = typer.Option(..., "--out", help="Workload file (.jsonl/.jsonl.gz/.parquet); servegen: .csv."),
    column: str | None = typer.Option(None, "--column", help="servegen: the rate column to keep."),
    reuse: str = typer.Option("append", "--reuse",
                              help="request logs: reused prefix = previous context ('append') or the "
                                   "reported cached tokens ('cached')."),
) -> None:
    """Convert a shipped source format into a workload file (servegen: a rate series CSV).

    agent-table: a *_calls.csv.gz with its *_sessions.csv (and optional
    *_tasks.jsonl) beside it. mooncake: a Mooncake trace .jsonl(.gz), sessions
    rebuilt from prefix hashes. azure: an Azure LLM inference CSV, one-call
    sessions with their arrival times. servegen: an aggregate rate CSV.
    openai, otel, litellm, vllm, sglang: request logs grouped into sessions
    with their own start times (docs/workloads.md section 3.5 states each
    format's grouping rule).

    Example:

        basin workload import mooncake data/mooncake_fast25/conversation_trace.jsonl.gz --out conv.parquet
    """
    from basin.workload.io import read_azure_trace, write_workload
    from basin.workload.mooncake import load_mooncake_workload

    if source is ImportSource.SERVEGEN:
        _import_servegen(path, out, column)
        return
    if column is not None:
        raise BasinInputError("--column applies to servegen only")
    if reuse != "append" and source.value not in _LOG_SOURCES:
        raise BasinInputError(f"--reuse applies to the request-log formats ({', '.join(_LOG_SOURCES)}) only")
    _check_workload_out(out)
    if source.value in _LOG_SOURCES:
        _import_log(source.value, path, out, reuse)
        return
    if source is ImportSource.AGENT_TABLE:
        from basin.workload.agent_tables import load_agent_table_files

        w = load_agent_table_files(path)
    elif source is ImportSource.MOONCAKE:
        w = load_mooncake_workload(path)
    else:
        w = read_azure_trace(path)
    write_workload(w, out)
    _wrote(out, len(w.sessions), w.n_calls)


def _import_log(fmt: str, path: Path, out: Path, reuse: str) -> None:
    from basin.workload.io import write_workload
    from basin.workload.logs import load_request_log
    from basin.workload.presets import small_trace_warning

    w = load_request_log(fmt, path, reuse)  # type: ignore[arg-type]  # checked inside
    write_workload(w, out)
    _wrote(out, len(w.sessions), w.n_calls)
    skipped = w.extra.get("skipped_records", 0)
    if skipped:
        typer.echo(f"skipped {skipped} records that are not LLM calls (no token usage, not a GenAI span)")
    duplicates = w.extra.get("duplicate_spans", 0)
    if duplicates:
        typer.echo(f"skipped {duplicates} spans that repeat a call already counted (the same call seen by a "
                   "proxy or the engine below the client)")
    warning = small_trace_warning(w, _SMALL_LOG_SESSIONS)
    if warning:
        typer.echo(f"warning: {warning}", err=True)


def _import_servegen(path: Path, out: Path, column: str | None) -> None:
    from basin.workload.arrivals import load_rate_series

    if out.suffix.lower() != ".csv":
        raise BasinInputError(f"--out {out}: a servegen rate series is written as .csv")
    series = load_rate_series("servegen", path, column)
    series.to_csv(out)
    typer.echo(f"wrote {len(series.t_s)} rate windows of {series.name} to {out}")
