"""A sweep's results reduced to its table: one row per point, its
coordinates, its store key and its run summary, as Parquet."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from basin.experiments.store import RunStore
from basin.experiments.sweep_spec import Sweep, value_text

TABLE_FILE = "sweep.parquet"


def table_rows(sweep: Sweep, store: RunStore) -> list[dict[str, Any]]:
    """One row per point, in the grid's order: its coordinates, its store key
    and its run summary (without the windows; the state by name)."""
    rows = []
    for p in sweep.points:
        summary = store.summary(p.key).to_dict()
        summary.pop("windows", None)
        summary.pop("system", None)
        rows.append({**{c: p.coords.get(c) for c in sweep.coord_columns}, "run": p.key, **summary})
    return rows


def _column(values: list[Any]) -> Any:
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa

    if any(isinstance(v, (dict, list, tuple)) for v in values):
        return pa.array([None if v is None else json.dumps(v, sort_keys=True) for v in values], pa.string())
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed kinds (a number and a name): kept as their YAML text
        return pa.array([None if v is None else value_text(v) for v in values], pa.string())


def write_table(sweep: Sweep, store: RunStore, path: Path) -> Path:
    """The sweep's Parquet table, written whole or not at all."""
    return write_rows(table_rows(sweep, store), path)


def write_rows(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Rows as a Parquet table (a column per key, in first-seen order; mixed
    or nested values as their YAML text), written whole or not at all."""
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(dict.fromkeys(k for r in rows for k in r))
    arrow = pa.table({n: _column([r.get(n) for r in rows]) for n in names})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(arrow, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
