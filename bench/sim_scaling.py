"""Does a simulated call cost the same however long the run and however large
the deployment? CPU microseconds per call of steady runs (no surge) at half
the critical load, by simulated duration (1 to 4 hours on 1P3D H200) and by
deployment size (1P3D to 8P24D H200, the arrival rate and the workload scaled
with the instances), each the median of ``--repeats`` rounds after a warm-up (so that workload
synthesis, kept on disk, is not counted), with the largest over smallest ratio.

    .venv/bin/python -m bench.sim_scaling [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

#: Half-critical load of one 1P3D H200 unit, sessions/min: fixed (it is the rate these benchmarks
#: have always run at) so that a new cliff profile does not move the benchmark.
UNIT_RATE_PER_MIN = 9.25


def steady_overrides(deployment: str, units: int, duration_min: float) -> list[str]:
    """``surge-1p3d``'s overrides for a steady run of ``units`` 1P3D units at half the critical load."""
    return [f"deployment={deployment}", f"duration_min={duration_min}", f"measure_end_min={duration_min}",
            "surge.factor=1.0", f"arrivals.base_per_min={UNIT_RATE_PER_MIN * units}",
            f"workload.sessions={4000 * units}"]


def cost_per_call_us(deployment: str, units: int, duration_min: float) -> tuple[float, int]:
    from basin.experiments.runner import run_scenario
    from basin.experiments.scenario import load_scenario

    scenario = load_scenario("surge-1p3d", steady_overrides(deployment, units, duration_min))
    # Every case starts from a collected heap (not timed), so that none pays
    # for garbage an earlier one left: before a finished run was freed by
    # reference counting (Simulator.run), its state was cyclic garbage that
    # no collection reached while runs went on, and each later case ran up
    # to a third slower than in a fresh process.
    gc.collect()
    start = time.process_time()
    run = run_scenario(scenario, "hicache")
    cpu = time.process_time() - start
    calls = len(run.result.calls["session_uid"])
    return 1e6 * cpu / calls, calls


#: (label, deployment, units of 1P3D, simulated minutes).
CASES = (
    ("1P3D, 1 h", "1p3d-h200", 1, 60), ("1P3D, 2 h", "1p3d-h200", 1, 120), ("1P3D, 4 h", "1p3d-h200", 1, 240),
    ("2P6D, 1 h", "2P6D-h200", 2, 60), ("4P12D, 1 h", "4P12D-h200", 4, 60), ("8P24D, 1 h", "8P24D-h200", 8, 60),
)
BY_TIME = ("1P3D, 1 h", "1P3D, 2 h", "1P3D, 4 h")
BY_SIZE = ("1P3D, 1 h", "2P6D, 1 h", "4P12D, 1 h", "8P24D, 1 h")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for _, dep, units, _ in CASES:
        cost_per_call_us(dep, units, 10)  # warm-up: imports and this size's synthesised workload
    # Rounds of every case in turn, so that a slow spell of a shared machine
    # falls on all of them alike; each ratio is taken within a round.
    rounds: list[dict[str, float]] = []
    calls: dict[str, int] = {}
    for r in range(args.repeats):
        costs: dict[str, float] = {}
        for label, dep, units, minutes in CASES:
            costs[label], calls[label] = cost_per_call_us(dep, units, minutes)
        rounds.append(costs)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()) + " us/call", flush=True)
    medians = {label: statistics.median(c[label] for c in rounds) for label, *_ in CASES}
    for label, *_ in CASES:
        print(f"{label:12} {medians[label]:8.1f} us/call  ({calls[label]} calls)")

    def spread(labels: tuple[str, ...]) -> tuple[float, float]:
        """Largest over smallest of the cases' medians, and the median of the
        rounds' own largest over smallest: the second is raised by a slow
        spell of any one case in a round, the first only by a case slow in
        most rounds."""
        of_medians = max(medians[k] for k in labels) / min(medians[k] for k in labels)
        return of_medians, statistics.median(max(c[k] for k in labels) / min(c[k] for k in labels) for c in rounds)

    for name, labels in (("longest/shortest run", BY_TIME), ("largest/smallest deployment", BY_SIZE)):
        of_medians, of_rounds = spread(labels)
        print(f"{name}: {of_medians:.2f}x of the medians, {of_rounds:.2f}x the median of the rounds' ratios "
              "(flat = within 1.3x)")

if __name__ == "__main__":
    main()
