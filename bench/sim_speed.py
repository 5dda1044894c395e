"""Simulator speed: calls per CPU second on the benchmark scenarios, and the
CPU time of a whole ``basin run`` process, each beside a bare heapq event loop
timed in the same run (so that a noisy or slower machine moves both).

Cases: ``surge-1p3d`` under hicache (a trapped engine holding hundreds of
sessions) and under basin, ``trap-1p1d`` under hicache (the trap on 1P1D
H100), and ``surge-1p3d`` on 2P6D under basin (two prefill instances behind
the cache-aware router). For each: the in-process run's calls per CPU second
(workload synthesis cached by a warm-up run), and the CPU time of a fresh
``basin run SCENARIO --system S --no-plots`` process (start-up, synthesis,
policy set-up, the run and its tables) as a multiple of the reference loop's
CPU time. Figures are medians of ``--repeats`` runs.

    .venv/bin/python -m bench.sim_speed [--repeats 3] [--case NAME ...] [--no-process]
"""

from __future__ import annotations

import argparse
import heapq
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

#: The reference: CPU seconds of this many events of a bare heapq loop.
REFERENCE_EVENTS = 1_000_000


@dataclass(frozen=True)
class Case:
    name: str
    scenario: str
    system: str
    overrides: tuple[str, ...] = ()


#: The base rates are fixed (the ones these cases have always run at: half of 18.5 and of
#: 39 sessions/min) so that a new cliff profile, which moves a scenario's base rate, does
#: not move the benchmark.
SURGE_1P3D_BASE = "arrivals.base_per_min=9.25"
CASES = (
    Case("surge-1p3d/hicache", "surge-1p3d", "hicache", (SURGE_1P3D_BASE,)),
    Case("surge-1p3d/basin", "surge-1p3d", "basin", (SURGE_1P3D_BASE,)),
    Case("trap-1p1d/hicache", "trap-1p1d", "hicache"),
    Case("surge-2p6d/basin", "surge-1p3d", "basin", ("deployment=2p6d-h200", "arrivals.base_per_min=19.5")),
)


def reference_loop(n_events: int = REFERENCE_EVENTS, seed: int = 1) -> float:
    """CPU seconds of a bare heapq M/M/1 loop of ``n_events`` events (the
    ceiling for any pure-Python discrete-event simulator on this machine)."""
    rng = random.Random(seed)
    exp = rng.expovariate
    heap: list[tuple[float, int, int]] = [(exp(0.9), 0, 0)]
    seq, queue, busy, done = 1, 0, False, 0
    start = time.process_time()
    while done < n_events:
        t, _, kind = heapq.heappop(heap)
        if kind == 0:
            heapq.heappush(heap, (t + exp(0.9), seq, 0))
            seq += 1
            if busy:
                queue += 1
            else:
                busy = True
                heapq.heappush(heap, (t + exp(1.0), seq, 1))
                seq += 1
        elif queue:
            queue -= 1
            heapq.heappush(heap, (t + exp(1.0), seq, 1))
            seq += 1
        else:
            busy = False
        done += 1
    return time.process_time() - start


def run_in_process(case: Case) -> dict[str, float]:
    from basin.experiments.runner import run_scenario
    from basin.experiments.scenario import load_scenario

    scenario = load_scenario(case.scenario, list(case.overrides))
    start = time.process_time()
    run = run_scenario(scenario, case.system)
    cpu_s = time.process_time() - start
    calls = len(run.result.calls["session_uid"])
    return {"cpu_s": cpu_s, "calls": calls, "calls_per_cpu_s": calls / cpu_s, "events": run.result.events,
            "state": run.summary.state.value}


def run_process(case: Case) -> float:
    """CPU seconds (user + system) of a whole ``basin run`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "basin.cli.app", "run", case.scenario, "--system", case.system,
               "--no-plots", "--out", out]
        for o in case.overrides:
            cmd += ["--set", o]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--case", action="append", choices=[c.name for c in CASES],
                        help="run only these cases (default: all)")
    parser.add_argument("--no-process", action="store_true", help="skip the whole-process timings")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.case or c.name in args.case]
    print(f"{'case':20} {'state':10} {'calls':>7} {'calls/CPU s':>12} {'x ref':>7} {'process CPU s':>14} "
          f"{'x ref':>7}")
    for case in cases:
        run_in_process(case)  # warm-up: imports and the synthesised workload's cache
        runs, procs, refs = [], [], []
        for _ in range(args.repeats):
            refs.append(reference_loop())
            runs.append(run_in_process(case))
            if not args.no_process:
                procs.append(run_process(case))
        ref = statistics.median(refs)
        cps = statistics.median(r["calls_per_cpu_s"] for r in runs)
        loop_x = statistics.median(r["cpu_s"] for r in runs) / ref
        proc = f"{statistics.median(procs):14.2f} {statistics.median(procs) / ref:7.2f}" if procs else ""
        print(f"{case.name:20} {runs[0]['state']:10} {runs[0]['calls']:7.0f} {cps:12.0f} {loop_x:7.2f} {proc}",
              flush=True)
    print(f"reference: {REFERENCE_EVENTS:,} events of a bare heapq loop, median {statistics.median(refs):.2f} CPU s "
          f"(last case); 'x ref' = CPU time / reference CPU time; {args.repeats} repeats, medians")


if __name__ == "__main__":
    main()
