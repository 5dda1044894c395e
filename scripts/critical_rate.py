"""Profile a deployment's critical session rate: the highest steady base rate
(Poisson arrivals, no surge, 2 h, hicache alone) whose runs all end healthy.

    .venv/bin/python scripts/critical_rate.py 1p1d-h200 --low 4 --high 14 --step 0.5 --seeds 0 1 2

Rates are tried on a grid; the critical rate is the last grid rate before
the first one at which any seed ends other than healthy (so a lucky healthy
run above a failing rate does not count). Prints one line per rate.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor

from basin.experiments.runner import run_scenario
from basin.experiments.scenario import Scenario


def _one(args: tuple[str, float, float | None, int, str]) -> tuple[float, int, str, float, float]:
    deployment, rate, host_ratio, seed, workload = args
    sc = Scenario.model_validate({
        "name": f"steady-{deployment}-{rate}", "deployment": deployment, "host_ratio": host_ratio,
        "workload": {"name": workload, "sessions": 4000},
        "arrivals": {"base_per_min": rate, "warm_sessions": 0},
        "surge": {"factor": 1.0}, "duration_min": 120, "measure_end_min": 90, "policy": "hicache", "seed": seed,
    })
    s = run_scenario(sc).summary
    return rate, seed, s.state.value, s.hit_rate_final, s.ttft_p50_final_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("deployment")
    ap.add_argument("--low", type=float, required=True)
    ap.add_argument("--high", type=float, required=True)
    ap.add_argument("--step", type=float, default=0.5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--host-ratio", type=float, default=None)
    ap.add_argument("--workload", default="terminal-bench")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    n = int(round((a.high - a.low) / a.step)) + 1
    rates = [round(a.low + i * a.step, 3) for i in range(n)]
    jobs = [(a.deployment, r, a.host_ratio, s, a.workload) for r in rates for s in a.seeds]
    results: dict[float, list[tuple[int, str, float, float]]] = {r: [] for r in rates}
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        for rate, seed, state, hit, ttft in pool.map(_one, jobs):
            results[rate].append((seed, state, hit, ttft))
    critical = None
    failed = False
    for r in rates:
        runs = sorted(results[r])
        ok = all(state == "healthy" for _, state, _, _ in runs)
        print(f"{r:6.2f}/min  " + "  ".join(f"seed {s}: {st:10s} hit {h:.2f} ttft {t:6.2f}s"
                                            for s, st, h, t in runs))
        failed = failed or not ok
        if not failed:
            critical = r
    print(f"critical rate of {a.deployment}: {critical} sessions/min")


if __name__ == "__main__":
    main()
