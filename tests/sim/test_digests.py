"""Every speed change keeps the simulator's tables bit-identical (see digests.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.sim.digests import CASES, case_id, run_digest, stored


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_tables_of_a_benchmark_run_are_unchanged(case):
    expected = stored()[case_id(case)]
    assert run_digest(case) == expected, (
        f"{case_id(case)}: the run's tables changed; if the model changed on purpose, "
        "rewrite the digests with `python -m tests.sim.digests --write` and say so in the commit")


#: The cases the pure-Python simulator reruns in a subprocess (the shortest
#: ones that cover both a trapped cache and several prefill instances).
PURE_CASES = [c for c in CASES if c[0] == "trap-1p1d" or "deployment=2p6d-h200" in c[2]]


def test_the_pure_python_simulator_gives_the_same_tables():
    """With a compiled build present this compares the two builds; without
    one it reruns the pure modules in a fresh process."""
    script = ("import json, basin.sim; from tests.sim.digests import CASES, case_id, run_digest; "
              f"ids = {[case_id(c) for c in PURE_CASES]!r}; "
              "print(json.dumps({'compiled': basin.sim.compiled(), "
              "'digests': {case_id(c): run_digest(c) for c in CASES if case_id(c) in ids}}))")
    env = dict(os.environ, BASIN_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["compiled"] is False
    expected = stored()
    assert report["digests"] == {case_id(c): expected[case_id(c)] for c in PURE_CASES}


def test_a_current_compiled_build_is_the_one_in_use():
    """`make test` builds the compiled simulator first (`make accel`); when a
    build is there and matches its sources, this process must be running it,
    so the digests above checked the compiled modules."""
    import basin.sim
    from basin import accel

    if not accel._built():
        pytest.skip("no compiled simulator here (make accel builds it)")
    current = accel.DIGEST_FILE.is_file() and \
        accel.DIGEST_FILE.read_text(encoding="utf-8").strip() == accel.source_digest()
    assert current, "the compiled simulator is older than its sources: run `make accel`"
    assert basin.sim.compiled()


#: Colocated runs, which the stored cases do not cover, pinned as main gave
#: them while the colocated core was still pure Python only (d35a36a; the
#: first also at b351573, before the calibrated front-end cost changed
#: real-trap-vllm's profile): it is compiled since it shares the PD core's
#: base (basin.sim.core).
COLOCATED = {
    ("trap-1p1d", "basin", ("deployment=1C-h100-nvl", "duration_min=30", "measure_end_min=20")):
        "08301cf3dc95d8e3809a",
    ("real-trap-vllm", "hicache", ()): "9bd53c5c8fa4a6f2a2b5",
}


@pytest.mark.parametrize("case", list(COLOCATED), ids=case_id)
def test_a_colocated_run_is_unchanged(case):
    assert run_digest(case) == COLOCATED[case]


def test_the_pure_python_colocated_core_gives_the_same_tables():
    script = ("import json, basin.sim; from tests.sim.digests import run_digest; "
              f"print(json.dumps({{'compiled': basin.sim.compiled(), 'digests': [run_digest(c) for c in "
              f"{list(COLOCATED)!r}]}}))")
    env = dict(os.environ, BASIN_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"compiled": False, "digests": list(COLOCATED.values())}
