"""The run plan (basin.experiments.plan): resolved once, hashable, its store
key unchanged from the sweep store's first layout (every shipped sweep's keys
as main computed them before the plan existed), a store written by main
resumed, and one executor under every study."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import basin
import basin.experiments.plan as plan_mod
from basin.errors import BasinInputError
from basin.experiments.plan import RunPlan, resolve_plan
from basin.experiments.runner import check_runnable, execute_plan, run_plan, run_scenario
from basin.experiments.scenario import load_scenario
from basin.experiments.store import RunStore
from basin.experiments.sweep import run_sweep
from basin.experiments.sweep_grid import load_sweep

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHORT = ["duration_min=10", "measure_end_min=8", "surge.start_min=2", "surge.end_min=5"]


@pytest.fixture
def fixed_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The code digest and version a key holds, fixed as the fixtures were
    written with them (they change with every result-deciding source, by
    design; what must not change is everything else a key is made of)."""
    monkeypatch.setattr(plan_mod, "code_digest", lambda: "CODE")
    monkeypatch.setattr(basin, "__version__", "VERSION")


# ------------------------------------------------------------ identity
def test_a_plan_is_resolved_once_and_hashable() -> None:
    sc = load_scenario("trap-1p1d", SHORT)
    plan = resolve_plan(sc, "basin")
    assert plan.system == plan.label == "basin" and plan.seed == sc.seed
    assert plan.deployment.name == "1p1d-h100" and plan.schedule is not None
    assert plan.base_rate_per_min == pytest.approx(plan.schedule.base_per_min)  # type: ignore[attr-defined]
    same = resolve_plan(load_scenario("trap-1p1d", SHORT), "basin")
    assert plan == same and hash(plan) == hash(same) and len({plan, same}) == 1
    # Where its tables go and what the worker measures are outputs, not the run.
    assert dataclasses.replace(plan, tables="/elsewhere", keep_tables=True) == plan
    assert resolve_plan(sc, "hicache") != plan
    assert resolve_plan(sc, "basin", {"shedding": False}) != plan
    assert resolve_plan(load_scenario("trap-1p1d", [*SHORT, "seed=1"]), "basin") != plan
    assert pickle.loads(pickle.dumps(plan)) == plan  # it crosses to pool and Ray workers


def test_a_switch_on_plan_starts_under_hicache_and_reports_the_system() -> None:
    sc = load_scenario("fig21-switch-on")
    plan = resolve_plan(sc, "continuum", switch_on_min=45.0)
    assert (plan.system, plan.label, plan.switch_on_min) == ("hicache", "continuum", 45.0)
    assert [(iv.at_min, iv.switch_policy) for iv in plan.scenario.interventions] == [(45.0, "continuum")]
    assert plan != resolve_plan(sc, "continuum")


def test_bad_input_is_refused_when_the_plan_is_made() -> None:
    with pytest.raises(BasinInputError, match="policy_params.nope"):
        resolve_plan(load_scenario("trap-1p1d", ["policy_params.nope=1"]), "basin")
    with pytest.raises(BasinInputError, match="unknown deployment"):
        resolve_plan(load_scenario("trap-1p1d", ["deployment=no-such"]), "basin")
    with pytest.raises(BasinInputError, match="unknown system .nope."):
        resolve_plan(load_scenario("trap-1p1d", ['interventions=[{"at_min": 5, "switch_policy": "nope"}]']))


def test_check_runnable_and_the_run_derive_from_the_same_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each derivation happens in resolve_plan: counting the deployment loads shows no second path.
    loads: list[str] = []
    real = plan_mod.deployment_for

    def counting(scenario):  # type: ignore[no-untyped-def]
        loads.append(scenario.deployment)
        return real(scenario)

    monkeypatch.setattr(plan_mod, "deployment_for", counting)
    sc = load_scenario("trap-1p1d", SHORT)
    check_runnable(sc, ["hicache", "basin"])
    assert len(loads) == 1  # one plan, shared by both systems' checks
    plan = resolve_plan(sc, "hicache")
    assert len(loads) == 2
    run = run_plan(plan)
    assert len(loads) == 2  # the run derives nothing again
    assert run.summary.to_dict() == run_scenario(sc, "hicache").summary.to_dict()


def test_execute_plan_writes_tables_and_measures_in_the_worker(tmp_path: Path) -> None:
    from basin.metrics.io import read_run

    plan = resolve_plan(load_scenario("trap-1p1d", SHORT), "basin", tables=str(tmp_path / "run"),
                        measure=_n_calls)
    result = execute_plan(plan)
    assert result.tables is None and result.label == "basin" and result.seed == plan.seed
    calls, _, ts = read_run(tmp_path / "run")
    assert result.measured == len(calls["session_uid"]) > 0
    assert "policy_lending" in ts  # the policy's action columns
    kept = execute_plan(dataclasses.replace(plan, tables=None, keep_tables=True))
    assert kept.tables is not None and kept.summary.to_dict() == result.summary.to_dict()


def _n_calls(run) -> int:  # type: ignore[no-untyped-def]
    return len(run.result.calls["session_uid"])


# ------------------------------------------------------------ the store key
def test_every_shipped_sweep_keeps_its_store_keys(fixed_code: None) -> None:
    """tests/fixtures/sweep_keys_main.json: the key of every point of every
    shipped sweep as main computed it before the run plan (code digest and
    version fixed); a key that moved would make every stored run new."""
    expected = json.loads((FIXTURES / "sweep_keys_main.json").read_text(encoding="utf-8"))
    assert len(expected) == len(list((ROOT / "sweeps").glob("*.yaml")))
    for name, keys in expected.items():
        assert [p.key for p in load_sweep(ROOT / "sweeps" / name).points] == keys, name


def test_a_store_written_by_main_resumes(fixed_code: None, tmp_path: Path) -> None:
    """tests/fixtures/sweep-resume-store: the store main wrote for
    sweep-resume.yaml (its summaries and configs; the tables were left out to
    keep the fixture small, and the store reads only summaries for its table)."""
    store_dir = tmp_path / "out" / "runs"
    shutil.copytree(FIXTURES / "sweep-resume-store" / "runs", store_dir)
    sweep = load_sweep(FIXTURES / "sweep-resume.yaml")
    assert sorted(p.key for p in sweep.points) == RunStore(store_dir).keys()
    for p in sweep.points:
        stored = json.loads((store_dir / p.key / "config.json").read_text(encoding="utf-8"))
        assert stored == json.loads(json.dumps(p.plan.config))
    outcome = run_sweep(sweep, tmp_path / "out", workers=1, plots=False)
    assert (outcome.runs_computed, outcome.runs_reused) == (0, 4)
    main_rows = pq.read_table(FIXTURES / "sweep-resume-store" / "sweep-main.parquet").to_pylist()
    assert pq.read_table(outcome.table).to_pylist() == main_rows


def test_a_plan_is_a_sweep_point_and_the_same_run(fixed_code: None, tmp_path: Path) -> None:
    sweep = load_sweep(FIXTURES / "sweep-resume.yaml")
    point = sweep.points[0]
    plan = resolve_plan(load_scenario("trap-1p1d", [*SHORT, f"seed={point.plan.seed}"]), point.plan.system)
    assert isinstance(point.plan, RunPlan) and plan.key == point.key


# ------------------------------------------------------------ the layout
def test_basin_experiments_has_no_import_circle() -> None:
    """Every import counted, lazy ones included; main had sweep <-> sweep_plots."""
    from tests.sim.test_imports import circles, import_graph

    graph = import_graph(ROOT / "src" / "basin" / "experiments", "basin.experiments")
    assert {"plan", "runner", "sweep", "sweep_grid", "sweep_spec", "sweep_plots", "tune"} <= set(graph)
    assert circles(graph) == []
    # Plots read a checked sweep and its rows; they import neither the grid nor the running.
    assert graph["sweep_plots"] & {"sweep", "sweep_grid", "sweep_table", "runner"} == set()


def test_the_code_digests_cover_every_module_a_run_is_derived_in() -> None:
    """A run is derived in the runner, the plan and what they import inside
    basin.experiments; the sweep store's key and classify's run cache hash
    those sources, so a change there recomputes (the executor and the store
    only move results)."""
    from tests.sim.test_imports import import_graph

    from basin.experiments import classify, store

    graph = import_graph(ROOT / "src" / "basin" / "experiments", "basin.experiments")
    seen, todo = set(), ["runner"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    deciding = {f"experiments/{m}.py" for m in seen - {"executors", "pool", "store"}}
    assert deciding == {"experiments/plan.py", "experiments/runner.py", "experiments/scenario.py"}
    assert deciding <= set(store._RESULT_MODULES) and deciding <= set(classify._RUN_SOURCES)
