"""The Ray executor gives the local pool's table, byte for byte (Ray is in the
dev extras, so this runs wherever the tests do)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from tests.test_sweep import write_sweep

from basin.experiments.sweep import run_sweep
from basin.experiments.sweep_grid import load_sweep


def test_ray_and_local_give_the_same_table(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 2.0]\n  seed: [0, 1]\n")
    sweep = load_sweep(path)
    local = run_sweep(sweep, tmp_path / "local", workers=2)
    on_ray = run_sweep(sweep, tmp_path / "ray", executor="ray", workers=2)
    assert local.runs_computed == on_ray.runs_computed == 4
    assert on_ray.table.read_bytes() == local.table.read_bytes()
    assert pq.read_table(on_ray.table).equals(pq.read_table(local.table))
    for key in (p.key for p in sweep.points):  # the stored run tables too
        for name in ("calls.parquet", "sessions.parquet", "timeseries.parquet", "summary.json"):
            assert (tmp_path / "ray" / "runs" / key / name).read_bytes() == \
                (tmp_path / "local" / "runs" / key / name).read_bytes()
