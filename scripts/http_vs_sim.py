"""surge-1p3d over HTTP (replay -> gateway -> emulator) against the simulator, both policies.

For each seed and each policy (hicache, basin) this starts a fresh `basin emulate` and a fresh
`basin gateway`, runs `basin replay --scenario surge-1p3d` through them at --speed K, stops
both, and then runs `basin run` on the same scenario, overrides and seed. It writes a figure
(goodput; active sessions and hit rate per scenario minute; simulated vs over HTTP) and a JSON of
every number in it.

The gateway's policy runs on the wall clock, while the simulator's runs on scenario time. So the
script hands the gateway every time constant divided by K (and the one rate multiplied by K):
the basin policy's intervals, cooldown and horizons, and the gateway's scrape interval and
hit-rate window. Without that the policy would act K times more slowly than in the simulator. The
same goes for the one rate of the cliff profile, lambda_c (BASIN sheds while the arrival rate it
measures, per wall minute at the gateway, exceeds it): the gateway gets a copy of the profile with
lambda_c multiplied by K.

BASIN lends idle decode memory as prefix cache. No real SGLang or vLLM engine lets a client switch
that, but the emulator does (`POST /emulator/lending`, on the simulator's lending model, exporting
the lent memory as `basin_emulator_*` gauges), so the gateway runs basin with
`--lending-url EMULATOR/emulator/lending` and its lending default kept. The full simulated BASIN
is therefore the like-for-like reference for the HTTP path. For the budget to count lent memory
as the simulator does (C_eff = max(C_gpu + lent, C_host)), the gateway is given the GPU tier and
the host tier separately rather than their maximum as its cache. basin is also still simulated
with lending off (`policy_params.lending=false`, "sim, no lending") as a second reference, which
shows what lending is worth. One engine difference remains: the emulator reserves decode KV before
prefill (SGLang's order), while the simulated BASIN reserves it at prefill completion.

    .venv/bin/python scripts/http_vs_sim.py --speed 30 --seeds 0 1
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
BASIN = str(ROOT / ".venv" / "bin" / "basin")
SCENARIO = "surge-1p3d"
POLICIES = ("hicache", "basin")
PROFILE = ROOT / "profiles" / "basin" / "1p3d-h200.yaml"
# basin policy parameters in seconds (divided by K) and per second (multiplied by K).
SECONDS = {"interval_s": 30.0, "busy_interval_s": 5.0, "shed_horizon_s": 900.0, "cooldown_s": 120.0,
           "context_smoothing_s": 600.0, "plateau_smoothing_s": 600.0}
PER_SECOND = {"priority_rate_tokens_per_s": 30.0}


def _profile_tiers() -> tuple[int, int]:
    """The GPU and host cache tiers of 1p3d-h200 at host ratio 2 as the simulator counts them
    (C_eff = max(GPU + lent, host)), read from its cliff profile."""
    import yaml

    data = yaml.safe_load(PROFILE.read_text())
    return int(data["gpu_cache_tokens"]), int(data["host_cache_tokens"])


GPU_CACHE_TOKENS, HOST_CACHE_TOKENS = _profile_tiers()


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:2]} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def overrides(duration_min: float | None) -> list[str]:
    """The scenario as shipped (None), or cut to its first ``duration_min`` minutes, all measured."""
    if duration_min is None:
        return []
    return ["--set", f"duration_min={duration_min:g}", "--set", f"measure_end_min={duration_min:g}"]


def wall_clock_profile(path: Path, speed: float) -> Path:
    """PROFILE with its departure rates per wall minute (times ``speed``), written to ``path``."""
    import yaml

    data = yaml.safe_load(PROFILE.read_text())
    data["lambda_c_per_min"] *= speed
    data["lambda_c_per_repeat"] = [v * speed for v in data["lambda_c_per_repeat"]]
    for run in data.get("runs", []):
        run["lambda_c_per_min"] *= speed
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def gateway_config(path: Path, speed: float, predictor: str | None = None) -> None:
    scrape = max(0.5, 5.0 / speed)
    # A trapped run holds about a thousand sessions, each with a connection open: lift the gateway's
    # client-connection limit (1000 by default), which the simulated engine does not have.
    config: dict[str, object] = {"scrape_interval_s": scrape, "stale_after_s": 3 * scrape,
                                 "hit_window_s": max(1.0, 60.0 / speed), "max_connections": 4000,
                                 "host_cache_tokens": HOST_CACHE_TOKENS}
    if predictor:
        config["predictor"] = predictor
    path.write_text(json.dumps(config))  # JSON is YAML


def run_http(policy: str, seed: int, speed: float, duration_min: float | None, out: Path,
             eport: int, gport: int, predictor: str | None = None) -> dict:
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    eurl, gurl = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{gport}"
    cfg = logs / f"gateway-{policy}-s{seed}.yaml"
    gateway_config(cfg, speed, predictor if policy == "basin" else None)
    emu = subprocess.Popen([BASIN, "emulate", "--deployment", "1p3d-h200", "--host-ratio", "2",
                            "--speed", f"{speed:g}", "--listen", f"127.0.0.1:{eport}"],
                           stdout=open(logs / f"emulate-{policy}-s{seed}.log", "w"), stderr=subprocess.STDOUT)
    gw = None
    try:
        wait_up(f"{eurl}/health", emu)
        cmd = [BASIN, "gateway", "--engine", "sglang", "--upstream", eurl,
               "--metrics-url", f"{eurl}/metrics/prefill", "--decode-metrics-url", f"{eurl}/metrics/decode",
               "--policy", policy, "--listen", f"127.0.0.1:{gport}", "--config", str(cfg),
               # the GPU tier here, the host tier in the config: the budget counts both as the simulator's
               # does, max(GPU + lent, host) (4.36M while nothing is lent)
               "--cache-tokens", str(GPU_CACHE_TOKENS), "--log-level", "warning"]
        if policy == "basin":
            cmd += ["--lending-url", f"{eurl}/emulator/lending"]
            cmd += ["--profile", str(wall_clock_profile(logs / f"profile-x{speed:g}.yaml", speed))]
            cmd += [x for k, v in SECONDS.items() for x in ("--param", f"{k}={v / speed:g}")]
            cmd += [x for k, v in PER_SECOND.items() for x in ("--param", f"{k}={v * speed:g}")]
        gw = subprocess.Popen(cmd, stdout=open(logs / f"gateway-{policy}-s{seed}.log", "w"),
                              stderr=subprocess.STDOUT)
        wait_up(f"{gurl}/healthz", gw)
        t0 = time.monotonic()
        rep = subprocess.run([BASIN, "replay", "--scenario", SCENARIO, "--speed", f"{speed:g}",
                              *overrides(duration_min), "--seed", str(seed), "--target", gurl,
                              "--system", policy, "--out", str(out / f"http-s{seed}")],
                             stdout=open(logs / f"replay-{policy}-s{seed}.log", "w"), stderr=subprocess.STDOUT)
        print(f"  http {policy} seed {seed}: replay exit {rep.returncode} in {time.monotonic() - t0:.0f} s wall",
              flush=True)
    finally:
        if gw is not None:
            stop(gw)
        stop(emu)
    return load(out / f"http-s{seed}" / policy)


def _simulate(d: Path, systems: tuple[str, ...], seed: int, duration_min: float | None,
              extra: tuple[str, ...] = ()) -> dict[str, dict]:
    """`basin run` of the scenario for ``systems`` into ``d``, with ``extra`` arguments; their summaries."""
    subprocess.run([BASIN, "run", SCENARIO, *[x for p in systems for x in ("--system", p)], *extra,
                    *overrides(duration_min), "--seed", str(seed), "--no-plots", "--out", str(d)],
                   check=True, stdout=subprocess.DEVNULL)
    return {p: load(d / p) for p in systems}


def run_sim(seed: int, duration_min: float | None, out: Path) -> dict[str, dict]:
    return _simulate(out / f"sim-s{seed}", POLICIES, seed, duration_min)


def run_sim_no_lending(seed: int, duration_min: float | None, out: Path) -> dict:
    """basin simulated without decode memory lent as cache (the second reference: what lending is worth)."""
    return _simulate(out / f"sim-nolend-s{seed}", ("basin",), seed, duration_min,
                     ("--set", "policy_params.lending=false"))["basin"]


def load(d: Path) -> dict:
    s = json.loads((d / "summary.json").read_text())
    ts = pq.read_table(d / "timeseries.parquet").to_pydict()
    hit = [((cached + loaded) / prompt) if prompt else None
           for prompt, cached, loaded in zip(ts["prompt_tokens"], ts["cached_tokens"], ts["loaded_tokens"])]
    keep = ("goodput_per_h", "n_measured", "n_completed", "n_good", "n_shed", "state", "state_reason",
            "hit_rate_pre", "hit_rate_final", "ttft_p50_final_s", "active_sessions_final", "slowdown_p50")
    out = {k: s.get(k) for k in keep}
    out["series"] = {"minute": ts["minute"], "active_sessions": ts["active_sessions"], "hit_rate": hit}
    if (d / "replay.json").exists():
        r = json.loads((d / "replay.json").read_text())
        fields = ("complete", "interrupted", "lasted_s", "calls", "errors", "notes")
        out["replay"] = {k: r.get(k) for k in fields if k in r}
    return out


def figure(res: dict, seeds: list[int], speed: float, duration_min: float | None, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"hicache": "tab:red", "basin": "tab:blue"}
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.3))
    w = 0.38
    for i, p in enumerate(POLICIES):
        for j, side in enumerate(("sim", "http")):
            vals = [res[str(s)][side][p]["goodput_per_h"] for s in seeds]
            x = i + (j - 0.5) * w
            ax[0].bar(x, sum(vals) / len(vals), w, color=colors[p], alpha=1.0 if side == "sim" else 0.5,
                      hatch=None if side == "sim" else "//", edgecolor="black")
            ax[0].scatter([x] * len(vals), vals, color="black", s=12, zorder=3)
            st = ", ".join(sorted({res[str(s)][side][p]["state"] for s in seeds}))
            ax[0].text(x, max(vals) * 1.02, f"{side}\n{st}", ha="center", va="bottom", fontsize=8)
    if all("sim_no_lending" in res[str(s)] for s in seeds):
        vals = [res[str(s)]["sim_no_lending"]["basin"]["goodput_per_h"] for s in seeds]
        x = POLICIES.index("basin") + 1.5 * w
        ax[0].bar(x, sum(vals) / len(vals), w, color="white", edgecolor=colors["basin"], lw=2)
        ax[0].scatter([x] * len(vals), vals, color="black", s=12, zorder=3)
        st = ", ".join(sorted({res[str(s)]["sim_no_lending"]["basin"]["state"] for s in seeds}))
        ax[0].text(x, max(vals) * 1.02, f"sim, no\nlending\n{st}", ha="center", va="bottom", fontsize=8)
    ax[0].set_xticks(range(len(POLICIES)), POLICIES)
    ax[0].set_ylabel("goodput (good sessions / h)")
    ax[0].set_title("goodput: simulated (solid, open: no lending) vs HTTP (hatched)", fontsize=10)
    ax[0].margins(y=0.2)
    s0 = str(seeds[0])
    for p in POLICIES:
        for side, ls in (("sim", "-"), ("http", "--")):
            ser = res[s0][side][p]["series"]
            ax[1].plot(ser["minute"], ser["active_sessions"], ls, color=colors[p], label=f"{p} {side}")
            ax[2].plot(ser["minute"], ser["hit_rate"], ls, color=colors[p], label=f"{p} {side}")
    for a in ax[1:]:
        a.axvspan(15, 35, color="grey", alpha=0.12, lw=0)
        a.set_xlabel("scenario minute")
    ax[1].set_ylabel("active sessions")
    ax[1].set_title(f"active sessions (seed {s0}; surge shaded)")
    ax[2].set_ylabel("hit rate (GPU + host) per minute")
    ax[2].set_ylim(0, 1.02)
    ax[2].set_title(f"prefix hit rate (seed {s0})")
    ax[1].legend(fontsize=8)
    span = "as shipped" if duration_min is None else f"first {duration_min:g} min"
    fig.suptitle(f"surge-1p3d, {span}: basin run vs replay -> gateway -> emulator at "
                 f"{speed:g}x (seeds {', '.join(map(str, seeds))})", fontsize=11)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--duration-min", type=float, default=None,
                    help="cut the scenario to its first MIN minutes, all of them measured (default: the "
                    "scenario as shipped, 120 minutes with arrivals measured to minute 90)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "http-vs-sim")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "http-vs-sim.png")
    ap.add_argument("--emulator-port", type=int, default=30110)
    ap.add_argument("--gateway-port", type=int, default=8410)
    ap.add_argument("--plot-only", action="store_true", help="redraw from OUT/http-vs-sim.json")
    ap.add_argument("--predictor", default="ridge",
                    help="the gateway's BASIN predictor: ridge (default: the simulator's, fitted once with "
                    "`basin predict fit terminal-bench` into OUT), or any gateway spec such as growth:1.5 "
                    "(the gateway's own default) or ridge:FILE")
    a = ap.parse_args()
    jpath = a.out / "http-vs-sim.json"
    if a.plot_only:
        doc = json.loads(jpath.read_text())
        figure(doc["results"], doc["seeds"], doc["speed"], doc["duration_min"], a.png)
        return
    a.out.mkdir(parents=True, exist_ok=True)
    if a.predictor == "ridge":
        # The simulator's BASIN predicts peaks with a ridge fitted on the workload; give the gateway the same.
        model = a.out / "ridge-terminal-bench.pkl"
        if not model.exists():
            subprocess.run([BASIN, "predict", "fit", "terminal-bench", "--out", str(model)], check=True,
                           stdout=subprocess.DEVNULL)
        a.predictor = f"ridge:{model}"
    doc = json.loads(jpath.read_text()) if jpath.exists() else {"results": {}}
    if doc.get("speed", a.speed) != a.speed or doc.get("duration_min", a.duration_min) != a.duration_min:
        doc = {"results": {}}  # other settings: start over
    doc.update(speed=a.speed, duration_min=a.duration_min, scenario=SCENARIO, predictor=a.predictor,
               command=" ".join([sys.executable, *sys.argv]))
    for seed in a.seeds:
        r = doc["results"].setdefault(str(seed), {"sim": {}, "http": {}})
        print(f"seed {seed}: simulating", flush=True)
        r["sim"] = run_sim(seed, a.duration_min, a.out)
        r["sim_no_lending"] = {"basin": run_sim_no_lending(seed, a.duration_min, a.out)}
        for p in a.policies:
            r["http"][p] = run_http(p, seed, a.speed, a.duration_min, a.out, a.emulator_port, a.gateway_port,
                                    a.predictor)
            jpath.write_text(json.dumps(doc, indent=1))
        for p in POLICIES:
            if p in r["http"]:
                sg, hg = r["sim"][p]["goodput_per_h"], r["http"][p]["goodput_per_h"]
                print(f"  {p}: sim {sg:.0f}/h {r['sim'][p]['state']}, http {hg:.0f}/h {r['http'][p]['state']} "
                      f"({(hg - sg) / sg:+.1%})", flush=True)
                if p in r.get("sim_no_lending", {}):
                    ng = r["sim_no_lending"][p]["goodput_per_h"]
                    print(f"  {p}: sim without lending {ng:.0f}/h, http {(hg - ng) / ng:+.1%}", flush=True)
    doc["seeds"] = sorted(int(s) for s in doc["results"])
    jpath.write_text(json.dumps(doc, indent=1))
    if all(set(POLICIES) <= set(doc["results"][str(s)]["http"]) for s in doc["seeds"]):
        figure(doc["results"], doc["seeds"], a.speed, a.duration_min, a.png)
        print(f"wrote {a.png} and {jpath}")


if __name__ == "__main__":
    main()
