"""A calibrated profile against fresh calls to the engine it was measured on.

    .venv/bin/python scripts/calibrate_check.py --engine http://127.0.0.1:8100 \
        --engine-kind vllm --profile my-vllm.yaml [--json]

Sends new calls (fresh random text, not the calibration's): single calls of
several prompt lengths, one at a time, and a batch of concurrent calls. The
same calls, with the token counts the engine reported and the arrival offsets
the client saw, are then run through the simulator's engine
(``basin.emulate.engine.EmulatedEngine``, the simulator's own instances) on
the calibrated profile. Printed per case: the measured median latency (time
to first token and to the last token, wall clock), the simulated one, and
their relative difference. docs/calibrate.md quotes its output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from basin.calibrate.client import CallSample, EngineClient
from basin.calibrate.engines import EXTRA_BODY, KINDS
from basin.calibrate.text import TextMaker
from basin.catalog import load_deployment, load_hardware
from basin.emulate.calls import ChatCall
from basin.emulate.engine import EmulatedEngine


@dataclass
class Case:
    name: str
    measured: list[CallSample]
    simulated: list[tuple[float, float]]  # (ttft_s, latency_s)

    def row(self) -> dict[str, float | str | int]:
        m_ttft = float(np.median([s.ttft_s for s in self.measured]))
        m_lat = float(np.median([s.latency_s for s in self.measured]))
        s_ttft = float(np.median([t for t, _ in self.simulated]))
        s_lat = float(np.median([t for _, t in self.simulated]))
        return {"case": self.name, "calls": len(self.measured),
                "prompt_tokens": int(np.median([s.prompt_tokens for s in self.measured])),
                "output_tokens": int(np.median([s.output_tokens for s in self.measured])),
                "measured_ttft_s": m_ttft, "simulated_ttft_s": s_ttft,
                "measured_latency_s": m_lat, "simulated_latency_s": s_lat,
                "latency_error": s_lat / m_lat - 1.0}


def simulate(profile: str, calls: list[tuple[float, int, int]]) -> list[tuple[float, float]]:
    """(ttft, latency) of calls ``(arrival_s, prompt_tokens, output_tokens)`` on a fresh engine of ``profile``."""
    dep = load_deployment(profile)
    engine = EmulatedEngine(load_hardware(dep.hardware), dep)
    handles = []
    for i, (arrival, prompt, output) in enumerate(sorted(calls)):
        call = ChatCall(key=((0x5EED0000 + i, prompt),), prompt_tokens=prompt, output_tokens=output, limited=True,
                        priority=0, stream=False, include_usage=False, model=None, affinity=f"check-{i}",
                        digest=i)
        handles.append(engine.submit(call, 0.0, arrival))
    while any(not h.finished for h in handles):
        due = engine.next_due_s
        if due is None:
            raise RuntimeError("the simulated engine stopped with calls unfinished")
        engine.advance(due)
    return [(h.ttft_s, h.latency_s) for h in handles]


async def measure(url: str, kind: str, model: str | None, text: TextMaker, singles: list[int], batch: int,
                  batch_prompt: int, output: int, repeats: int) -> dict[str, list[list[CallSample]]]:
    out: dict[str, list[list[CallSample]]] = {}
    async with EngineClient(url, model, EXTRA_BODY[kind]) as client:
        for _ in range(repeats):
            for n in singles:
                words = max(1, round((n - text.overhead_tokens) / text.tokens_per_word))
                sample = await client.chat([{"role": "user", "content": text.words(words)}], output)
                out.setdefault(f"single {n}", []).append([sample])
        words = max(1, round((batch_prompt - text.overhead_tokens) / text.tokens_per_word))
        for _ in range(repeats):
            group = await asyncio.gather(*(client.chat([{"role": "user", "content": text.words(words)}], output)
                                           for _ in range(batch)))
            out.setdefault(f"batch of {batch} x {batch_prompt}", []).append(list(group))
    return out


def check(url: str, kind: str, profile: str, singles: list[int], batch: int, batch_prompt: int, output: int,
          repeats: int, seed: int | None = None) -> list[dict[str, float | str | int]]:
    import yaml

    from basin.catalog.files import named_file

    data = yaml.safe_load(named_file("deployments", profile).read_text(encoding="utf-8"))
    tok = data["calibration"]["tokenizer"]
    # Fresh text on every run (a repeated run must not hit the last one's prompts in the cache).
    text = TextMaker(seed if seed is not None else time.time_ns())
    text.tokens_per_word, text.overhead_tokens = float(tok["tokens_per_word"]), int(tok["template_tokens"])
    model = data["calibration"]["engine"].get("model")
    groups = asyncio.run(measure(url, kind, model, text, singles, batch, batch_prompt, output, repeats))
    rows = []
    for name, runs in groups.items():
        measured: list[CallSample] = []
        simulated: list[tuple[float, float]] = []
        for group in runs:
            t0 = min(s.start_s for s in group)
            simulated += simulate(profile, [(s.start_s - t0, s.prompt_tokens, s.output_tokens) for s in group])
            measured += sorted(group, key=lambda s: s.start_s)
        rows.append(Case(name, measured, simulated).row())
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", required=True)
    p.add_argument("--engine-kind", default="generic", choices=KINDS)
    p.add_argument("--profile", required=True, help="the calibrated profile (path or name)")
    p.add_argument("--single", default="128,1024,4096", help="prompt lengths of the single calls (tokens)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batch-prompt", type=int, default=512)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    started = time.monotonic()
    rows = check(a.engine, a.engine_kind, a.profile, [int(x) for x in a.single.split(",")], a.batch,
                 a.batch_prompt, a.output, a.repeats)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'case':<22} {'prompt':>7} {'out':>4} {'TTFT meas':>10} {'TTFT sim':>9} {'lat meas':>9} "
              f"{'lat sim':>8} {'error':>7}")
        for r in rows:
            print(f"{r['case']:<22} {r['prompt_tokens']:>7} {r['output_tokens']:>4} {r['measured_ttft_s']:>10.3f} "
                  f"{r['simulated_ttft_s']:>9.3f} {r['measured_latency_s']:>9.3f} {r['simulated_latency_s']:>8.3f} "
                  f"{r['latency_error']:>+7.1%}")
        print(f"({time.monotonic() - started:.0f} s)")
    worst = max(abs(float(r["latency_error"])) for r in rows)
    return 0 if math.isfinite(worst) else 1


if __name__ == "__main__":
    sys.exit(main())
