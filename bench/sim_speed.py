"""Simulator speed on its worst case: ``surge-1p3d`` under ``hicache`` (the
trapped engine holds hundreds of sessions), two simulated hours.

Reports simulated seconds per wall second, calls per second, events per
second and peak memory, each as the median of several runs, beside a
pure-Python reference event loop (an M/M/1 queue on ``heapq``) timed in the
same process so that machine noise shows up in both. Target: the two-hour
run in under 10 s on one core.

    .venv/bin/python -m bench.sim_speed [--repeats 3]
"""

from __future__ import annotations

import argparse
import heapq
import random
import resource
import statistics
import time


def reference_loop(n_events: int = 1_000_000, seed: int = 1) -> float:
    """Events per second of a bare heapq M/M/1 loop (the ceiling for any
    pure-Python discrete-event simulator on this machine)."""
    rng = random.Random(seed)
    exp = rng.expovariate
    heap: list[tuple[float, int, int]] = [(exp(0.9), 0, 0)]
    seq, queue, busy, done = 1, 0, False, 0
    start = time.perf_counter()
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
    return n_events / (time.perf_counter() - start)


def simulate_once(scenario: str) -> dict[str, float]:
    from basin.experiments.runner import run_scenario
    from basin.experiments.scenario import load_scenario

    sc = load_scenario(scenario)
    start = time.perf_counter()
    run = run_scenario(sc, "hicache")
    wall = time.perf_counter() - start
    calls = len(run.result.calls["session_uid"])
    return {
        "wall_s": wall,
        "sim_s_per_wall_s": sc.duration_min * 60.0 / wall,
        "calls_per_s": calls / wall,
        "events_per_s": run.result.events / wall,
        "calls": calls,
        "state": str(run.summary.state.value),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenario", default="surge-1p3d")
    args = parser.parse_args()
    simulate_once(args.scenario)  # warm-up: imports, workload synthesis caches
    runs, refs = [], []
    for _ in range(args.repeats):
        refs.append(reference_loop())
        runs.append(simulate_once(args.scenario))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "sim_s_per_wall_s", "calls_per_s",
                                                              "events_per_s")}
    ref = statistics.median(refs)
    print(f"scenario {args.scenario} under hicache, {args.repeats} runs (medians), state {runs[0]['state']}, "
          f"{runs[0]['calls']:.0f} calls")
    print(f"  wall time          {med['wall_s']:8.2f} s   (target < 10 s)")
    print(f"  simulated s/wall s {med['sim_s_per_wall_s']:8.0f}")
    print(f"  calls/s            {med['calls_per_s']:8.0f}")
    print(f"  events/s           {med['events_per_s']:8.0f}")
    print(f"  peak RSS           {peak_mb:8.0f} MB")
    print(f"  reference heapq loop {ref / 1e6:6.2f} M events/s; "
          f"simulator events/s = {med['events_per_s'] / ref:.3f} x reference")


if __name__ == "__main__":
    main()
