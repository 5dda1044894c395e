"""Every speed change keeps the simulator's tables bit-identical (see digests.py)."""

from __future__ import annotations

import pytest
from tests.sim.digests import CASES, case_id, run_digest, stored


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_tables_of_a_benchmark_run_are_unchanged(case):
    expected = stored()[case_id(case)]
    assert run_digest(case) == expected, (
        f"{case_id(case)}: the run's tables changed; if the model changed on purpose, "
        "rewrite the digests with `python -m tests.sim.digests --write` and say so in the commit")
