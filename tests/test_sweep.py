"""``basin sweep``: the sweep file's checks, --list, the result store (rerun,
changed axis, resume after a kill, two writers at once) and the table."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tests.cli_helpers import run_basin

from basin.errors import BasinInputError
from basin.experiments.pool import JobProgress
from basin.experiments.store import RunStore
from basin.experiments.sweep import run_sweep
from basin.experiments.sweep_grid import load_sweep

ROOT = Path(__file__).resolve().parents[1]

#: trap-1p1d cut to 10 minutes: a run takes well under a second.
SHORT = """\
scenario: trap-1p1d
set:
  duration_min: 10
  measure_end_min: 8
  surge.start_min: 2
  surge.end_min: 5
"""


def write_sweep(folder: Path, body: str, name: str = "tiny", header: str = SHORT) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\n{header}{body}", encoding="utf-8")
    return path


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def _basin_process(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "basin", *args], cwd=ROOT, env=_python_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ------------------------------------------------------------ validation
BAD_SWEEPS = [
    ("axis:\n  seed: [0]\n", "field 'axis': not a field here; did you mean axes?"),
    ("axes:\n  surge.factr: [1.0]\n", "field 'axes.surge.factr': a scenario has no field 'surge.factr'; "
                                      "did you mean surge.factor?"),
    ("axes:\n  seed: 3\n", "field 'axes.seed': expected a list (got 3)"),
    ("axes:\n  seed: []\n", "field 'axes.seed'"),
    ("axes:\n  surge.factor: [1.0, -1]\n", "field 'axes.surge.factor' at the run surge.factor=-1: scenario field "
                                           "'surge.factor': must be > 0.0 (got -1)"),
    ("axes:\n  seed: [0, 1, 0]\n", "field 'axes.seed': the value(s) 0 appear twice"),
    ("axes:\n  policy: [hicache]\n", "field 'axes.policy': the systems are listed under 'systems:'"),
    ("axes:\n  surge.factor: [1.0]\n  seed: [0]\nderived:\n  load: {values: [0.5], sets: arrivals.base_per_min}\n"
     "  more: {values: [0.5], sets: arrivals.base_fraction_of_critical}\n",
     "field 'derived.more.sets' and field 'derived.load.sets' both give the base rate"),
    ("set:\n  surge.factor: 2.0\naxes:\n  surge.factor: [1.0]\n",
     "field 'axes.surge.factor' and field 'set.surge.factor' both give 'surge.factor'"),
    ("set:\n  host_ratio: 3\nderived:\n  load: {values: [0.9], of: critical}\n",
     "field 'derived.load' needs the critical rate of deployment '1p1d-h100' (host tier 3x, router "
     "cache-aware) with workload 'terminal-bench': no cliff profile at"),
    ("derived:\n  load: {values: [0.9], at_min: 20}\n", "field 'derived.load.at_min': only an axis that sets"),
    ("systems: [hicach]\n", "field 'systems': unknown system(s) hicach"),
    ("axes:\n  seed: [0]\nplot: {kind: line, x: seed, field: goodput}\n",
     "field 'plot.field': 'goodput' is not a number of the run summary; did you mean goodput_per_h"),
    ("axes:\n  seed: [0]\nplot: {kind: line, x: surge.factor}\n",
     "field 'plot.x': 'surge.factor' is not an axis of this sweep"),
    ("axes:\n  seed: [0]\n  surge.factor: [1.0, 2.0]\nplot: {kind: line, x: seed}\n",
     "field 'plot': axis surge.factor has several values but the line shows only seed"),
    ("axes:\n  seed: [0]\n  surge.factor: [1.0, 2.0]\nplot: {kind: heatmap, x: seed}\n",
     "field 'plot.y': a heatmap needs a second axis"),
    ("axes:\n  seed: [0]\nplot: {kind: line, x: seed, out: fig.docx}\n",
     "field 'plot.out': cannot write a figure as '.docx'"),
]


@pytest.mark.parametrize(("body", "message"), BAD_SWEEPS)
def test_bad_sweep_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str,
                                   message: str) -> None:
    path = write_sweep(tmp_path, body)
    code, out, err = run_basin(capsys, "sweep", str(path), "--out", str(tmp_path / "out"), "--list")
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_bad_scenario_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path, "axes:\n  seed: [0]\n", name="../up")
    code, _, err = run_basin(capsys, "sweep", str(path), "--list")
    assert code == 2 and "field 'name': use letters, digits" in err
    path = write_sweep(tmp_path, "axes:\n  seed: [0]\n", header="scenario: no-such-scenario\n")
    code, _, err = run_basin(capsys, "sweep", str(path), "--list")
    assert code == 2 and "field 'scenario': unknown scenario 'no-such-scenario'" in err
    path = write_sweep(tmp_path, "axes:\n  seed: [0]\n", header="scenario: missing.yaml\n")
    code, _, err = run_basin(capsys, "sweep", str(path), "--list")
    assert code == 2 and f"{tmp_path / 'missing.yaml'}: scenario file not found" in err  # relative to the sweep
    good = write_sweep(tmp_path, "axes:\n  seed: [0]\n")
    code, _, err = run_basin(capsys, "sweep", str(good), "--address", "auto")
    assert code == 2 and "--address auto: only the Ray executor connects to a cluster" in err
    code, _, err = run_basin(capsys, "sweep", str(good), "--executor", "dask")
    assert code == 2 and "--executor 'dask': use one of local, ray" in err
    code, _, err = run_basin(capsys, "sweep", str(tmp_path / "none.yaml"))
    assert code == 2 and "sweep file not found" in err


def test_scenario_file_relative_to_the_sweep(tmp_path: Path) -> None:
    study = tmp_path / "study"
    study.mkdir()
    (study / "mine.yaml").write_text((ROOT / "scenarios" / "trap-1p1d.yaml").read_text(), encoding="utf-8")
    path = write_sweep(study, "axes:\n  seed: [0, 1]\n", header=SHORT.replace("trap-1p1d", "mine.yaml"))
    sweep = load_sweep(path)
    assert sweep.scenario_arg == str((study / "mine.yaml").resolve())
    assert [p.coords["seed"] for p in sweep.points] == [0, 1]


# ----------------------------------------------------------------- --list
def test_list_prints_the_runs_without_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 2.0]\n  seed: [0, 1]\nsystems: [hicache, basin]\n")
    code, out, err = run_basin(capsys, "sweep", str(path), "--out", str(tmp_path / "out"), "--list", "--json")
    assert code == 0, err
    listing = json.loads(out)
    assert listing["runs_total"] == 8 and listing["runs_stored"] == 0
    assert [(r["surge.factor"], r["seed"], r["system"]) for r in listing["runs"][:3]] == [
        (1.0, 0, "hicache"), (1.0, 0, "basin"), (1.0, 1, "hicache")]
    assert len({r["run"] for r in listing["runs"]}) == 8  # one key per distinct run
    assert not (tmp_path / "out").exists()
    code, out, _ = run_basin(capsys, "sweep", str(path), "--list")
    assert code == 0 and "8 runs of trap-1p1d" in out and "surge.factor" in out


# ------------------------------------------------------ store and table
def test_rerun_computes_nothing_and_a_new_axis_value_only_its_points(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 2.0]\n  seed: [0]\n"
                                 "plot: {kind: line, x: surge.factor}\n")
    code, out, err = run_basin(capsys, "sweep", str(path), "--out", str(out_dir), "--json", "--jobs", "2")
    assert code == 0, err
    first = json.loads(out)
    assert first == {"runs_total": 2, "runs_computed": 2, "runs_reused": 0, "table": str(out_dir / "sweep.parquet")}
    assert "tiny: 2/2 runs (100%)" in err  # plain progress lines off a terminal
    table = pq.read_table(first["table"])
    assert table.column_names[:4] == ["surge.factor", "seed", "system", "run"]
    assert {"goodput_per_h", "state", "active_sessions_final"} <= set(table.column_names)
    assert table.column("surge.factor").to_pylist() == [1.0, 2.0]
    assert (out_dir / "tiny-line-goodput_per_h.png").is_file()
    before = (out_dir / "sweep.parquet").read_bytes()

    code, out, err = run_basin(capsys, "sweep", str(path), "--out", str(out_dir), "--json")
    assert code == 0 and json.loads(out)["runs_computed"] == 0 and json.loads(out)["runs_reused"] == 2
    assert (out_dir / "sweep.parquet").read_bytes() == before  # stored runs give the same table, byte for byte

    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 2.0, 3.0]\n  seed: [0]\n")
    code, out, err = run_basin(capsys, "sweep", str(path), "--out", str(out_dir), "--json")
    assert code == 0, err
    assert json.loads(out) == {**first, "runs_total": 3, "runs_computed": 1, "runs_reused": 2}
    rows = pq.read_table(out_dir / "sweep.parquet").to_pylist()
    assert [r["surge.factor"] for r in rows] == [1.0, 2.0, 3.0]
    store = RunStore(out_dir / "runs")
    assert sorted(store.keys()) == sorted(r["run"] for r in rows)
    run_dir = store.path(rows[2]["run"])
    assert {p.name for p in run_dir.iterdir()} == {"calls.parquet", "sessions.parquet", "timeseries.parquet",
                                                   "summary.json", "provenance.json", "config.json"}
    record = json.loads((run_dir / "provenance.json").read_text())
    assert record["scenarios"][0]["resolved"]["surge"]["factor"] == 3.0
    assert record["point"] == {"surge.factor": 3.0, "system": "hicache", "seed": 0}
    assert "policy_params" in record["systems"]["hicache"]  # every setting the policy ran with (HiCache: none)
    assert json.loads((run_dir / "config.json").read_text())["code_digest"]
    code, _, err = run_basin(capsys, "report", str(out_dir))
    assert code == 0 and (out_dir / "report.html").is_file()


def test_derived_axis_and_heatmaps(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 3.0]\n  seed: [0, 1]\n"
                                 "derived:\n  base_load: {values: [0.5, 1.0], of: base}\n"
                                 "  after: {values: [0.2], of: 2.0, sets: arrivals.rate_changes, at_min: 6}\n"
                                 "plot:\n  - {kind: heatmap, x: surge.factor, y: base_load, field: trapped}\n"
                                 "  - {kind: heatmap, x: surge.factor, y: base_load, out: goodput.svg}\n")
    sweep = load_sweep(path)
    assert len(sweep.points) == 8
    p = sweep.points[1]
    assert p.coords == {"surge.factor": 1.0, "base_load": 1.0, "base_load.per_min": 3.3, "after": 0.2,
                        "after.per_min": 0.4, "system": "hicache", "seed": 0}
    assert p.plan.scenario.arrivals.base_per_min == pytest.approx(3.3)
    changes = p.plan.scenario.arrivals.rate_changes
    assert changes[0].at_min == 6 and changes[0].per_min == 0.4
    outcome = run_sweep(sweep, tmp_path / "out", workers=2)
    assert outcome.runs_computed == 8
    assert [x.name for x in outcome.plots] == ["tiny-heatmap-trapped.png", "goodput.svg"]
    rows = pq.read_table(outcome.table).to_pylist()
    assert [r["base_load.per_min"] for r in rows[:2]] == pytest.approx([1.65, 3.3])
    assert all(r["state"] for r in rows)


def test_a_killed_sweep_resumes_without_recomputing(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 1.5, 2.0, 2.5, 3.0]\n  seed: [0]\n")
    proc = _basin_process("sweep", str(path), "--out", str(out_dir), "--jobs", "1")
    store = RunStore(out_dir / "runs")
    deadline = time.monotonic() + 60
    while len(store.keys()) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = set(store.keys())
    assert 2 <= len(finished) < 5, "the sweep finished before it could be killed"
    assert not (out_dir / "sweep.parquet").exists()
    sweep = load_sweep(path)
    outcome = run_sweep(sweep, out_dir, workers=1)
    assert outcome.runs_reused == len(finished) and outcome.runs_computed == 5 - len(finished)
    assert len(pq.read_table(outcome.table)) == 5
    assert not [p for p in (out_dir / "runs").iterdir() if p.name.startswith(".")]  # the killed writer's temp


def test_two_writers_on_one_store(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 2.0, 3.0]\n  seed: [0]\n")
    procs = [_basin_process("sweep", str(path), "--out", str(out_dir), "--jobs", "1", "--json") for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1] for r in results]
    counts = [json.loads(out) for out, _ in results]
    assert all(c["runs_total"] == 3 for c in counts)
    store = RunStore(out_dir / "runs")
    assert len(store.keys()) == 3
    assert not [p for p in (out_dir / "runs").iterdir() if p.name.startswith(".")]
    for key in store.keys():
        assert store.summary(key).n_measured > 0  # every stored run whole and readable
    again = run_sweep(load_sweep(path), out_dir)
    assert again.runs_computed == 0
    assert [r["run"] for r in pq.read_table(again.table).to_pylist()] == [p.key for p in load_sweep(path).points]


# -------------------------------------------------------- store details
def test_store_keeps_the_first_copy_and_cleans_dead_writers(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "axes:\n  seed: [0]\n")
    sweep = load_sweep(path)
    run_sweep(sweep, tmp_path / "out")
    store = RunStore(tmp_path / "out" / "runs")
    key = sweep.points[0].key
    from basin.metrics.io import read_run

    tables = read_run(store.path(key))
    assert store.put(key, tables, store.summary(key), {}, {}) is False  # already there: left alone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = store.root / f".tmp-{key}-{int(dead.stdout)}-abcd1234"
    stale.mkdir()
    live = store.root / f".tmp-{key}-{os.getpid()}-abcd1234"
    live.mkdir()
    assert store.clean_stale() == [stale.name]
    assert live.is_dir()
    live.rmdir()
    broken = store.path("f" * 32)
    broken.mkdir()  # a folder under a key but no run in it
    assert store.put("f" * 32, tables, store.summary(key), {}, {}) is True
    assert store.has("f" * 32)
    assert [p.name.startswith(".broken-") for p in store.root.iterdir() if p.name.startswith(".")] == [True]


def test_keys_follow_the_resolved_config(tmp_path: Path) -> None:
    # 1 and 1.0 resolve to the same scenario, hence the same run; another seed is another run.
    a = load_sweep(write_sweep(tmp_path, "axes:\n  surge.factor: [1]\n  seed: [0, 1]\n", name="a"))
    b = load_sweep(write_sweep(tmp_path, "axes:\n  surge.factor: [1.0]\n  seed: [0]\n", name="b"))
    assert a.points[0].key == b.points[0].key
    assert a.points[0].key != a.points[1].key


def test_plain_progress_lines() -> None:
    stream = io.StringIO()
    with JobProgress("sweep x", 3, stream=stream, terminal=False) as tick:
        for done in (1, 2, 3):
            tick(done, 3)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("sweep x: 1/3 runs (33%), 0:00:00 elapsed, ETA ")
    assert lines[-1] == "sweep x: 3/3 runs (100%), 0:00:00 elapsed"


def test_ray_missing_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from basin.experiments.executors import check_executor

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(BasinInputError, match=r"pip install 'basin-serve\[ray\]' \(the 'ray' extra\)"):
        check_executor("ray", None)
    code, _, err = run_basin(capsys, "sweep", str(write_sweep(tmp_path, "axes:\n  seed: [0]\n")),
                             "--out", str(tmp_path / "out"), "--executor", "ray")
    assert code == 2 and "pip install 'basin-serve[ray]' (the 'ray' extra)" in err  # the brackets survive
    assert not (tmp_path / "out").exists()


def test_ray_address_nothing_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = write_sweep(tmp_path, "axes:\n  seed: [0]\n")
    code, _, err = run_basin(capsys, "sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "ray",
                             "--address", f"127.0.0.1:{port}")
    assert code == 2 and f"--address 127.0.0.1:{port}: nothing answers there" in err
    code, _, err = run_basin(capsys, "sweep", str(path), "--executor", "ray", "--address", "head-node")
    assert code == 2 and "expected HOST:PORT, ray://HOST:PORT or auto" in err


def test_progress_bar_on_a_terminal() -> None:
    stream = io.StringIO()
    with JobProgress("sweep x", 2, stream=stream, terminal=True) as tick:
        tick(1, 2)
        tick(2, 2)
    shown = stream.getvalue()
    assert "sweep x" in shown and "2/2" in shown and "ETA" in shown
    assert "runs (" not in shown  # the bar, not the plain lines


def test_systems_may_be_one_name(tmp_path: Path) -> None:
    """`systems: all` (as docs/sweeps.md writes it) and `systems: [all]` are the same sweep."""
    from basin.experiments.sweep_grid import load_sweep

    one = load_sweep(write_sweep(tmp_path, "axes:\n  seed: [0]\nsystems: all\n", name="one"))
    listed = load_sweep(write_sweep(tmp_path, "axes:\n  seed: [0]\nsystems: [all]\n", name="listed"))
    assert one.systems == listed.systems and len(one.systems) > 5
    assert load_sweep(write_sweep(tmp_path, "axes:\n  seed: [0]\nsystems: basin\n", name="b")).systems == ("basin",)


def test_a_shipped_sweep_runs_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    """sweeps/ ships in the package; its files resolve by name, subfolders included."""
    code, out, err = run_basin(capsys, "sweep", "fig07-vulnerability-1p1d", "--list", "--json")
    assert code == 0, err
    assert json.loads(out)["runs_total"] == 120
    for spelling in ("sweeps/demo-surge-size.yaml", "demo-surge-size.yaml", "calibration/trap-1p1d-seeds"):
        code, _, err = run_basin(capsys, "sweep", spelling, "--list", "--json")
        assert code == 0, (spelling, err)
    code, out, _ = run_basin(capsys, "sweep", "all", "--list", "--json")
    names = {row["name"] for row in json.loads(out)}
    assert {"fig07-vulnerability-1p1d", "calibration/trap-1p1d-seeds", "demo-surge-size"} <= names
    code, _, err = run_basin(capsys, "sweep", "fig99-nothing")
    assert code == 2 and "no shipped sweep of that name; shipped: calibration/burst-1p1d-seeds" in err
