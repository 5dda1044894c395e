"""BASIN's cliff profiler: the kappa fit, the lower quartile, profile files
(the catalogue's format), input errors, the ramp's reproduction of a shipped
profile, and one small real ramp through the ``basin profile`` command."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from basin.catalog import cliff_profiles as prof_mod
from basin.catalog.cliff_profiles import (
    CliffProfile,
    RampRun,
    RampSettings,
    default_profile_path,
    load_profile,
    override_deployment,
    profile_from_dict,
    save_profile,
)
from basin.errors import BasinInputError
from basin.experiments import ramp as ramp_mod
from basin.experiments.ramp import LoadRamp, default_ramp, profile_deployment, profile_scenario
from basin.predict.cliff import X_KNEE, fit_kappa, lower_quartile, reference_hit, reference_shape
from cli_helpers import run_basin as _run


def _ramp_like_points(kappa: float, rng: np.random.Generator, noise: float = 0.03,
                      n: int = 80) -> tuple[np.ndarray, np.ndarray]:
    """Windows of a ramp: many on the plateau, a few through the fall, a tail on the floor."""
    knee = kappa * X_KNEE
    x = np.concatenate([rng.uniform(0.2, 0.9 * knee, n // 2), rng.uniform(0.85 * knee, 1.2 * knee, n // 8),
                        rng.uniform(1.2 * knee, 3.0 * knee, n - n // 2 - n // 8)])
    hit = np.clip(reference_hit(x, kappa, 0.95, 0.08) + rng.normal(0.0, noise, x.size), 0.0, 1.0)
    return x, hit


# ---------------------------------------------------------------------------
# the reference curve and the fit


def test_reference_curve_has_plateau_knee_and_floor() -> None:
    assert reference_shape(0.0) == pytest.approx(1.0)
    assert reference_shape(0.9) == pytest.approx(1.0, abs=1e-4)  # flat up to the cache
    assert reference_shape(X_KNEE) == pytest.approx(0.4)  # the sag (0.2) times half the fall
    assert reference_shape(3 * X_KNEE) < 1e-6
    x = np.linspace(0.0, 10.0, 500)
    assert np.all(np.diff(reference_shape(x)) <= 1e-12)  # never rises
    assert reference_hit(2.0 * X_KNEE, 2.0, 0.9, 0.1) == pytest.approx(reference_hit(X_KNEE, 1.0, 0.9, 0.1))


@pytest.mark.parametrize("kappa", [0.55, 0.81, 1.0, 1.38, 2.5])
def test_fit_recovers_a_known_kappa_from_noisy_points(kappa: float) -> None:
    rng = np.random.default_rng(int(kappa * 100))
    x, hit = _ramp_like_points(kappa, rng)
    fit = fit_kappa(x, hit)
    assert fit.kappa == pytest.approx(kappa, rel=0.03)
    assert fit.plateau == pytest.approx(0.95, abs=0.03)
    assert fit.floor == pytest.approx(0.08, abs=0.03)
    assert fit.rmse == pytest.approx(0.03, abs=0.01)
    assert fit.cliff_ratio == pytest.approx(fit.kappa * X_KNEE)
    assert fit.n_plateau_side + fit.n_floor_side == x.size


def test_fit_keeps_plateau_and_floor_inside_zero_one() -> None:
    # Hit rates pinned at 1 then 0: the unconstrained optimum would overshoot.
    x = np.array([0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 2.4, 3.0, 4.0, 5.0])
    hit = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    fit = fit_kappa(x, hit)
    assert 0.0 <= fit.floor <= fit.plateau <= 1.0
    assert 1.2 < fit.cliff_ratio < 2.4


def test_fit_refuses_ramps_without_a_cliff() -> None:
    rng = np.random.default_rng(3)
    flat_x = rng.uniform(0.1, 1.2, 40)
    with pytest.raises(BasinInputError, match="no cliff.*--end-rate"):
        fit_kappa(flat_x, np.clip(0.93 + rng.normal(0, 0.02, 40), 0, 1))
    # Stops right at the fall: one window past the knee.
    x = np.concatenate([np.linspace(0.2, 1.8, 30), [2.4]])
    hit = reference_hit(x, 1.0, 0.95, 0.05)
    with pytest.raises(BasinInputError, match="ended at the cliff"):
        fit_kappa(x, hit)
    with pytest.raises(BasinInputError, match="usable windows"):
        fit_kappa([0.5, 3.0], [0.9, 0.1])
    with pytest.raises(BasinInputError, match="one of each"):
        fit_kappa([0.5, 1.0, 2.0], [0.9, 0.8])
    with pytest.raises(BasinInputError, match="between 0 and 1"):
        fit_kappa(np.linspace(0.1, 4, 10), np.full(10, 1.5))


def test_lower_quartile_of_repeats() -> None:
    assert lower_quartile([1.0, 2.0, 3.0]) == pytest.approx(1.5)  # halfway from the smallest to the median
    assert lower_quartile([3.0, 1.0, 2.0]) == pytest.approx(1.5)  # order does not matter
    assert lower_quartile([0.9, 1.1, 1.0, 1.2]) == pytest.approx(0.975)
    assert lower_quartile([0.8]) == pytest.approx(0.8)
    with pytest.raises(BasinInputError, match="one or more finite"):
        lower_quartile([])
    with pytest.raises(BasinInputError, match="one or more finite"):
        lower_quartile([1.0, float("nan")])


# ---------------------------------------------------------------------------
# profile files


def _handmade_profile() -> CliffProfile:
    ramp = RampSettings(start_per_min=2.0, end_per_min=8.0, steps=3, step_min=6, settle_min=2,
                        warm_sessions=12, workload_sessions=300)
    runs = tuple(
        RampRun(seed=s, kappa=k, plateau_hit=0.93, floor_hit=0.07, fit_rmse=0.04, lambda_c_per_min=lam,
                healthy_step_rate_per_min=4.0, step_rate_per_min=ramp.rates(),
                step_arrivals_per_min=(2.25, 4.0, 7.5), step_completions_per_min=(2.0, 3.75, 1.5),
                step_active_sessions=(14.5, 30.25, 120.0), step_hit_rate=(0.95, 0.9, 0.1),
                step_working_set_ratio=(0.4, 1.1, 3.2), points_x=(0.4, 0.5, 1.1, 3.2), points_hit=(0.95, 0.94, 0.9,
                                                                                                   0.1))
        for s, k, lam in ((0, 1.1, 4.5), (1, 0.9, 3.75), (2, 1.25, 4.25)))
    kappas = tuple(r.kappa for r in runs)
    return CliffProfile(
        deployment="1p1d-h100", router="cache-aware", workload="terminal-bench", kappa=lower_quartile(kappas),
        x_knee=X_KNEE, lambda_c_per_min=4.25, gpu_cache_tokens=1_090_000, host_cache_tokens=0, kappas=kappas,
        lambda_c_per_repeat=tuple(r.lambda_c_per_min for r in runs), healthy_step_rate_per_min=4.0,
        plateau_hit=0.93, floor_hit=0.07, hardware="h100-nvl", prefill_instances=1, decode_instances=1,
        host_ratio=0.0, seed=0, ramp=ramp, runs=runs)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_profile_file_round_trip(tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    original = _handmade_profile()
    path = save_profile(original, tmp_path / f"p{suffix}")
    loaded = load_profile(path)
    assert loaded == original
    assert loaded.kappa == pytest.approx(1.0)  # lower quartile of 0.9, 1.1, 1.25
    assert loaded.effective_cache_tokens == 1_090_000
    assert loaded.cliff_tokens == pytest.approx(1.0 * X_KNEE * 1_090_000)
    assert float(loaded.hit(0.3)) == pytest.approx(0.93, abs=1e-6)
    # By name, from the profile directory.
    monkeypatch.setattr(prof_mod, "BASIN_PROFILE_DIR", tmp_path)
    assert load_profile("p") == original
    assert profile_from_dict(original.to_dict()) == original


def test_default_profile_paths() -> None:
    base = prof_mod.BASIN_PROFILE_DIR
    assert default_profile_path("1p3d-h200") == base / "1p3d-h200.yaml"
    assert default_profile_path("1p3d-h200", host_ratio=0) == base / "1p3d-h200-gpu-only.yaml"
    assert default_profile_path("1p3d-h200", host_ratio=2) == base / "1p3d-h200.yaml"  # the deployment's own
    assert default_profile_path("1p1d-h100", router="affinity") == base / "1p1d-h100.yaml"  # one prefill: no router
    assert default_profile_path("2p6d-h200") == base / "2p6d-h200-cache-aware.yaml"
    assert default_profile_path("2p6d-h200", "least-loaded", "swe-pro") == base / "2p6d-h200-least-loaded-swe-pro.yaml"
    with pytest.raises(BasinInputError, match="basin profile 2p6d-h200 --router affinity --workload swe-pro"):
        prof_mod.profile_for("2p6d-h200", "affinity", "swe-pro")


def test_bad_profile_files_name_the_field(tmp_path: Path) -> None:
    data = _handmade_profile().to_dict()
    bad = dict(data, kappa=-1.0)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(BasinInputError, match="field 'kappa'.*positive"):
        load_profile(path)
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "lambda_c_per_min"}))
    with pytest.raises(BasinInputError, match="field 'lambda_c_per_min'"):
        load_profile(path)
    path.write_text(json.dumps(dict(data, kind="scenario")))
    with pytest.raises(BasinInputError, match="not a BASIN cliff profile"):
        load_profile(path)
    path.write_text(json.dumps(dict(data, ramp=dict(data["ramp"], steps=1))))
    with pytest.raises(BasinInputError, match="field 'ramp'.*steps"):
        load_profile(path)
    with pytest.raises(BasinInputError, match="profile file not found"):
        load_profile(tmp_path / "missing.yaml")
    with pytest.raises(BasinInputError, match="unknown profile 'no-such'"):
        load_profile("no-such")
    text = save_profile(_handmade_profile(), tmp_path / "ok.yaml").read_text()
    (tmp_path / "old.yaml").write_text(text.replace("healthy_step_rate_per_min", "critical_rate_per_min"))
    with pytest.raises(BasinInputError, match="'critical_rate_per_min' is now called 'healthy_step_rate_per_min'"):
        load_profile(tmp_path / "old.yaml")
    path.write_text(json.dumps(dict(data, router="round-robin")))
    with pytest.raises(BasinInputError, match="field 'router'.*round-robin"):
        load_profile(path)
    runs = [dict(data["runs"][0], seed=-1)] + data["runs"][1:]
    path.write_text(json.dumps(dict(data, runs=runs)))
    with pytest.raises(BasinInputError, match=r"field 'runs\.0\.seed'"):
        load_profile(path)


def test_the_format_uses_the_one_effective_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []

    def spy(gpu: int, host: int, lent: int = 0) -> int:
        seen.append((gpu, host))
        return max(gpu + lent, host)

    monkeypatch.setattr(prof_mod, "effective_cache_tokens", spy)
    p = dataclasses.replace(_handmade_profile(), gpu_cache_tokens=1000, host_cache_tokens=5000)
    assert p.effective_cache_tokens == 5000 and seen == [(1000, 5000)]


# ---------------------------------------------------------------------------
# bad input


def test_bad_profiling_input_names_the_field_and_fix() -> None:
    with pytest.raises(BasinInputError, match=r"repeats \(--repeats\)"):
        profile_deployment("1p1d-h100", repeats=0)
    with pytest.raises(BasinInputError, match="router 'round-robin': use one of cache-aware"):
        profile_deployment("2p6d-h200", router="round-robin")
    with pytest.raises(BasinInputError, match=r"host_ratio \(--host-ratio\).*GPU-only"):
        profile_deployment("1p3d-h200", host_ratio=-1.0)
    with pytest.raises(BasinInputError, match="unknown deployment"):
        profile_deployment("9x9-nothing")
    with pytest.raises(BasinInputError, match=r"end_per_min \(--end-rate\).*must rise"):
        RampSettings(start_per_min=5.0, end_per_min=4.0)
    with pytest.raises(BasinInputError, match="settle_min"):
        RampSettings(start_per_min=1.0, end_per_min=4.0, step_min=4, settle_min=3)
    with pytest.raises(BasinInputError, match="unknown setting 'rate'"):
        default_ramp("1p1d-h100", rate=3.0)


def test_cli_rejects_bad_options_cleanly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "profile", "2p6d-h200", "--router", "random")
    assert code == 2 and "router 'random'" in err
    code, _, err = _run(capsys, "profile", "1p1d-h100", "--out", str(tmp_path / "p.txt"))
    assert code == 2 and ".yaml, .yml or .json" in err
    code, _, err = _run(capsys, "profile", "1p1d-h100", "--start-rate", "0")
    assert code == 2 and "--start-rate" in err


def test_profile_by_scenario_refuses_the_flags_the_scenario_sets(capsys: pytest.CaptureFixture[str]) -> None:
    for extra, flag, key in ((["1p1d-h100"], "DEPLOYMENT", "deployment"),
                             (["--workload", "swe-bench"], "--workload", "workload.name"),
                             (["--router", "affinity"], "--router", "router"),
                             (["--host-ratio", "0"], "--host-ratio", "host_ratio")):
        code, _, err = _run(capsys, "profile", "--scenario", "real-trap-vllm", *extra)
        assert code == 2 and f"{flag} does not apply beside --scenario" in err and f"--set {key}=" in err, err
    code, _, err = _run(capsys, "profile", "--set", "seed=3", "1p1d-h100")
    assert code == 2 and "give --scenario NAME with it" in err
    code, _, err = _run(capsys, "profile")
    assert code == 2 and "give a deployment" in err and "--scenario" in err
    code, _, err = _run(capsys, "profile", "--scenario", "no-such-scenario")
    assert code == 2 and "no-such-scenario" in err


def test_a_scenarios_workload_section_reaches_the_ramp() -> None:
    from basin.experiments.scenario import WorkloadSpec, load_scenario

    sc = load_scenario("real-trap-vllm")
    dep = override_deployment(sc.deployment, None, sc.host_ratio)
    ramp = default_ramp(dep, sc.workload, seed=0, steps=2, step_min=5, settle_min=1)
    run = profile_scenario(sc.deployment, dep, sc.workload, ramp, seed=0)
    assert run.workload == sc.workload  # prompt, output and tool gaps scaled as the scenario scales them
    plain = default_ramp(dep, "terminal-bench", seed=0, steps=2, step_min=5, settle_min=1)
    # Shorter, smaller sessions hold less context: the knee rate, and so the ramp, moves up.
    assert ramp.start_per_min > plain.start_per_min
    assert ramp_mod.workload_label(sc.workload) == "terminal-bench, tools x0.25, output x0.1, prompt x0.12"
    assert ramp_mod.workload_label("swe-bench") == "swe-bench"
    synth = ramp_mod.workload_spec(WorkloadSpec(name="swe-pro", prompt=0.5), 300)
    assert synth["sessions"] == 300 and synth["prompt"] == 0.5
    assert ramp_mod.workload_spec(WorkloadSpec(name="swe-pro", sessions=40), 300)["sessions"] == 40


def test_small_ramp_of_a_scenario_profiles_its_deployment(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    out = tmp_path / "scenario.yaml"
    code, stdout, err = _run(capsys, "profile", "--scenario", "real-trap-vllm", "--repeats", "1", "--workers", "1",
                             "--start-rate", "4", "--end-rate", "20", "--steps", "4", "--step-min", "10",
                             "--settle-min", "3", "--out", str(out), "--json")
    assert code == 0, err
    p = load_profile(out)
    assert p.deployment == "vllm-cpu" and p.host_ratio == 0.0
    assert p.workload == "terminal-bench, tools x0.25, output x0.1, prompt x0.12"
    assert p.gpu_cache_tokens == 97_280  # the calibrated pool, as measured
    assert json.loads(stdout)["path"] == str(out)


def test_a_scenarios_profile_goes_beside_the_shipped_ones_by_name() -> None:
    from basin.cli.profile import _target

    target = _target(None, "real-trap-vllm", [], "terminal-bench", None, None)
    assert target.default_path == prof_mod.BASIN_PROFILE_DIR / "scenarios" / "real-trap-vllm.yaml"
    assert target.deployment.endswith("profiles/calibrated/vllm-cpu.yaml")


# ---------------------------------------------------------------------------
# one small real ramp


def test_small_real_ramp_gives_a_sane_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "small.yaml"
    code, stdout, err = _run(capsys, "profile", "1p1d-h100", "--repeats", "2", "--workers", "2",
                             "--start-rate", "3", "--end-rate", "12", "--steps", "6", "--step-min", "8",
                             "--settle-min", "2", "--out", str(out), "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["path"] == str(out) and Path(summary["plot"]).stat().st_size > 10_000
    p = load_profile(out)
    assert (p.deployment, p.router, p.workload, p.host_ratio) == ("1p1d-h100", "cache-aware", "terminal-bench", 0.0)
    assert p.repeats == 2 and [r.seed for r in p.runs] == [0, 1]
    assert p.kappa == pytest.approx(lower_quartile(p.kappas), abs=1e-4)
    assert 0.6 < p.kappa < 2.0  # GPU-only H100: the cliff lies near twice the cache
    assert p.plateau_hit > 0.85 and p.floor_hit < 0.5
    assert 3.0 < p.lambda_c_per_min < 8.0
    assert p.lambda_c_per_min == pytest.approx(float(np.median(p.lambda_c_per_repeat)), abs=1e-4)
    assert p.gpu_cache_tokens == 1_090_000 and p.host_cache_tokens == 0
    assert p.ramp.rates()[0] == pytest.approx(3.0) and p.ramp.rates()[-1] == pytest.approx(12.0)
    assert summary["kappa"] == p.kappa and "runs" not in summary
    for run in p.runs:
        assert len(run.step_completions_per_min) == 6
        assert run.lambda_c_per_min == pytest.approx(max(run.step_completions_per_min))
        assert len(run.points_x) == len(run.points_hit) > 10


def test_shipped_scenario_profiles_match_their_scenarios() -> None:
    from basin.experiments.scenario import load_scenario

    for path in sorted((prof_mod.BASIN_PROFILE_DIR / "scenarios").glob("*.yaml")):
        p = load_profile(path)
        sc = load_scenario(path.stem)
        assert p.workload == ramp_mod.workload_label(sc.workload), path
        assert p.kappa == pytest.approx(lower_quartile(p.kappas), abs=1e-4), path


def test_shipped_profiles_load_and_are_consistent() -> None:
    shipped = sorted(prof_mod.BASIN_PROFILE_DIR.glob("*.yaml"))
    if not shipped:
        pytest.skip("no profiles shipped yet")
    for path in shipped:
        p = load_profile(path)
        assert path.stem == prof_mod.profile_name(p.deployment, p.router, p.workload, p.host_ratio), path
        assert p.kappa == pytest.approx(lower_quartile(p.kappas), abs=1e-4), path
        assert p.lambda_c_per_min > 0 and math.isfinite(p.cliff_tokens), path
        assert dataclasses.replace(p) == p


# ---------------------------------------------------------------------------
# the ramp as one scenario, reproducing the shipped profile


def test_a_profiling_ramp_is_a_load_ramp_scenario() -> None:
    shipped = load_profile("2p6d-h200-least-loaded")
    dep = override_deployment(shipped.deployment, shipped.router)
    sc = profile_scenario(shipped.deployment, dep, shipped.workload, shipped.ramp, seed=4)
    rates = shipped.ramp.rates()
    assert sc.arrivals.base_per_min == rates[0] and sc.seed == 4 and sc.policy == "hicache"
    assert [(c.at_min, c.per_min) for c in sc.arrivals.rate_changes] == \
        [(i * 15.0, r) for i, r in enumerate(rates) if i > 0]
    assert sc.router == "least-loaded" and sc.host_ratio == dep.host_ratio
    assert sc.duration_min == sc.measure_end_min == shipped.ramp.duration_min
    assert sc.arrivals.warm_sessions == shipped.ramp.warm_sessions and sc.surge.factor == 1.0
    assert sc.workload.sessions == shipped.ramp.workload_sessions
    assert LoadRamp((1.0, 2.0), 5).rate_changes() == [{"at_min": 5, "per_min": 2.0}]
    with pytest.raises(BasinInputError, match="at least one step rate"):
        LoadRamp((), 5)


@pytest.mark.parametrize("name", ["1p1d-h100", "1p3d-h200"])
def test_the_default_ramp_is_the_shipped_profiles(name: str) -> None:
    shipped = load_profile(name)
    assert default_ramp(name, shipped.workload, seed=shipped.seed) == shipped.ramp


def test_profiling_again_reproduces_the_shipped_profile() -> None:
    # The whole 1P1D H100 profile (3 ramps of 225 simulated minutes, about
    # 15 s on two cores): every stored figure comes back.
    shipped = load_profile("1p1d-h100")
    p = profile_deployment(shipped.deployment, shipped.workload, repeats=shipped.repeats, seed=shipped.seed,
                           workers=2)
    assert p.ramp == shipped.ramp
    assert (p.kappa, p.kappas, p.lambda_c_per_min, p.lambda_c_per_repeat) == \
        (shipped.kappa, shipped.kappas, shipped.lambda_c_per_min, shipped.lambda_c_per_repeat)
    assert p.to_dict() == shipped.to_dict()


def test_profile_runs_its_ramps_on_the_one_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = load_profile("1p1d-h100")
    seen: list[tuple[int, int | None]] = []

    def fake_pool(plans, on_result=None, *, workers=None, progress=None, **_):  # type: ignore[no-untyped-def]
        seen.append((len(plans), workers))
        assert [p.scenario.seed for p in plans] == [0, 1, 2] and all(p.measure is not None for p in plans)
        # Stand-ins for the ramps' analyses.
        return [SimpleNamespace(measured=dataclasses.replace(shipped.runs[p.scenario.seed])) for p in plans]

    monkeypatch.setattr(ramp_mod, "run_plans", fake_pool)
    p = profile_deployment("1p1d-h100", repeats=3, ramp=shipped.ramp, workers=2)
    assert seen == [(3, 2)]
    assert [r.seed for r in p.runs] == [0, 1, 2]
    assert (p.kappa, p.kappas, p.lambda_c_per_min) == (shipped.kappa, shipped.kappas, shipped.lambda_c_per_min)
    assert p.healthy_step_rate_per_min == shipped.healthy_step_rate_per_min
    assert p.to_dict() == shipped.to_dict()
