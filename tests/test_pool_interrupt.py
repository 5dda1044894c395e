"""Ctrl-C on the shared process pool: the first stops starting runs and lets
the ones under way finish (kept), the second stops at once; no worker
survives, no traceback, exit 130. A terminal sends SIGINT to the whole
process group, so the subprocess tests signal the group as a terminal would."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from basin.experiments.pool import run_jobs

ROOT = Path(__file__).resolve().parents[1]


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _interrupt_after(delays_s: list[float]) -> threading.Thread:
    """SIGINT to this process after each delay (measured from the start)."""

    def send() -> None:
        start = time.monotonic()
        for delay in delays_s:
            time.sleep(max(0.0, start + delay - time.monotonic()))
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_first_interrupt_finishes_the_jobs_under_way_and_starts_no_other() -> None:
    kept: list[int] = []
    _interrupt_after([0.8])
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_jobs(_sleep, [0.2, 0.2, 2.0, 2.0, 0.1, 0.1], workers=2, on_result=lambda i, _: kept.append(i))
    assert sorted(kept) == [0, 1, 2, 3]  # the two under way at the interrupt finished; 4 and 5 never started
    assert time.monotonic() - start < 4.0
    assert multiprocessing.active_children() == []


def test_second_interrupt_stops_at_once() -> None:
    kept: list[int] = []
    _interrupt_after([0.8, 1.2])
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_jobs(_sleep, [0.2, 0.2, 30.0, 30.0], workers=2, on_result=lambda i, _: kept.append(i))
    assert sorted(kept) == [0, 1]
    assert time.monotonic() - start < 5.0
    assert multiprocessing.active_children() == []


def test_without_a_keeper_the_first_interrupt_stops_at_once() -> None:
    _interrupt_after([0.5])
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_jobs(_sleep, [30.0, 30.0], workers=2)
    assert time.monotonic() - start < 5.0
    assert multiprocessing.active_children() == []


# ------------------------------------------------------------ a real sweep, signalled as a terminal would

SWEEP = """\
name: interrupt
scenario: trap-1p1d
set:
  measure_end_min: 45
  surge.start_min: 5
  surge.end_min: 15
cases:
  short: {{duration_min: 60}}
  long: {{duration_min: {long_min}}}
axes:
  seed: [0, 1, 2]
systems: [hicache]
"""


def _stored(folder: Path) -> int:
    runs = folder / "runs"
    return sum(1 for d in runs.iterdir() if (d / "summary.json").is_file()) if runs.is_dir() else 0


def _session_processes(sid: int) -> list[int]:
    """Processes (still alive, not zombies) of the session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _sweep_interrupted(tmp_path: Path, long_min: int, second_after_s: float | None) -> tuple[int, str, int, int]:
    """Start `basin sweep --jobs 2` in its own session, SIGINT its group once
    the three short runs are stored (two long runs are then under way), and
    again after ``second_after_s``; returns (exit code, stderr, runs stored,
    processes of the session left)."""
    sweep = tmp_path / "interrupt.yaml"
    sweep.write_text(SWEEP.format(long_min=long_min), encoding="utf-8")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "basin", "sweep", str(sweep), "--out", str(out), "--jobs", "2",
                             "--no-plots"], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _stored(out) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stored(out) == 3, "the short runs did not finish"
        time.sleep(0.3)  # the long runs are under way
        os.killpg(proc.pid, signal.SIGINT)
        if second_after_s is not None:
            time.sleep(second_after_s)
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err, _stored(out), len(_session_processes(proc.pid))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the process table in /proc")
def test_sweep_interrupted_once_keeps_the_runs_under_way(tmp_path: Path) -> None:
    code, err, stored, left = _sweep_interrupted(tmp_path, long_min=900, second_after_s=None)
    assert code == 130, err
    assert stored == 5, err  # 3 short + the 2 long under way; the third long one never started
    assert left == 0
    assert "finishing the 2 under way" in err and "5 of 6 runs are in the store" in err
    assert "Traceback" not in err and "fatal" not in err


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the process table in /proc")
def test_sweep_interrupted_twice_stops_at_once_and_leaves_no_process(tmp_path: Path) -> None:
    start = time.monotonic()
    code, err, stored, left = _sweep_interrupted(tmp_path, long_min=100_000, second_after_s=0.5)
    assert code == 130, err
    assert stored == 3, err
    assert left == 0
    assert time.monotonic() - start < 60
    assert "Ctrl-C again to stop at once" in err and "3 of 6 runs are in the store" in err
    assert "Traceback" not in err and "fatal" not in err

