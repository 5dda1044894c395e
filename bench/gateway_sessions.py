"""The gateway's cost per call against the number of sessions it holds.

A gateway may hold tens of thousands of sessions that never sent an end
marker (they expire after ``idle_timeout_s``). This measures the gateway's own
work per call (the gate: arrival decision, forwarding, answer accounting) with
N such sessions resident, for N from 0 to 30,000, under a policy whose
decisions cost nothing per session (hicache) and under BASIN. No HTTP: the
request path around the gate does not depend on N, and leaving it out keeps
the figure free of the machine's network noise.

Each new session makes two calls (the second carries the end marker), so
every other call is an arrival. The figure is the median of ``--repeats``
runs of ``--calls`` calls, in microseconds of CPU per call.

    .venv/bin/python -m bench.gateway_sessions [--sizes 0,1000,10000,30000] [--calls 4000] [--repeats 3]

Writes results/bench/gateway_sessions.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from basin.gateway.config import GatewayConfig
from basin.gateway.gate import Gate
from basin.gateway.server import build_policy
from basin.gateway.usage import CallUsage

OUT = Path("results/bench/gateway_sessions.json")
POLICIES = ("hicache", "basin")


def _call(gate: Gate, sid: str, now: float, prompt: int, end: bool) -> None:
    sess = gate.open_call(sid, now, prompt, "fix the failing test", end=end)
    gate.forwarded(sess, prompt, now)
    gate.answering(sess, prompt)
    gate.done(sess, CallUsage(prompt, 64, prompt // 2), now)


def per_call_us(policy: str, resident: int, calls: int) -> float:
    """CPU microseconds per call with ``resident`` idle sessions in the table."""
    config = GatewayConfig(upstream="http://127.0.0.1:9", policy=policy, idle_timeout_s=604_800.0)
    # A cache large enough that admission never parks: the cost measured is the bookkeeping's.
    gate = Gate(build_policy(config), config, capacity_tokens=1 << 40)
    for i in range(resident):
        _call(gate, f"resident-{i}", i * 1e-3, 2_000, end=False)
    gate.tick(resident * 1e-3)
    now = resident * 1e-3 + 1.0
    started = time.process_time()
    for i in range(calls // 2):
        sid = f"new-{i}"
        _call(gate, sid, now, 1_000, end=False)
        _call(gate, sid, now + 1e-4, 1_200, end=True)
        now += 2e-4
    return (time.process_time() - started) / (calls // 2 * 2) * 1e6


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_sessions", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,1000,10000,30000")
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policy", action="append", choices=POLICIES)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, dict[str, float]] = {}
    print(f"{'policy':>8} " + " ".join(f"{n:>10,}" for n in sizes) + "   (us of CPU per call, by resident sessions)")
    for policy in args.policy or POLICIES:
        row = {str(n): statistics.median(per_call_us(policy, n, args.calls) for _ in range(args.repeats))
               for n in sizes}
        results[policy] = row
        print(f"{policy:>8} " + " ".join(f"{row[str(n)]:>10.1f}" for n in sizes), flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"sizes": sizes, "calls": args.calls, "repeats": args.repeats,
                               "us_per_call": results}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
