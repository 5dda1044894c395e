"""What the gateway's state store costs (docs/gateway.md, "Restarts").

Two figures, no HTTP (the request path around the gate does not change with
the store):

- the gate's work per call (open, forward, answer) with and without the
  store's journal, over ``--sessions`` sessions;
- per write, the event loop's time to build the records of the sessions
  changed since the last one, and the worker thread's time to commit them to
  a SQLite file, with the calls of ``--flush-s`` at ``--rate`` calls/s between
  two writes.

Medians of ``--repeats`` runs, in microseconds per call and milliseconds per write.

    .venv/bin/python -m bench.gateway_store [--calls 20000] [--sessions 64] [--rate 500] [--repeats 5]

Writes results/bench/gateway_store.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from basin.gateway.config import GatewayConfig
from basin.gateway.gate import Gate
from basin.gateway.persist import Journal
from basin.gateway.server import build_policy
from basin.gateway.store import SQLiteStore
from basin.gateway.usage import CallUsage

POLICIES = ("hicache", "basin")
OUT = Path("results/bench/gateway_store.json")


def _gate(policy: str) -> Gate:
    config = GatewayConfig(upstream="http://127.0.0.1:9", policy=policy)
    gate = Gate(build_policy(config), config, capacity_tokens=10**9)
    gate.control_step(0.0)
    return gate


def _calls(gate: Gate, n: int, sessions: int, start: int = 0) -> float:
    """Microseconds of wall time per call for ``n`` calls spread over ``sessions`` sessions."""
    began = time.perf_counter()
    for i in range(start, start + n):
        now = 1.0 + i * 0.002
        sess = gate.open_call(f"s{i % sessions}", now, 1_000 + i, None, end=False)
        gate.forwarded(sess, 1_000 + i, now)
        gate.done(sess, CallUsage(1_000 + i, 16, 900), now)
    return (time.perf_counter() - began) / n * 1e6


def measure(policy: str, calls: int, sessions: int, rate: float, flush_s: float, repeats: int) -> dict[str, float]:
    per_call: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(repeats):
        for mode in ("without", "with"):
            gate = _gate(policy)
            if mode == "with":
                Journal(gate)
            per_call[mode].append(_calls(gate, calls, sessions))
    between = max(int(rate * flush_s), 1)
    capture, write = [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "state.db")
        gate = _gate(policy)
        journal = Journal(gate)
        for k in range(10 * repeats):
            _calls(gate, between, sessions, start=k * between)
            t0 = time.perf_counter()
            batch = journal.capture(k * flush_s, time.time(), b"k" * 32)
            t1 = time.perf_counter()
            store.write(batch)
            capture.append((t1 - t0) * 1e3)
            write.append((time.perf_counter() - t1) * 1e3)
        store.close()
    return {"us_per_call_without_store": statistics.median(per_call["without"]),
            "us_per_call_with_store": statistics.median(per_call["with"]),
            "ms_per_write_on_event_loop": statistics.median(capture),
            "ms_per_write_in_thread": statistics.median(write),
            "sessions_changed_per_write": float(min(between, sessions))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--rate", type=float, default=500.0, help="calls/s between two writes")
    parser.add_argument("--flush-s", type=float, default=0.5, help="seconds between two writes (state_flush_s)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    results = {p: measure(p, args.calls, args.sessions, args.rate, args.flush_s, args.repeats) for p in POLICIES}
    for policy, r in results.items():
        print(f"{policy:8s} per call {r['us_per_call_without_store']:.2f} us without the store, "
              f"{r['us_per_call_with_store']:.2f} us with it; per write of {r['sessions_changed_per_write']:.0f} "
              f"sessions {r['ms_per_write_on_event_loop']:.3f} ms on the event loop, "
              f"{r['ms_per_write_in_thread']:.3f} ms in the thread")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)}, "results": results}, indent=2))


if __name__ == "__main__":
    main()
