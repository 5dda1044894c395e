"""Instructions per call of the compiled event loop, counted by callgrind.

Instruction counts are deterministic (the same process counted twice
differs by well under 1%), so they compare two builds on a busy machine
where CPU times do not. Each case runs twice in one process under
``valgrind --tool=callgrind``, counting only inside ``EventLoop.run``
(the compiled symbol); the first run warms the process (imports, first
uses, the synthesised workload on disk) and is left out, the second is
reported: its loop instructions, its calls, and their ratio.

    .venv/bin/python -m bench.loop_instructions [--case NAME ...] [--src DIR] [--keep DIR]

``--src`` counts another checkout's build (its ``src`` folder, compiled
with ``make accel`` or ``BASIN_COMPILE=1 python setup.py build_ext
--inplace``) with this interpreter, e.g. the code before a change.
``--keep`` keeps the callgrind files for ``callgrind_annotate``.
Needs Debian's ``valgrind``; a case takes one to several minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.sim_scaling import steady_overrides
from bench.sim_speed import CASES as SPEED_CASES
from bench.sim_speed import Case

#: The compiled event loop (mypyc's name for ``basin.sim.events.EventLoop.run``).
LOOP_SYMBOL = "CPyDef_events___EventLoop___run"


#: The surge cases are bench.sim_speed's; ``1p3d-10min`` is bench.sim_scaling's
#: ``cost_per_call_us("1p3d-h200", 1, 10)``; the colocated cases are the trap
#: scaled to the real vLLM (one colocated server).
CASES = (
    Case("1p3d-10min", "surge-1p3d", "hicache", tuple(steady_overrides("1p3d-h200", 1, 10))),
    *(c for c in SPEED_CASES if c.name in ("surge-1p3d/hicache", "surge-1p3d/basin")),
    Case("real-trap-vllm/hicache", "real-trap-vllm", "hicache"),
    Case("real-trap-vllm/continuum", "real-trap-vllm", "continuum"),
)

#: Run in the counted process: the case twice, then each run's calls (JSON).
_CHILD = """
import json, sys
import basin.sim
from basin.experiments.runner import run_scenario
from basin.experiments.scenario import load_scenario
scenario, system, overrides = json.loads(sys.argv[1])
assert basin.sim.compiled(), "the compiled simulator is not in use (make accel)"
calls = []
for _ in range(2):
    run = run_scenario(load_scenario(scenario, overrides), system)
    calls.append(len(run.result.calls["session_uid"]))
print(json.dumps(calls))
"""


def _part_instructions(path: Path) -> int:
    """The instructions a callgrind dump counted (its ``summary:`` or ``totals:`` line)."""
    m = re.search(r"^(?:summary|totals): (\d+)", path.read_text(encoding="utf-8", errors="replace"), re.M)
    if m is None:
        raise SystemExit(f"loop_instructions: no instruction total in {path}")
    return int(m.group(1))


def count(case: Case, src: Path | None, out_dir: Path) -> dict[str, float]:
    """Loop instructions and calls of the case's second run in one process."""
    # A fixed string hash: dictionary and attribute-cache lookups then probe
    # the same slots in every process (with random hashes a count moves by
    # a few tenths of a percent from process to process).
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    if src is not None:
        env["PYTHONPATH"] = str(src)
    stem = out_dir / re.sub(r"[^A-Za-z0-9]+", "-", case.name)
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={stem}.out", "--collect-atstart=no",
           f"--toggle-collect={LOOP_SYMBOL}", f"--dump-after={LOOP_SYMBOL}",
           sys.executable, "-c", _CHILD, json.dumps([case.scenario, case.system, list(case.overrides)])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"loop_instructions: {case.name} failed:\n{done.stderr[-2000:]}")
    calls = json.loads(done.stdout.strip().splitlines()[-1])
    parts = sorted(out_dir.glob(f"{stem.name}.out.*"), key=lambda p: int(p.suffix[1:]))
    if len(parts) != 2:
        raise SystemExit(f"loop_instructions: {case.name}: expected two loop dumps, found {len(parts)}")
    instructions = _part_instructions(parts[1])
    return {"instructions": instructions, "calls": calls[1], "per_call": instructions / calls[1]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=[c.name for c in CASES],
                        help="count only these cases (default: all)")
    parser.add_argument("--src", type=Path, help="another checkout's src folder to count instead of this one")
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this folder")
    args = parser.parse_args(argv)
    if args.src is not None and not (args.src / "basin" / "sim" / "events.py").is_file():
        parser.error(f"--src {args.src} holds no basin/sim/events.py: give a checkout's src folder")
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed: install Debian's valgrind to count instructions")
    cases = [c for c in CASES if not args.case or c.name in args.case]
    print(f"{'case':24} {'calls':>7} {'loop instructions':>18} {'per call':>9}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep if args.keep is not None else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        for case in cases:
            r = count(case, args.src, out_dir)
            print(f"{case.name:24} {r['calls']:7.0f} {r['instructions']:18,.0f} {r['per_call']:9.1f}", flush=True)


if __name__ == "__main__":
    main()
