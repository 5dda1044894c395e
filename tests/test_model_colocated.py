"""The fluid model of a colocated deployment: shared compute, one pool for
running requests and cache (basin.model.throughput)."""

from __future__ import annotations

import numpy as np
import pytest

from basin.catalog import load_deployment
from basin.model.analysis import analyze
from basin.model.equilibria import departure_peak
from basin.model.hitcurve import PaperHitCurve
from basin.model.params import derive_params
from basin.model.throughput import FluidModel
from basin.workload.presets import resolve_workload


def _model(deployment: str) -> FluidModel:
    from basin.catalog import load_hardware

    dep = load_deployment(deployment)
    curve = PaperHitCurve()
    params = derive_params(dep, load_hardware(dep.hardware), resolve_workload("terminal-bench", seed=0),
                           curve.knee_ratio, curve.label)
    return FluidModel(params, curve)


def test_a_colocated_server_shares_its_compute_and_its_pool():
    colo, pd = _model("1C-h100-nvl"), _model("1P1D-h100-nvl")
    assert colo.params.colocated and not pd.params.colocated
    n = np.linspace(1, 120, 60)
    # Shared compute: slower than either resource alone would be.
    compute = colo.compute_bound(n)
    assert np.all(compute < colo.prefill_bound(n)) and np.all(compute < colo.decode_bound())
    assert compute == pytest.approx(1 / (1 / colo.prefill_bound(n) + 1 / colo.decode_bound()))
    # One pool: running requests take cache, so the same population sits further up the cliff.
    assert np.all(colo.working_set_ratio(n) > n * colo.params.mean_context_tokens / colo.params.cache_tokens)
    running = colo.running_requests(n)
    assert np.all(np.diff(running) >= 0) and running[-1] <= colo.params.max_batch_per_instance
    # Less departs at best, and the tipping population comes sooner.
    assert departure_peak(colo).d_star_per_min < departure_peak(pd).d_star_per_min
    a_colo, a_pd = analyze(colo, 3.3), analyze(pd, 3.3)
    assert a_colo.n_unstable is not None and a_pd.n_unstable is not None
    assert a_colo.n_unstable < a_pd.n_unstable


def test_a_pd_deployment_is_untouched_by_the_colocated_terms():
    pd = _model("1P1D-h100-nvl")
    n = np.linspace(1, 120, 60)
    assert pd.working_set_ratio(n) == pytest.approx(n * pd.params.mean_context_tokens / pd.params.cache_tokens)
