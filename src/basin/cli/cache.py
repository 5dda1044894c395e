"""``basin cache replay``: the prefix cache alone, on a request trace."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from basin.errors import BasinInputError

app = typer.Typer(help="The prefix cache on its own: replay a trace, size a cache.", no_args_is_help=True)


@app.command("replay")
def replay(
    trace: str = typer.Argument(..., help="A trace with block hashes: 'mooncake-conversation', "
                                         "'mooncake-synthetic' or a Mooncake-format JSONL(.gz) file."),
    capacity_tokens: int = typer.Option(..., "--capacity-tokens", help="GPU prefix-cache size in tokens."),
    page: int = typer.Option(64, "--page", help="Page size in tokens."),
    host_tokens: int = typer.Option(0, "--host-tokens", help="Host tier size in tokens (0: none)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Replay requests in trace order through one radix cache and print the token hit rate.

    Example: basin cache replay mooncake-conversation --capacity-tokens 2000000 --host-tokens 8000000
    """
    from basin.sim.replay import replay_trace
    from basin.workload.mooncake import load_request_trace

    if capacity_tokens <= 0:
        raise BasinInputError("--capacity-tokens must be a positive number of tokens")
    if page <= 0 or host_tokens < 0:
        raise BasinInputError("--page must be positive and --host-tokens non-negative")
    _refuse_other_formats(trace)
    requests = load_request_trace(trace)
    block = 512
    result = replay_trace([(r.block_hashes, r.input_tokens) for r in requests], capacity_tokens,
                          block, page_tokens=page, host_tokens=host_tokens)
    data = result.to_dict()
    if as_json:
        print(json.dumps(data))
        return
    table = Table(title=f"cache replay: {trace}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in data.items():
        table.add_row(name, f"{value:.4f}" if isinstance(value, float) else f"{value:,}")
    Console().print(table)


#: What `cache replay` reads, for messages.
TRACE_FORMAT = ("a Mooncake-format trace: JSON lines (.jsonl or .jsonl.gz), one request per line with "
                "timestamp, input_length, output_length and hash_ids")


def _refuse_other_formats(trace: str) -> None:
    """Name the format wanted when the file is plainly another one (a Parquet
    or CSV workload would otherwise fail as "malformed JSON" on line 1)."""
    from pathlib import Path

    path = Path(trace)
    if not path.is_file():
        return  # a shipped name, or a missing file (reported by the reader)
    with open(path, "rb") as fh:
        head = fh.read(4)
    name = path.name.lower()
    if head == b"PAR1" or name.endswith(".parquet"):
        kind = "a Parquet file"
    elif name.endswith((".csv", ".csv.gz")):
        kind = "a CSV file"
    elif name.endswith((".yaml", ".yml")):
        kind = "a YAML file"
    else:
        return
    raise BasinInputError(f"{path}: is {kind}; cache replay reads {TRACE_FORMAT} "
                          "(e.g. `basin cache replay mooncake-conversation`). Session workloads (.parquet) "
                          "run with `basin run` instead")
