"""The headline of docs/engines.md's LPM experiment (sweeps/lpm-trap-1p1d.yaml
and sweeps/lpm-surge-1p3d.yaml), held over five seeds: SGLang's LPM keeps
trap-1p1d's +100% surge out of the trap because its prefill queue never
passes LPM's cut-off; after 1P3D's x5 surge the queue passes it, LPM falls
back to first-come order and HiCache is trapped anyway; and BASIN, whose
session priorities LPM ignores, loses the escape it makes under FCFS.
About 40 s."""

from __future__ import annotations

import numpy as np
import pytest

from basin.experiments.runner import run_scenario
from basin.experiments.scenario import load_scenario
from basin.metrics.state import RunState
from basin.sim.prefill import LPM_MAX_WAITING

pytestmark = pytest.mark.scenario

SEEDS = range(5)
MAJORITY = len(SEEDS) // 2 + 1


def _runs(name: str, policy: str, system: str, *overrides: str) -> list:
    return [run_scenario(load_scenario(name, [*overrides, f"engine.schedule_policy={policy}", f"seed={seed}"]),
                         system) for seed in SEEDS]


def _trapped(runs) -> list:
    return [r for r in runs if r.summary.state is RunState.TRAPPED]


def _queue(run, from_min: float) -> np.ndarray:
    ts = run.result.timeseries
    return np.asarray(ts["prefill_queue_len"])[np.asarray(ts["minute"]) >= from_min]


def test_lpm_keeps_trap_1p1d_out_of_the_trap_below_its_cut_off():
    fcfs = _runs("trap-1p1d", "fcfs", "hicache")
    lpm = _runs("trap-1p1d", "lpm", "hicache")
    assert len(_trapped(fcfs)) >= MAJORITY
    assert not _trapped(lpm)
    for run in lpm:
        assert run.summary.hit_rate_final >= 0.8
        assert _queue(run, 0).max() <= LPM_MAX_WAITING  # LPM ordered the queue the whole run


def test_after_a_x5_surge_on_1p3d_the_queue_passes_the_cut_off_and_lpm_is_trapped_too():
    lpm = _runs("surge-1p3d", "lpm", "hicache")
    trapped = _trapped(lpm)
    assert len(trapped) >= MAJORITY
    for run in trapped:
        assert run.summary.hit_rate_final < 0.35
        assert np.median(_queue(run, 80)) > LPM_MAX_WAITING  # first-come order in the final windows


def test_lpm_takes_away_the_prefill_order_basin_escapes_1p3d_with():
    fcfs = _runs("surge-1p3d", "fcfs", "basin")
    lpm = _runs("surge-1p3d", "lpm", "basin")
    assert sum(r.summary.state is RunState.HEALTHY for r in fcfs) >= MAJORITY
    assert len(_trapped(lpm)) >= MAJORITY
