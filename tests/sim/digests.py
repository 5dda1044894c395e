"""Digests of the simulator's output tables on a fixed set of short runs.

Speed work must keep every run bit-identical; a change to the model is made on
purpose, says so in its commit, and rewrites the stored digests with

    .venv/bin/python -m tests.sim.digests --write

The cases cover each mechanism a speed change can touch: the radix cache with
a host tier under a trapping surge, every policy's engine mechanisms (TTL pins,
borrowed prefill, lending, ordering, admission), a GPU-only cache, hybrid-free
1P1D H100, and two prefill instances behind the cache-aware router.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

DIGEST_FILE = Path(__file__).with_name("digests.json")

#: (scenario, system, overrides): short enough for the test suite, long enough
#: to reach each run's interesting regime (surge, trap, lending).
#: Base rates are fixed (half of 18.5 and of 39 sessions/min, the rates these
#: cases have always run at), so that a new cliff profile, which moves a
#: scenario's base rate, leaves the digests alone.
BASE_1P3D = "arrivals.base_per_min=9.25"
BASE_2P6D = "arrivals.base_per_min=19.5"
CASES: list[tuple[str, str, tuple[str, ...]]] = [
    *[("surge-1p3d", system, (BASE_1P3D, "duration_min=30", "measure_end_min=30"))
      for system in ("hicache", "basin", "continuum", "thunderagent", "concur", "crossflow", "composition")],
    ("trap-1p1d", "hicache", ("duration_min=40", "measure_end_min=40")),
    ("main-1p3d-gpuonly", "basin", (BASE_1P3D, "duration_min=25", "measure_end_min=25")),
    ("surge-1p3d", "basin", ("deployment=2p6d-h200", BASE_2P6D, "duration_min=20", "measure_end_min=20")),
]


#: Whole benchmark runs (a minute or two each): checked by hand with ``--full``
#: before a speed change lands, not in the test suite.
FULL_CASES: list[tuple[str, str, tuple[str, ...]]] = [
    ("surge-1p3d", "hicache", (BASE_1P3D,)),
    ("surge-1p3d", "basin", (BASE_1P3D,)),
    ("trap-1p1d", "hicache", ()),
    ("surge-1p3d", "basin", ("deployment=2p6d-h200", BASE_2P6D)),
]


def case_id(case: tuple[str, str, tuple[str, ...]]) -> str:
    scenario, system, overrides = case
    return " ".join([scenario, system, *overrides])


def table_digest(tables: dict[str, dict[str, object]]) -> str:
    """SHA-256 over every column of every table, in a fixed order."""
    h = hashlib.sha256()
    for name in sorted(tables):
        table = tables[name]
        for col in sorted(table):
            a = np.asarray(table[col])
            h.update(f"{name}.{col}:{a.dtype}".encode())
            h.update(a.tobytes() if a.dtype != object else repr(a.tolist()).encode())
    return h.hexdigest()[:20]


def run_digest(case: tuple[str, str, tuple[str, ...]]) -> str:
    from basin.experiments.runner import run_scenario
    from basin.experiments.scenario import load_scenario

    scenario, system, overrides = case
    run = run_scenario(load_scenario(scenario, list(overrides)), system)
    r = run.result
    return table_digest({"calls": r.calls, "sessions": r.sessions, "timeseries": r.timeseries})


def stored() -> dict[str, str]:
    data: dict[str, str] = json.loads(DIGEST_FILE.read_text(encoding="utf-8"))
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description="Check or rewrite the simulator's output digests.")
    parser.add_argument("--write", action="store_true", help="store the current digests (a deliberate model change)")
    parser.add_argument("--full", action="store_true", help="also the whole benchmark runs (several minutes)")
    args = parser.parse_args()
    current = {}
    for case in CASES + (FULL_CASES if args.full else []):
        current[case_id(case)] = run_digest(case)
        print(case_id(case), current[case_id(case)], flush=True)
    if args.write:
        DIGEST_FILE.write_text(json.dumps(stored() | current, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {DIGEST_FILE}")
    else:
        old = stored()
        changed = [k for k in current if old.get(k) != current[k]]
        missing = [k for k in current if k not in old]
        if missing:
            print(f"no stored digest for: {missing}")
        print("all identical" if not changed else f"changed: {changed}")


if __name__ == "__main__":
    main()
