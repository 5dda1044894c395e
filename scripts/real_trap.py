"""The trap and its escape on a real vLLM, each run beside its simulation.

    .venv/bin/python scripts/real_trap.py --runs no-surge surge --seeds 0 1 2

For every run kind and seed this starts a fresh vLLM from the manifest that
``make engine`` writes (pinned to its cores, with the scenario's KV pool), a
``basin gateway`` in front of it and ``basin replay --scenario`` against the
gateway, samples the CPU time of the engine, the gateway and the client every
few seconds, and then runs the same scenario, seed and policy in the
simulator. Run kinds (the issue's runs 1-4, docs/real-engine.md):

* ``no-surge``: the base load alone (surge factor 1);
* ``surge``: the scenario's surge, the gateway passing calls through (hicache);
* ``removal``: the surge, and the client ends the surge's sessions when it ends;
* ``basin``: the surge through ``basin gateway --policy basin``.

Each run writes ``OUT/KIND/seedN/{real,sim}/...`` (the replay's and the
simulator's tables and summary), ``cpu.csv`` and ``run.json``; at the end
``OUT/table.csv`` and ``OUT/table.md`` compare real and simulated runs, and
``OUT/panels.png`` draws hit rate, TTFT and active sessions over time.
A run already complete in OUT is kept, so an interrupted study resumes.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from basin.catalog.cliff_profiles import scenario_profile_path

ROOT = Path(__file__).resolve().parents[1]
BASIN = [sys.executable, "-m", "basin"]
RUN_KINDS = ("no-surge", "surge", "removal", "basin")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _say(msg: str) -> None:
    print(f"real_trap: {msg}", flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(url: str, path: str) -> bool:
    try:
        with urllib.request.urlopen(url + path, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_ready(proc: subprocess.Popen, url: str, path: str, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not _ready(url, path):
        if proc.poll() is not None:
            raise SystemExit(f"real_trap: {what} exited with {proc.returncode} at start; see {log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"real_trap: {what} was not ready within {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen | None, group: bool) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.terminate()
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


# ------------------------------------------------------------ CPU accounting
def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15 of stat)


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return pids


@dataclass
class CpuSampler:
    """Every ``interval_s``, the CPU seconds each role has used since the last
    sample (an engine is its whole process group: API server, engine core,
    worker), so that a starved client or gateway shows in the record."""

    roles: dict[str, tuple[int, bool]]  # role -> (pid or pgid, is a group)
    path: Path
    interval_s: float = 5.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _seen: dict[int, float] = field(default_factory=dict)

    def _used(self, role_id: int, group: bool) -> float:
        pids = _group_pids(role_id) if group else [role_id]
        total = 0.0
        for pid in pids:
            now = _cpu_s(pid)
            total += max(0.0, now - self._seen.get(pid, 0.0))
            self._seen[pid] = now
        return total

    def _loop(self) -> None:
        with self.path.open("w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow(["t_s", *[f"{r}_cores" for r in self.roles]])
            start = last = time.monotonic()
            for role_id, group in self.roles.values():
                self._used(role_id, group)
            while not self._stop.wait(self.interval_s):
                now = time.monotonic()
                shares = [self._used(i, g) / (now - last) for i, g in self.roles.values()]
                out.writerow([round(now - start, 2), *[round(s, 3) for s in shares]])
                fh.flush()
                last = now

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()


def cpu_summary(path: Path) -> dict[str, float]:
    """Mean and 95th-percentile cores each role used over the run."""
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    out: dict[str, float] = {}
    for key in (rows[0].keys() if rows else []):
        if key == "t_s":
            continue
        values = sorted(float(r[key]) for r in rows)
        out[f"{key}_mean"] = round(sum(values) / len(values), 3)
        out[f"{key}_p95"] = round(values[int(0.95 * (len(values) - 1))], 3)
    return out


# ------------------------------------------------------------------ one run
@dataclass(frozen=True)
class RunKind:
    name: str
    policy: str
    sets: tuple[str, ...]
    #: BASIN's parameters, NAME=VALUE, for the gateway and the simulation alike.
    params: tuple[str, ...] = ()


def run_kinds(scenario: dict, growth: float) -> dict[str, RunKind]:
    """The four runs; ``growth`` is BASIN's peak growth factor (:func:`peak_growth`)."""
    end_min = scenario["surge"]["end_min"]
    return {
        "no-surge": RunKind("no-surge", "hicache", ("surge.factor=1.0",)),
        "surge": RunKind("surge", "hicache", ()),
        "removal": RunKind("removal", "hicache",
                           (f"interventions=[{{at_min: {end_min}, terminate_tag: burst}}]",)),
        # The gateway sees only a session's first call, so it predicts the peak
        # by a growth factor; the simulated BASIN is given the same predictor.
        "basin": RunKind("basin", "basin", (), (f"predictor=growth:{growth:.3g}",)),
    }


def peak_growth(scenario: dict) -> float:
    """The scenario's sessions' median largest prompt over their first
    (``basin workload stats``' ``peak_over_first_prompt_p50``): the growth
    factor a first-call predictor needs, read from the trace, not tuned."""
    from basin.experiments.runner import build_workload
    from basin.experiments.scenario import WorkloadSpec
    from basin.workload.stats import workload_stats

    workload = build_workload(WorkloadSpec.model_validate(scenario["workload"]), int(scenario["seed"]))
    return workload_stats(workload).peak_over_first_prompt_p50


def _manifest() -> dict:
    """The installed engine's manifest (``make engine``), refused when missing or older
    than its definition, as the tests refuse it."""
    spec = importlib.util.spec_from_file_location("setup_vllm", ROOT / "scripts" / "setup_vllm.py")
    assert spec and spec.loader
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    path = setup.cache_dir() / "vllm-cpu.json"
    if not path.is_file():
        raise SystemExit(f"real_trap: {path} is missing; run `make engine` first")
    found = dict(json.loads(path.read_text()))
    if found.get("definition_hash") != setup.current_hash():
        raise SystemExit(f"real_trap: the vLLM install at {path} is older than profiles/engines/vllm-cpu.yaml; "
                         "run `make engine`")
    return found


def _scenario(name: str, sets: list[str]) -> dict:
    out = subprocess.run([*BASIN, "scenario", "show", name, "--json", *sum((["--set", s] for s in sets), [])],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"real_trap: scenario {name}: {out.stderr.strip() or out.stdout.strip()}")
    return dict(json.loads(out.stdout))


def _pool_tokens(deployment: str) -> int:
    """The KV pool the real engine is given: the pool a calibrated profile's engine
    declared when it was measured (the measured figure is within a prompt of it),
    else the simulated deployment's decode KV."""
    out = subprocess.run([*BASIN, "deployment", "show", deployment, "--json"], capture_output=True, text=True,
                         cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"real_trap: deployment {deployment}: {out.stderr.strip()}")
    shown = json.loads(out.stdout)
    hardware = Path(shown["hardware"])
    if hardware.suffix in (".yaml", ".yml") and hardware.is_file():
        declared = (yaml.safe_load(hardware.read_text()).get("calibration") or {}).get("engine", {}).get("declared")
        if declared and declared.get("kv_tokens"):
            return int(declared["kv_tokens"])
    return int(shown["capacity"]["decode_kv_tokens"])


def real_run(kind: RunKind, seed: int, args: argparse.Namespace, spec: dict, blocks: int, out: Path) -> None:
    """Engine, gateway and client for one run; tables in ``out/real``."""
    out.mkdir(parents=True, exist_ok=True)
    engine_port, gateway_port = _free_port(), _free_port()
    engine_url, gateway_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gateway_port}"
    engine_log, gateway_log, client_log = out / "engine.log", out / "gateway.log", out / "client.log"
    argv = [*spec["argv"], "--num-gpu-blocks-override", str(blocks), "--port", str(engine_port)]
    engine = gateway = client = None
    try:
        with engine_log.open("wb") as log:
            engine = subprocess.Popen(argv, env=dict(os.environ, **spec["env"]), stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        _wait_ready(engine, engine_url, "/health", float(spec["serve"]["startup_timeout_s"]), "vLLM", engine_log)
        gw = [*BASIN, "gateway", "--upstream", engine_url, "--engine", "vllm", "--policy", kind.policy,
              "--listen", f"127.0.0.1:{gateway_port}",
              "--cache-tokens", str(blocks * spec["serve"]["block_size_tokens"])]
        if kind.policy == "basin":
            gw += ["--profile", str(args.basin_profile),
                   *sum((["--param", p] for p in [*kind.params, *args.basin_param]), [])]
        with gateway_log.open("wb") as log:
            gateway = subprocess.Popen(gw, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        _wait_ready(gateway, gateway_url, "/healthz", 60.0, "basin gateway", gateway_log)
        replay = [*BASIN, "replay", "--scenario", args.scenario, "--target", gateway_url, "--system", kind.policy,
                  "--model", spec["served_model_name"], "--seed", str(seed), "--out", str(out / "real"),
                  *sum((["--set", s] for s in [*args.set, *kind.sets]), [])]
        with client_log.open("wb") as log:
            client = subprocess.Popen(replay, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            sampler = CpuSampler({"engine": (engine.pid, True), "gateway": (gateway.pid, False),
                                  "client": (client.pid, False)}, out / "cpu.csv")
            sampler.start()
            code = client.wait()
            sampler.stop()
        if code != 0:
            raise SystemExit(f"real_trap: the replay exited with {code}; see {client_log}")
    finally:
        _stop(client, group=False)
        _stop(gateway, group=False)
        _stop(engine, group=True)


def sim_sets(kind: RunKind, args: argparse.Namespace) -> list[str]:
    """The simulation's overrides: the run's, and for BASIN the gateway's
    profile and parameters, so that both sides run one controller."""
    sets = [*args.set, *kind.sets]
    if kind.policy == "basin":
        sets += [f"policy_params.profile={Path(args.basin_profile).resolve()}",
                 *(f"policy_params.{p}" for p in [*kind.params, *args.basin_param])]
    return sets


def sim_run(kind: RunKind, seed: int, args: argparse.Namespace, out: Path) -> None:
    cmd = [*BASIN, "run", args.scenario, "--system", kind.policy, "--seed", str(seed), "--out", str(out / "sim"),
           "--no-plots", *sum((["--set", s] for s in sim_sets(kind, args)), [])]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"real_trap: the simulation failed: {done.stderr.strip()}")


def _summary(folder: Path) -> dict:
    found = sorted(folder.rglob("summary.json"))
    return dict(json.loads(found[0].read_text())) if found else {}


# ------------------------------------------------------------------ report
FIELDS = ("state", "goodput_per_h", "hit_rate_pre", "hit_rate_final", "ttft_p50_final_s", "active_sessions_final")


def table_rows(out: Path, kinds: list[str], seeds: list[int]) -> list[dict]:
    rows = []
    for kind in kinds:
        for seed in seeds:
            folder = out / kind / f"seed{seed}"
            if not (folder / "run.json").is_file():
                continue
            real, sim = _summary(folder / "real"), _summary(folder / "sim")
            row: dict = {"run": kind, "seed": seed}
            for key in FIELDS:
                row[f"real_{key}"] = real.get(key)
                row[f"sim_{key}"] = sim.get(key)
            g_real, g_sim = real.get("goodput_per_h"), sim.get("goodput_per_h")
            row["goodput_gap"] = (round(g_sim / g_real - 1.0, 3) if isinstance(g_real, (int, float)) and g_real
                                  and isinstance(g_sim, (int, float)) else None)
            row.update(json.loads((folder / "run.json").read_text()).get("cpu", {}))
            rows.append(row)
    return rows


def write_report(out: Path, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with (out / "table.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)

    def fmt(v: object) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    cols = ["run", "seed", "real_state", "sim_state", "real_goodput_per_h", "sim_goodput_per_h", "goodput_gap",
            "real_hit_rate_final", "sim_hit_rate_final", "engine_cores_mean", "gateway_cores_p95", "client_cores_p95"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def draw_panels(out: Path, kinds: list[str], seeds: list[int]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow.parquet as pq

    present = [k for k in kinds if any((out / k / f"seed{s}" / "run.json").is_file() for s in seeds)]
    if not present:
        return
    fig, axes = plt.subplots(3, len(present), figsize=(4.2 * len(present), 8), sharex=True, squeeze=False)
    for col, kind in enumerate(present):
        for seed in seeds:
            for side, style in (("real", "-"), ("sim", "--")):
                found = sorted((out / kind / f"seed{seed}" / side).rglob("timeseries.parquet"))
                if not found:
                    continue
                t = pq.read_table(found[0]).to_pydict()
                minute = t["minute"]
                prompt = t["prompt_tokens"]
                loaded = t.get("loaded_tokens", [0] * len(prompt))
                hit = [(cached + load) / total if total else float("nan")
                       for cached, load, total in zip(t["cached_tokens"], loaded, prompt)]
                label = f"{side} seed {seed}"
                axes[0][col].plot(minute, hit, style, label=label)
                axes[1][col].plot(minute, t["ttft_p50_s"], style, label=label)
                axes[2][col].plot(minute, t["active_sessions"], style, label=label)
        axes[0][col].set_title(kind)
        axes[0][col].set_ylim(0, 1.02)
        axes[1][col].set_yscale("log")
        axes[2][col].set_xlabel("minute")
    axes[0][0].set_ylabel("prefix hit rate")
    axes[1][0].set_ylabel("median TTFT (s)")
    axes[2][0].set_ylabel("active sessions")
    if axes[0][-1].get_legend_handles_labels()[0]:
        axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "panels.png", dpi=110)
    _say(f"wrote {out / 'panels.png'}")


# -------------------------------------------------------------------- main
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="real-trap-vllm", help="scenario name or file (default real-trap-vllm)")
    ap.add_argument("--runs", nargs="+", default=list(RUN_KINDS), choices=RUN_KINDS, help="run kinds, in order")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--set", action="append", default=[], help="override a scenario field, as `basin run --set`")
    ap.add_argument("--basin-param", action="append", default=[], help="a BASIN parameter for the gateway, NAME=VALUE")
    ap.add_argument("--basin-profile", type=Path, help="BASIN's cliff profile, for the gateway and the simulation "
                    "alike (default: the scenario's, which `basin profile --scenario NAME` writes)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "real-trap")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the table and panels from OUT")
    ap.add_argument("--resim", action="store_true", help="run the simulation side of finished real runs again "
                    "(after the model or its profile changed); the real runs are kept")
    args = ap.parse_args(argv)

    if not args.report_only:
        scenario = _scenario(args.scenario, args.set)
        kinds = run_kinds(scenario, peak_growth(scenario) if "basin" in args.runs else 1.0)
        if args.basin_profile is None:
            args.basin_profile = scenario_profile_path(scenario["name"])
        if "basin" in args.runs and not args.basin_profile.is_file():
            raise SystemExit(f"real_trap: the basin run needs BASIN's cliff profile {args.basin_profile}; "
                             f"make it with `basin profile --scenario {args.scenario}`, or give --basin-profile FILE")
        spec = _manifest()
        block = int(spec["serve"]["block_size_tokens"])
        blocks = _pool_tokens(scenario["deployment"]) // block
        for name in args.runs:
            for seed in args.seeds:
                folder = args.out / name / f"seed{seed}"
                if (folder / "run.json").is_file():
                    if args.resim:
                        _say(f"{name} seed {seed}: simulation again, beside the real run kept")
                        shutil.rmtree(folder / "sim", ignore_errors=True)
                        sim_run(kinds[name], seed, args, folder)
                    else:
                        _say(f"{name} seed {seed}: done before, kept")
                    continue
                if args.resim:
                    continue
                _say(f"{name} seed {seed}: real run (about {scenario['duration_min']:g} min)")
                started = time.time()
                real_run(kinds[name], seed, args, spec, blocks, folder)
                _say(f"{name} seed {seed}: simulation")
                sim_run(kinds[name], seed, args, folder)
                record = {"run": name, "seed": seed, "policy": kinds[name].policy,
                          "sets": [*args.set, *kinds[name].sets], "params": list(kinds[name].params),
                          "kv_blocks": blocks,
                          "wall_s": round(time.time() - started, 1), "cpu": cpu_summary(folder / "cpu.csv")}
                (folder / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    write_report(args.out, table_rows(args.out, args.runs, args.seeds))
    draw_panels(args.out, args.runs, args.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
