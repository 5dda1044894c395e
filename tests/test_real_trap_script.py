"""scripts/real_trap.py: the run kinds, the CPU record and the real-against-simulated table.

The real runs themselves take half an hour each on a real vLLM and are not
part of the test suite; these pin what the driver decides and records.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from basin.experiments.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_trap", ROOT / "scripts" / "real_trap.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_four_runs_are_the_papers(script):
    scenario = {"surge": {"start_min": 3.75, "end_min": 6.25, "factor": 2.0}}
    kinds = script.run_kinds(scenario, 22.4)
    assert list(kinds) == ["no-surge", "surge", "removal", "basin"]
    assert kinds["no-surge"].sets == ("surge.factor=1.0",)
    assert kinds["surge"].sets == () and kinds["surge"].policy == "hicache"
    assert kinds["basin"].policy == "basin"
    # Burst removal ends the surge's sessions when the surge ends, as a scenario intervention.
    removal = load_scenario("trap-1p1d", list(kinds["removal"].sets))
    assert [(iv.at_min, iv.terminate_tag) for iv in removal.interventions] == [(6.25, "burst")]
    # The gateway predicts peaks by growth; the simulated BASIN gets the same predictor.
    assert kinds["basin"].params == ("predictor=growth:22.4",) and kinds["basin"].sets == ()


def test_basins_growth_factor_is_read_from_the_scenarios_sessions(script):
    import json as _json

    shown = subprocess.run([sys.executable, "-m", "basin", "scenario", "show", "real-trap-vllm", "--json"],
                           capture_output=True, text=True, cwd=ROOT, check=True)
    growth = script.peak_growth(_json.loads(shown.stdout))
    # Terminal-Bench sessions reach about 22 times their first prompt (the median); scaling keeps the ratio.
    assert 15 < growth < 30


def test_the_cpu_record_tells_a_busy_process_from_an_idle_one(script, tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 4\nwhile time.time() < end: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    time.sleep(0.5)  # both started: their start-up is in the first reading, not in a share
    sampler = script.CpuSampler({"busy": (busy.pid, False), "idle": (idle.pid, False)}, tmp_path / "cpu.csv",
                                interval_s=0.5)
    sampler.start()
    busy.wait()
    idle.wait()
    sampler.stop()
    summary = script.cpu_summary(tmp_path / "cpu.csv")
    # A busy loop gets at least a share of a core even on a loaded machine; a sleeper gets none.
    assert summary["busy_cores_mean"] > 0.2
    assert summary["idle_cores_p95"] < 0.02


def _fake_run(folder: Path, real: dict, sim: dict, cpu: dict) -> None:
    for side, summary in (("real", real), ("sim", sim)):
        (folder / side / "hicache").mkdir(parents=True)
        (folder / side / "hicache" / "summary.json").write_text(json.dumps(summary))
    (folder / "run.json").write_text(json.dumps({"cpu": cpu}))


def test_the_table_sets_each_real_run_beside_its_simulation(script, tmp_path):
    _fake_run(tmp_path / "surge" / "seed0", {"state": "trapped", "goodput_per_h": 40.0},
              {"state": "trapped", "goodput_per_h": 44.0}, {"engine_cores_mean": 0.98})
    _fake_run(tmp_path / "surge" / "seed1", {"state": "healthy", "goodput_per_h": 0.0},
              {"state": "trapped", "goodput_per_h": 10.0}, {})
    rows = script.table_rows(tmp_path, ["no-surge", "surge"], [0, 1, 2])
    assert [(r["run"], r["seed"]) for r in rows] == [("surge", 0), ("surge", 1)]
    assert rows[0]["goodput_gap"] == pytest.approx(0.10)
    assert rows[0]["real_state"] == rows[0]["sim_state"] == "trapped"
    assert rows[0]["engine_cores_mean"] == 0.98
    assert rows[1]["goodput_gap"] is None  # no real goodput to compare against
    script.write_report(tmp_path, rows)
    table = (tmp_path / "table.md").read_text()
    assert "| surge | 0 | trapped | trapped | 40 | 44 | 0.1 |" in table


def test_the_basin_run_refuses_to_start_without_its_cliff_profile(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "real_trap.py"), "--runs", "basin",
                           "--out", str(tmp_path), "--basin-profile", str(tmp_path / "missing.yaml")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0
    assert "missing.yaml" in done.stderr and "basin profile --scenario real-trap-vllm" in done.stderr


def test_the_simulated_basin_runs_the_gateways_profile_and_parameters(script, tmp_path):
    import argparse

    kinds = script.run_kinds({"surge": {"end_min": 6.25}}, 22.4)
    args = argparse.Namespace(set=["seed=1"], basin_profile=tmp_path / "p.yaml", basin_param=["reserve=0.2"])
    assert script.sim_sets(kinds["basin"], args) == [
        "seed=1", f"policy_params.profile={tmp_path / 'p.yaml'}", "policy_params.predictor=growth:22.4",
        "policy_params.reserve=0.2"]
    assert script.sim_sets(kinds["surge"], args) == ["seed=1"]
    # By default both sides read the scenario's own profile.
    assert script.scenario_profile_path("real-trap-vllm") == ROOT / "profiles/basin/scenarios/real-trap-vllm.yaml"


def test_resim_runs_only_the_simulation_side_of_finished_runs(script, tmp_path, monkeypatch):
    _fake_run(tmp_path / "surge" / "seed0", {"state": "trapped", "goodput_per_h": 40.0},
              {"state": "healthy", "goodput_per_h": 300.0}, {})
    simulated: list[tuple[str, int]] = []

    def fake_sim(kind, seed, args, folder):
        assert not (folder / "sim").exists()  # the old simulation is gone first
        simulated.append((kind.name, seed))
        (folder / "sim" / "hicache").mkdir(parents=True)
        (folder / "sim" / "hicache" / "summary.json").write_text(json.dumps({"state": "trapped",
                                                                           "goodput_per_h": 44.0}))

    def no_real_run(*args):
        raise AssertionError("--resim never starts a real run")

    monkeypatch.setattr(script, "sim_run", fake_sim)
    monkeypatch.setattr(script, "real_run", no_real_run)
    monkeypatch.setattr(script, "_manifest", lambda: {"serve": {"block_size_tokens": 128}})
    monkeypatch.setattr(script, "_pool_tokens", lambda deployment: 98_304)
    assert script.main(["--runs", "surge", "--seeds", "0", "1", "--out", str(tmp_path), "--resim"]) == 0
    assert simulated == [("surge", 0)]  # seed 1 has no real run: nothing to simulate beside
    assert "| surge | 0 | trapped | trapped | 40 | 44 | 0.1 |" in (tmp_path / "table.md").read_text()
    assert json.loads((tmp_path / "surge" / "seed0" / "run.json").read_text()) == {"cpu": {}}
