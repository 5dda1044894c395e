"""The paper's behaviours, from the simulator's own dynamics (CALIBRATION.md).

Each test runs a built-in scenario end to end (a few seconds each) and checks
the behaviour the paper reports, not a number copied from it.
"""

from __future__ import annotations

import numpy as np
import pytest

from basin.experiments.runner import run_scenario
from basin.experiments.scenario import load_scenario
from basin.metrics import cache_cliff_points
from basin.metrics.state import RunState

pytestmark = pytest.mark.scenario


def _run(name: str, *overrides: str):
    return run_scenario(load_scenario(name, list(overrides)))


@pytest.fixture(scope="module")
def trap_runs():
    return {f: _run("trap-1p1d", f"surge.factor={f}") for f in (1.0, 1.33, 2.0)}


def test_no_surge_is_healthy_with_high_reuse_and_fast_first_tokens(trap_runs):
    s = trap_runs[1.0].summary
    assert s.state is RunState.HEALTHY
    assert s.hit_rate_pre >= 0.80 and s.hit_rate_final >= 0.80
    assert s.ttft_p50_final_s < 1.0
    assert s.completed_fraction > 0.9


def test_small_surge_recovers(trap_runs):
    s = trap_runs[1.33].summary
    assert s.state in (RunState.HEALTHY, RunState.RECOVERING)
    assert s.ttft_p50_final_s < 1.0


def test_doubling_surge_traps_the_engine(trap_runs):
    run = trap_runs[2.0]
    s = run.summary
    healthy = trap_runs[1.0].summary
    assert s.state is RunState.TRAPPED
    assert s.hit_rate_final < 0.35 < s.hit_rate_pre
    # TTFT rises by orders of magnitude.
    assert s.ttft_p50_final_s > 100 * healthy.ttft_p50_final_s
    # Active sessions keep growing at the base rate after the surge ended.
    active = run.result.timeseries["active_sessions"]
    assert active[-1] > active[40] > active[14]
    assert s.goodput_per_h < 0.5 * healthy.goodput_per_h


def test_the_cache_cliff_shows_in_hit_rate_against_working_set(trap_runs):
    ratios, hits = [], []
    for run in trap_runs.values():
        pts = cache_cliff_points(run.result.timeseries)
        ratios.append(pts.working_set_ratio)
        hits.append(pts.hit_rate)
    x = np.concatenate(ratios)
    h = np.concatenate(hits)
    plateau = h[x < 1.3]
    collapsed = h[x > 2.5]
    assert len(plateau) > 20 and len(collapsed) > 10
    assert np.median(plateau) > 0.8
    assert np.median(collapsed) < 0.3


def test_hicache_is_trapped_after_a_x5_surge_on_1p3d():
    run = _run("surge-1p3d")
    s = run.summary
    assert s.state is RunState.TRAPPED
    assert s.hit_rate_pre > 0.85 and s.hit_rate_final < 0.35


def test_residual_burst_sessions_sustain_the_failure():
    """Section 3.3: a burst of short sessions; ending them at minute 25
    restores service, leaving them keeps the engine degraded."""
    left = _run("burst-1p1d")
    ended = _run("burst-1p1d", "interventions=[{at_min: 25, terminate_tag: burst}]")
    assert left.summary.state is RunState.TRAPPED
    assert ended.summary.state is RunState.HEALTHY
    ts_left, ts_ended = left.result.timeseries, ended.result.timeseries
    # Service is restored within minutes of the termination ...
    assert np.nanmedian(ts_ended["ttft_p50_s"][30:40]) < 5.0
    # ... while the untouched run accumulates base sessions.
    assert ts_left["active_base"][-1] > 2 * ts_ended["active_base"][-1]
