"""``basin model``: analyze (flags and scenario), plot, errors; and the
trap-1p1d acceptance: the band holds 3.3/min, +33% recovers, +100% traps."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from basin.cli.app import app
from basin.model.params import WorkloadInput, derive_params, load_workload, resolve_deployment

runner = CliRunner()


def _json(args: list[str]) -> dict:
    res = runner.invoke(app, ["model", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def trap() -> dict[str, dict]:
    return {f: _json(["analyze", "--scenario", "trap-1p1d", "--set", f"surge.factor={f}"])
            for f in ("1.33", "2.0", "2.2")}


def test_trap_1p1d_band_holds_the_base_rate(trap) -> None:
    d = trap["2.0"]
    lo, hi = d["vulnerable_band_per_min"]
    assert lo < 3.3 < hi
    assert d["vulnerable"] is True
    assert d["n_stable"] < d["n_star"] < d["n_unstable"]
    assert d["first_limit"] == "cache" and d["resource_condition"]["cache_first"] is True


def test_trap_1p1d_surges_recover_and_trap_as_the_simulator_does(trap) -> None:
    """The simulator recovers from +33% and traps at +100% in 4 of 5 seeds
    (docs/calibration.md); the fluid model puts its boundary just above +100%
    (+100% recovers, +120% traps), a little less pessimistic."""
    assert trap["1.33"]["ode"]["no_admission"]["outcome"] == "recovers"
    assert trap["2.2"]["ode"]["no_admission"]["outcome"] == "trapped"
    # Admission at the default budget keeps the surge out of the trap.
    assert trap["2.2"]["ode"]["admission"]["outcome"] == "recovers"
    assert trap["2.0"]["drain_time_min"] > 0


def test_analyze_json_keys_from_flags() -> None:
    d = _json(["analyze", "-d", "1p3d-h200", "--rate", "9", "--sessions", "200"])
    for key in ("n_star", "d_star_per_min", "d_low_per_min", "n_stable", "n_unstable", "vulnerable_band_per_min",
                "first_limit", "parameters", "resource_condition", "classification"):
        assert key in d
    assert d["first_limit"] in ("cache", "decode")
    params = d["parameters"]
    assert params["cache_tokens"]["value"] == pytest.approx(2 * 2_180_000)  # host tier 2x by the profile
    assert all(p["origin"] for p in params.values())
    assert d["ode"] == {}


def test_analyze_table_prints_origins() -> None:
    res = runner.invoke(app, ["model", "analyze", "-d", "1p1d-h100", "--rate", "3.3", "--sessions", "200",
                              "--surge-factor", "2"])
    assert res.exit_code == 0, res.output
    assert "tokens_cost_s" in res.stdout and "vulnerable band" in res.stdout and "ODE no admission" in res.stdout


def test_plot_writes_pngs(tmp_path) -> None:
    out, traj = tmp_path / "d.png", tmp_path / "t.png"
    res = runner.invoke(app, ["model", "plot", "--scenario", "trap-1p1d", "--out", str(out),
                              "--trajectories", str(traj), "--set", "workload.sessions=300"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and traj.stat().st_size > 1000


@pytest.mark.parametrize("args, message", [
    (["analyze"], "give --deployment"),
    (["analyze", "--scenario", "trap-1p1d", "-d", "1p1d-h100"], "--set deployment"),
    (["analyze", "-d", "1p1d-h100", "--surge-factor", "2"], "give --rate"),
    (["analyze", "-d", "nope-h100"], "unknown deployment"),
    (["analyze", "-d", "1p1d-h100", "--curve", "wiggly"], "unknown hit curve"),
    (["analyze", "-d", "1p1d-h100", "--host-ratio", "-1"], "host_ratio"),
    (["classify", "--seeds", "a,b"], "--seeds"),
])
def test_bad_input_is_a_clear_error(args, message) -> None:
    res = runner.invoke(app, ["model", *args])
    assert res.exit_code != 0
    assert message in str(res.exception) + res.output


def test_parameters_come_from_profile_and_workload() -> None:
    dep, hw = resolve_deployment("1p2d-h100", host_ratio=10)
    wl = load_workload(WorkloadInput(sessions=150, tool_time=3.0))
    p = derive_params(dep, hw, wl, 1.9, "paper")
    assert p.cache_tokens == 10 * hw.prefill.prefix_cache_tokens
    assert p.decode_kv_tokens == 2 * hw.decode.kv_tokens and p.decode_instances == 2
    calls = [c for s in wl.sessions for c in s.calls]
    assert p.calls_per_session == pytest.approx(len(calls) / 150)
    assert p.tool_gap_s == pytest.approx(sum(c.tool_gap_s for c in calls) / len(calls))
    assert p.prompt_tokens == pytest.approx(sum(c.prompt_tokens for c in calls) / len(calls))
    # The saturated prefill rate is the profile's, near the paper's 31K tokens/s on H100.
    assert 24_000 < p.prefill_tokens_per_s < 32_000
    assert p.decode_step_base_s == hw.decode.step_s(0, 0)
    assert 0 < p.fraction_in_service < 1 and p.progress_stages >= 1
    assert {q.key for q in p.provenance} >= {"calls_per_session", "tool_gap_s", "unloaded_call_s", "prompt_tokens",
                                             "new_tokens", "mean_context_tokens", "cache_tokens",
                                             "prefill_tokens_per_s", "decode_kv_tokens", "fraction_in_service"}


def test_the_model_does_not_import_the_simulator() -> None:
    import subprocess
    import sys

    # Every module of the model, the predictors and the catalogue imported:
    # none of them pulls in the simulator, the policies' runner or the experiments.
    code = ("import sys, pkgutil, importlib, basin.model, basin.predict, basin.catalog; "
            "[importlib.import_module(m.name) for pkg in (basin.model, basin.predict, basin.catalog) "
            "for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.')]; "
            "bad = [m for m in sys.modules if m.startswith(('basin.sim', 'basin.experiments', 'basin.systems'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# The import rules between parts (lazy imports included) are tests/test_layering.py's.


def test_analyze_names_the_engine_scheduling_policy_it_assumes() -> None:
    """The model has no LPM: it reports the policy and, for lpm, says its
    answers are first-come's."""
    assert _json(["analyze", "--scenario", "trap-1p1d"])["schedule_policy"] == "fcfs"
    d = _json(["analyze", "--scenario", "trap-1p1d", "--set", "engine.schedule_policy=lpm"])
    assert d["schedule_policy"] == "lpm"
    assert any("assumes the prefill queue is served first-come" in line for line in d["simulator_differs"])
    res = runner.invoke(app, ["model", "analyze", "--scenario", "trap-1p1d"])
    assert res.exit_code == 0 and "engine scheduling fcfs" in " ".join(res.stdout.split())
