"""``basin run`` and the scenario layer: bad input stops before any run with
one line naming the field and the fix (exit 2), nothing given is silently
dropped, and every output folder says what produced it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tests.cli_helpers import run_basin

from basin.catalog import load_deployment, load_hardware
from basin.cli.options import parse_jobs
from basin.errors import BasinInputError
from basin.experiments.plan import cliff_used, params_for
from basin.experiments.runner import check_runnable
from basin.experiments.scenario import load_scenario
from basin.paths import SCENARIO_DIR

#: A 20-minute trap-1p1d: about a second per system.
SHORT = ["--set", "duration_min=20", "--set", "measure_end_min=15", "--set", "surge.start_min=3",
         "--set", "surge.end_min=6"]


# ------------------------------------------------------------ fail fast
def test_wrong_typed_policy_parameter_is_refused_in_under_a_second(capsys, monkeypatch):
    import basin.experiments.runner as runner

    monkeypatch.setattr(runner, "Simulator", None)  # any run would fail loudly
    start = time.perf_counter()
    code, out, err = run_basin(capsys, "run", "trap-1p1d", "--system", "basin-prior",
                               "--set", "policy_params.margin=abc")
    assert time.perf_counter() - start < 1.0
    assert code == 2
    assert err.startswith("error: policy 'basin-prior', parameter 'margin': expected a number, got 'abc'")
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_policy_params_go_to_the_systems_that_have_them():
    sc = load_scenario("trap-1p1d", ["policy_params.margin=0.8"])
    # hicache has no margin: refused, naming the systems that do (not ignored).
    with pytest.raises(BasinInputError, match=r"policy_params.margin: no system of this run \(hicache\).*"
                                              r"basin, basin-paper, basin-prior, crossflow"):
        params_for(sc, ["hicache"])
    split = params_for(sc, ["hicache", "basin-prior"])
    assert split.given == {"hicache": {}, "basin-prior": {"margin": 0.8}}
    assert split.notes == ("policy_params.margin applies to basin-prior; hicache has no such parameter",)
    with pytest.raises(BasinInputError, match="did you mean margin"):
        params_for(load_scenario("trap-1p1d", ["policy_params.margn=0.8"]), ["basin-prior"])


def test_policy_params_reach_a_system_chosen_with_system(capsys, tmp_path):
    code, out, err = run_basin(capsys, "run", "trap-1p1d", "--system", "basin-prior", "--set",
                               "policy_params.margin=0.8", *SHORT, "--json", "--no-plots", "--out", str(tmp_path))
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["policy_params"]["margin"] == 0.8  # not silently the default 0.9
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["systems"]["basin-prior"]["policy_params"]["margin"] == 0.8


def test_basin_without_its_own_cliff_profile_says_so_and_records_it(capsys, tmp_path):
    sc = load_scenario("trap-1p1d", ["host_ratio=2"])
    info, warning = cliff_used(sc, "basin-prior", {})
    assert info is not None and info["kappa"] == 1.0
    assert "no cliff profile for 1p1d-h100 (host tier 2x)" in warning and "reference curve" in warning
    assert "basin profile 1p1d-h100 --host-ratio 2" in warning
    assert cliff_used(load_scenario("trap-1p1d"), "basin-prior", {})[1] is None  # its own profile: quiet
    assert cliff_used(sc, "hicache", {}) == (None, None)
    code, out, err = run_basin(capsys, "run", "trap-1p1d", "--system", "basin-prior", "--set", "host_ratio=2",
                               "--set", "duration_min=2", "--set", "measure_end_min=2", "--json", "--no-plots",
                               "--out", str(tmp_path))
    assert code == 0
    assert "warning: basin-prior: no cliff profile for 1p1d-h100 (host tier 2x)" in err
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["warnings"] and prov["systems"]["basin-prior"]["cliff_profile"]["kappa"] == 1.0
    assert json.loads(out)[0]["cliff_profile"]["origin"].startswith("reference curve")


def test_surge_factor_beside_scenario_is_refused(capsys):
    code, _, err = run_basin(capsys, "model", "analyze", "--scenario", "trap-1p1d", "--surge-factor", "3")
    assert code == 2 and "use --set surge.factor=VALUE" in err
    code, _, err = run_basin(capsys, "model", "analyze", "--scenario", "trap-1p1d", "--host-ratio", "2")
    assert code == 2 and "use --set host_ratio=VALUE" in err


def test_measure_window_past_the_run_is_refused_at_load():
    with pytest.raises(BasinInputError, match=r"measure_end_min \(90\) is after the run's end, duration_min "
                                              r"\(10\).*--set measure_end_min=7.5"):
        load_scenario("trap-1p1d", ["duration_min=10"])
    assert load_scenario("trap-1p1d", ["duration_min=10", "measure_end_min=10"]).measure_end_min == 10


def test_set_typo_names_the_key_and_the_valid_ones_without_blaming_the_file():
    with pytest.raises(BasinInputError) as exc:
        load_scenario("trap-1p1d", ["surge.factr=2"])
    text = str(exc.value)
    assert "--set 'surge.factr=2'" in text and "did you mean surge.factor?" in text
    assert "end_min, factor, start_min" in text
    assert str(SCENARIO_DIR) not in text and "Extra inputs" not in text
    with pytest.raises(BasinInputError, match=r"no field 'duraton_min'; did you mean duration_min\?"):
        load_scenario("trap-1p1d", ["duraton_min=10"])
    with pytest.raises(BasinInputError) as exc:
        load_scenario("trap-1p1d", ["surge.factor=abc"])
    assert str(exc.value) == "--set 'surge.factor=abc': field 'surge.factor': expected a number (got 'abc')"


def test_setting_one_base_rate_clears_the_other():
    sc = load_scenario("main-1p3d-x5", ["arrivals.base_per_min=5"])
    assert (sc.arrivals.base_per_min, sc.arrivals.base_fraction_of_critical) == (5.0, None)
    sc = load_scenario("trap-1p1d", ["arrivals.base_fraction_of_critical=0.4"])
    assert (sc.arrivals.base_per_min, sc.arrivals.base_fraction_of_critical) == (None, 0.4)
    with pytest.raises(BasinInputError, match="exactly one of base_per_min or base_fraction_of_critical"):
        load_scenario("trap-1p1d", ["arrivals.base_fraction_of_critical=0.4", "arrivals.base_per_min=5"])


def test_relative_paths_in_a_scenario_file_are_read_from_its_folder(tmp_path, monkeypatch):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "s.yaml").write_text("name: s\ndeployment: 1p1d-h100\nworkload: {name: traces/w.parquet}\n"
                                   "arrivals: {base_per_min: 2, burst_workload: {name: b.jsonl}}\n"
                                   "policy: basin-prior\npolicy_params: {profile: p.yaml}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sc = load_scenario(str(folder / "s.yaml"))
    assert sc.workload.name == str(folder / "traces" / "w.parquet")
    assert sc.arrivals.burst_workload is not None and sc.arrivals.burst_workload.name == str(folder / "b.jsonl")
    assert sc.policy_params["profile"] == str(folder / "p.yaml")
    assert sc.deployment == "1p1d-h100"  # a name stays a name
    # A path given on the command line is the command line's: left as typed.
    assert load_scenario(str(folder / "s.yaml"), ["workload.name=mine.parquet"]).workload.name == "mine.parquet"


def test_unknown_hardware_suggests_close_names():
    with pytest.raises(BasinInputError, match=r"unknown hardware 'h100': did you mean h100-nvl"):
        load_hardware("h100")
    with pytest.raises(BasinInputError, match=r"deployment shape '2p4d-h100': unknown hardware 'h100': "
                                              r"did you mean h100-nvl"):
        load_deployment("2p4d-h100")
    with pytest.raises(BasinInputError, match=r"'1p1d-h10': not a shipped deployment \(did you mean 1p1d-h100"):
        load_deployment("1p1d-h10")
    with pytest.raises(BasinInputError, match=r"unknown scenario 'trap-1p': did you mean trap-1p1d\?"):
        load_scenario("trap-1p")


def test_deployment_is_checked_before_any_run(capsys, monkeypatch):
    import basin.experiments.runner as runner

    monkeypatch.setattr(runner, "Simulator", None)
    code, _, err = run_basin(capsys, "run", "trap-1p1d", "--set", "deployment=2p4d-h100")
    assert code == 2 and "did you mean h100-nvl" in err
    with pytest.raises(BasinInputError, match="unknown system"):
        check_runnable(load_scenario("trap-1p1d"), ["nope"])


def test_cache_replay_names_the_format_it_reads(capsys, tmp_path):
    parquet = tmp_path / "w.parquet"
    parquet.write_bytes(b"PAR1" + b"\0" * 16)
    code, _, err = run_basin(capsys, "cache", "replay", str(parquet), "--capacity-tokens", "1000")
    assert code == 2
    assert "is a Parquet file; cache replay reads a Mooncake-format trace: JSON lines (.jsonl or .jsonl.gz)" in err
    assert "malformed JSON" not in err


def test_jobs_minus_one_means_every_core(capsys):
    assert parse_jobs(-1) is None and parse_jobs(None) is None and parse_jobs(3) == 3
    with pytest.raises(BasinInputError, match="-1 for every core"):
        parse_jobs(0)
    code, _, err = run_basin(capsys, "compare", "trap-1p1d", "--jobs", "-2")
    assert code == 2 and "--jobs -2" in err


# ------------------------------------------------------------ provenance
def test_run_records_what_it_ran_and_clean_clears_earlier_runs(capsys, tmp_path):
    out = tmp_path / "out"
    (out / "thunderagent").mkdir(parents=True)
    (out / "thunderagent" / "summary.json").write_text("{}")
    (out / "notes").mkdir()
    (out / "notes" / "mine.txt").write_text("keep me")
    code, stdout, err = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--seed", "3", "--out", str(out), "--no-plots",
                                  "--clean")
    assert code == 0, err
    assert not (out / "thunderagent").exists() and (out / "notes" / "mine.txt").exists()
    assert "--clean: removed run folders of an earlier command" in err and "thunderagent" in err
    prov = json.loads((out / "provenance.json").read_text())
    import basin

    assert prov["basin_serve_version"] == basin.__version__
    assert prov["command"].startswith("basin ")
    (sc,) = prov["scenarios"]
    assert sc["seed"] == 3 and sc["resolved"]["seed"] == 3 and sc["resolved"]["duration_min"] == 20
    assert "seed=3" in sc["overrides"] and sc["file"].endswith("trap-1p1d.yaml")
    assert prov["systems"]["hicache"]["policy_params"] == {}
    assert (out / "summary.csv").read_text().splitlines()[0].startswith("system,")
    # The table: full system names, the state's reason, and what L_late is.
    import csv

    (row,) = csv.DictReader((out / "summary.csv").open())
    assert "why" in stdout and all(word in stdout for word in row["state_reason"].split())
    assert "L_late: the largest median TTFT" in " ".join(stdout.split())
    # stderr is not a terminal here: progress comes as plain lines, the last at the run's end.
    assert "trap-1p1d / hicache: 20/20 min simulated (100%)" in err


def test_plain_progress_lines_are_spaced_and_end_once() -> None:
    import io

    from basin.cli.run import PlainProgress

    buf = io.StringIO()
    lines = PlainProgress("x / hicache", 10.0, stream=buf)
    for t_s in (0.0, 60.0, 120.0, 600.0, 600.0):
        lines(t_s)
    assert buf.getvalue().splitlines() == [
        "x / hicache: 0/10 min simulated (0%), 0 s elapsed", "x / hicache: 10/10 min simulated (100%), 0 s elapsed"]


def test_run_prints_csv(capsys, tmp_path):
    code, out, _ = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--csv", "--no-plots", "--out", str(tmp_path))
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split(",")[:2] == ["system", "duration_s"] and row.startswith("hicache,1200.0")
    code, _, err = run_basin(capsys, "run", "trap-1p1d", "--csv", "--json")
    assert code == 2 and "give one" in err


# ------------------------------------------------------------ help examples
def test_help_examples_write_outside_the_repository():
    import re

    import typer.main

    from basin.cli.app import app

    command = typer.main.get_command(app)
    texts = []

    def walk(cmd) -> None:
        texts.append(cmd.help or "")
        texts.extend(p.help or "" for p in cmd.params if hasattr(p, "help"))
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(command)
    writes = re.compile(r"--(out|plot|doc|ramp-plots)\s+(docs|profiles|scenarios|data|src)/")
    bad = [t for t in texts if writes.search(t)]
    assert not bad, bad
    profile_help = command.commands["profile"].help  # type: ignore[attr-defined]
    assert "--out results/" in profile_help


def test_paths_resolve_inside_the_checkout():
    from basin import paths

    assert paths.IN_CHECKOUT and paths.SCENARIO_DIR == paths.REPO_ROOT / "scenarios"
    assert (paths.PROFILE_DIR / "hardware").is_dir() and (paths.DATA_DIR / "README.md").is_file()
    assert isinstance(paths.SHIPPED_DIR, Path)


def test_run_keeps_other_systems_runs(capsys, tmp_path):
    """A second `basin run` into the folder of a first keeps the first's
    systems: merged into summary.csv and provenance when the scenario is the
    same, kept aside (not listed) when it is not."""
    out = tmp_path / "out"
    code, _, err = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--system", "basin", "--out", str(out))
    assert code == 0, err
    code, stdout, err = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--system", "hicache", "--out", str(out),
                                  "--json")
    assert code == 0, err
    assert [r["system"] for r in json.loads(stdout)] == ["hicache"]
    assert (out / "basin" / "summary.json").is_file() and (out / "hicache" / "summary.json").is_file()
    assert "kept the runs of an earlier command on the same scenario" in err and "basin" in err
    import csv

    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["system"] for r in rows] == ["hicache", "basin"]
    prov = json.loads((out / "provenance.json").read_text())
    assert set(prov["systems"]) == {"hicache", "basin"} and prov["outputs"]["earlier_runs"] == ["basin"]
    # Another seed is another scenario: basin's folder stays, but is not listed as this run's.
    code, _, err = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--system", "hicache", "--seed", "5",
                             "--out", str(out), "--no-plots")
    assert code == 0, err
    assert (out / "basin" / "summary.json").is_file()
    assert "kept run folders of an earlier command with other settings" in err
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["system"] for r in rows] == ["hicache"]
    assert json.loads((out / "provenance.json").read_text())["outputs"]["other_runs_kept"] == ["basin"]
