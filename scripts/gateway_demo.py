"""The README's gateway demo in one command: the trap under HiCache and
BASIN's escape over HTTP.

For each policy (hicache, then basin) it starts a fresh ``basin emulate``
(the scenario's deployment at ``--speed``), a ``basin gateway`` with
``deploy/demo/gateway-POLICY-xSPEED.yaml`` and runs ``basin replay
--scenario`` through them, then stops both; last, ``basin report`` on the
output folder. It prints each run's state, goodput and active sessions at
the end.

The gateway runs on the wall clock while the emulator runs ``--speed`` times
faster, so the configs scale the gateway's clocks (scrape interval, hit-rate
window) and BASIN's time constants by the speed, and BASIN's cliff profile
gives its critical rate per wall minute. ``--write-configs`` (re)writes them
from the shipped profile and BASIN's defaults.

    .venv/bin/python scripts/gateway_demo.py [--seed 0] [--speed 30] [--out results/gateway-demo]
    .venv/bin/python scripts/gateway_demo.py --write-configs --speed 30
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from http_vs_sim import stop, wait_up  # the same start and stop of servers (run from scripts/)

ROOT = Path(__file__).resolve().parents[1]
BASIN = str(ROOT / ".venv" / "bin" / "basin")
DEMO_DIR = ROOT / "deploy" / "demo"
SCENARIO = "trap-1p1d"
DEPLOYMENT = "1p1d-h100"
HOST_RATIO = 0.0
PROFILE = ROOT / "profiles" / "basin" / "1p1d-h100.yaml"
POLICIES = ("hicache", "basin")
#: BASIN's parameters in seconds (divided by the speed) and per second (multiplied by it): its defaults.
SECONDS = {"interval_s": 30.0, "busy_interval_s": 5.0, "shed_horizon_s": 900.0, "cooldown_s": 120.0,
           "context_smoothing_s": 600.0, "plateau_smoothing_s": 600.0}
PER_SECOND = {"priority_rate_tokens_per_s": 30.0}


def profile_path(speed: float) -> Path:
    return DEMO_DIR / f"{PROFILE.stem}-x{speed:g}.yaml"


def config_path(policy: str, speed: float) -> Path:
    return DEMO_DIR / f"gateway-{policy}-x{speed:g}.yaml"


def write_configs(speed: float) -> list[Path]:
    """The scaled cliff profile and one gateway config per policy."""
    import yaml

    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load(PROFILE.read_text(encoding="utf-8"))
    data["lambda_c_per_min"] = round(data["lambda_c_per_min"] * speed, 6)
    data["lambda_c_per_repeat"] = [round(v * speed, 6) for v in data["lambda_c_per_repeat"]]
    for run in data.get("runs", []):
        run["lambda_c_per_min"] = round(run["lambda_c_per_min"] * speed, 6)
    written = [profile_path(speed)]
    written[0].write_text(f"# {PROFILE.relative_to(ROOT)} with its critical rates per wall minute at --speed "
                          f"{speed:g}\n# (written by scripts/gateway_demo.py --write-configs)\n"
                          + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    gpu_tokens = int(data["gpu_cache_tokens"])
    scrape = max(0.5, 5.0 / speed)
    for policy in POLICIES:
        config: dict[str, object] = {
            "upstream": "http://127.0.0.1:30000", "engine": "sglang",
            "metrics_urls": ["http://127.0.0.1:30000/metrics/prefill"],
            "decode_metrics_urls": ["http://127.0.0.1:30000/metrics/decode"],
            "policy": policy, "cache_tokens": gpu_tokens,
            "scrape_interval_s": scrape, "stale_after_s": 3 * scrape, "hit_window_s": max(1.0, 60.0 / speed),
        }
        if policy == "basin":
            config["lending_url"] = "http://127.0.0.1:30000/emulator/lending"
            config["profile"] = str(profile_path(speed).relative_to(ROOT))
            config["policy_params"] = {**{k: round(v / speed, 6) for k, v in SECONDS.items()},
                                       **{k: round(v * speed, 6) for k, v in PER_SECOND.items()}}
        path = config_path(policy, speed)
        path.write_text(
            f"# basin gateway running {policy} in front of `basin emulate --deployment {DEPLOYMENT} --host-ratio "
            f"{HOST_RATIO:g} --speed {speed:g}`\n# on 127.0.0.1:30000 (README, Gateway). The gateway runs on the "
            f"wall clock, the emulator {speed:g}x\n# faster: scrapes, the hit-rate window"
            + (" and BASIN's time constants are divided by the speed, its\n# one rate multiplied, and its cliff "
               "profile's critical rate is per wall minute." if policy == "basin" else " are divided by the speed.")
            + "\n# Written by scripts/gateway_demo.py --write-configs.\n"
            + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        written.append(path)
    return written


def run_policy(policy: str, args: argparse.Namespace) -> dict[str, object]:
    """One policy over HTTP: its run's summary, and the wall time of the replay."""
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    eurl, gurl = f"http://127.0.0.1:{args.emulator_port}", f"http://127.0.0.1:{args.gateway_port}"
    with open(logs / f"emulate-{policy}.log", "wb") as elog, open(logs / f"gateway-{policy}.log", "wb") as glog:
        emu = subprocess.Popen([BASIN, "emulate", "--deployment", DEPLOYMENT, "--host-ratio", f"{HOST_RATIO:g}",
                                "--speed", f"{args.speed:g}", "--listen", f"127.0.0.1:{args.emulator_port}"],
                               stdout=elog, stderr=subprocess.STDOUT, cwd=ROOT)
        gw = None
        try:
            wait_up(f"{eurl}/health", emu)
            ports = ["--upstream", eurl, "--metrics-url", f"{eurl}/metrics/prefill", "--decode-metrics-url",
                     f"{eurl}/metrics/decode", "--listen", f"127.0.0.1:{args.gateway_port}"]
            if policy == "basin":
                ports += ["--lending-url", f"{eurl}/emulator/lending"]
            gw = subprocess.Popen([BASIN, "gateway", "--config", str(config_path(policy, args.speed)), *ports,
                                   "--log-level", "warning"], stdout=glog, stderr=subprocess.STDOUT, cwd=ROOT)
            wait_up(f"{gurl}/healthz", gw)
            start = time.monotonic()
            with open(logs / f"replay-{policy}.log", "wb") as rlog:
                subprocess.run([BASIN, "replay", "--scenario", SCENARIO, "--speed", f"{args.speed:g}", "--seed",
                                str(args.seed), "--target", gurl, "--system", policy, "--out", str(args.out)],
                               stdout=rlog, stderr=subprocess.STDOUT, cwd=ROOT, check=True)
            wall_s = time.monotonic() - start
        finally:
            if gw is not None:
                stop(gw)
            stop(emu)
    summary = json.loads((args.out / policy / "summary.json").read_text(encoding="utf-8"))
    return {"policy": policy, "seed": args.seed, "speed": args.speed, "wall_s": round(wall_s, 1),
            **{k: summary.get(k) for k in ("state", "state_reason", "goodput_per_h", "active_sessions_final",
                                           "hit_rate_final", "completed_fraction")}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gateway-demo")
    parser.add_argument("--emulator-port", type=int, default=30000)
    parser.add_argument("--gateway-port", type=int, default=8400)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--write-configs", action="store_true", help="Write deploy/demo's files for --speed and stop.")
    args = parser.parse_args(argv)
    if args.write_configs:
        for path in write_configs(args.speed):
            print(path.relative_to(ROOT))
        return
    missing = [p for p in (config_path(p, args.speed) for p in args.policies) if not p.is_file()]
    if missing:
        sys.exit(f"no {missing[0].relative_to(ROOT)}: write it with --write-configs --speed {args.speed:g}")
    results = []
    for policy in args.policies:
        result = run_policy(policy, args)
        results.append(result)
        print(json.dumps(result), flush=True)
    subprocess.run([BASIN, "report", str(args.out)], check=True, cwd=ROOT)
    (args.out / "gateway-demo.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
