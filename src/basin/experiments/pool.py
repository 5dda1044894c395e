"""Running many independent simulations over the machine's cores: the one
process pool of basin-serve (profiles, classification ramps, critical rates,
comparisons, ablations and sweeps all run their jobs here).

Ctrl-C: a terminal sends SIGINT to the whole process group, workers included.
Workers ignore it (an interrupt inside the compiled simulator can abort a
worker, and a worker that dies leaves the pool waiting), and the parent
decides: on the first Ctrl-C no further job starts and the jobs under way
finish, so a caller that keeps results as they arrive (``on_result``, the
sweep's store) keeps them; a second Ctrl-C kills the workers at once. Either
way ``KeyboardInterrupt`` reaches the caller after every worker is gone.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

if TYPE_CHECKING:
    import multiprocessing.context
    from concurrent.futures import Future, ProcessPoolExecutor

Job = TypeVar("Job")
Result = TypeVar("Result")


def _context() -> multiprocessing.context.BaseContext:
    # fork where there is one: spawn would re-run an unguarded calling script
    # in every worker. The workers only simulate (no I/O, no locks shared).
    # Imported here, as the executor is: a single run's progress lines come
    # from this module too, and need neither.
    import multiprocessing

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def _ignore_interrupts() -> None:
    """Worker initializer: SIGINT is the parent's to handle (see the module's notes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_jobs(fn: Callable[[Job], Result], jobs: Sequence[Job], workers: int | None = None,
             progress: Callable[[int, int], None] | None = None,
             on_result: Callable[[int, Result], None] | None = None,
             stream: TextIO | None = None, ordered: bool = False) -> list[Result]:
    """``fn`` over ``jobs`` in worker processes (in this process when one
    worker suffices), results in completion order (``ordered``: in the
    jobs' order); ``progress(done, total)``
    after each, and ``on_result(index of the job, result)`` before it (in
    this process, e.g. to keep a result on disk as soon as it exists).
    ``fn`` must be a module-level function (it is pickled).

    On Ctrl-C, with ``on_result`` given, the jobs under way finish (and are
    handed to it) unless a second Ctrl-C comes; without it nothing would be
    kept, so the workers stop at once. What the pool does is said on
    ``stream`` (default stderr); then ``KeyboardInterrupt`` is raised."""
    results: list[Result] = []
    indices: list[int] = []  # the job each result is of
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        for done, job in enumerate(jobs, start=1):
            result = fn(job)
            results.append(result)
            if on_result is not None:
                on_result(done - 1, result)
            if progress is not None:
                progress(done, len(jobs))
        return results
    # Lazy: concurrent.futures takes about 11 ms to import; only this path uses it.
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    def finish(fut: Future[Result], index: int) -> None:
        result = fut.result()
        results.append(result)
        indices.append(index)
        if on_result is not None:
            on_result(index, result)
        if progress is not None:
            progress(len(results), len(jobs))

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_context(), initializer=_ignore_interrupts)
    running: dict[Future[Result], int] = {}
    queued = iter(enumerate(jobs))
    try:
        # At most one job per worker is submitted, so that after a Ctrl-C no
        # job the pool had already queued starts.
        for index, job in queued:
            running[pool.submit(fn, job)] = index
            if len(running) < workers:
                continue
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                finish(fut, running.pop(fut))
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                finish(fut, running.pop(fut))
    except KeyboardInterrupt:
        out = stream if stream is not None else sys.stderr
        if on_result is not None and running:
            print(f"interrupted: starting no further run; finishing the {len(running)} under way "
                  "(Ctrl-C again to stop at once)", file=out, flush=True)
            try:
                while running:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        finish(fut, running.pop(fut))
            except KeyboardInterrupt:
                pass
        elif running:
            print(f"interrupted: stopping the {len(running)} runs under way", file=out, flush=True)
        _stop(pool)
        raise
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    return _in_job_order(indices, results) if ordered else results


def _in_job_order(indices: Sequence[int], results: Sequence[Result]) -> list[Result]:
    return [r for _, r in sorted(zip(indices, results), key=lambda pair: pair[0])]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's workers and wait until they are gone (no orphan is left).
    Python 3.11's pool has no public way to reach them (3.14 adds one)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=10.0)
    pool.shutdown(wait=True, cancel_futures=True)


class JobProgress:
    """Progress of a batch of runs on stderr: a bar with an ETA on a terminal,
    plain ``label: done/total`` lines otherwise (logs and CI keep them; a bar's
    redraws would be noise there). Use as ``with JobProgress(...) as tick:``
    and call ``tick(done, total)`` after each run."""

    #: Plain lines are written at most this often (the last one always).
    LINE_INTERVAL_S = 2.0

    def __init__(self, label: str, total: int, stream: TextIO | None = None,
                 terminal: bool | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self._start = time.monotonic()
        self._last_line = -math.inf
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Callable[[int, int], None]:
        self._start = time.monotonic()
        if self.terminal and self.total > 0:
            # Lazy: rich's progress bar takes 20-30 ms to import; only this path uses it.
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=Console(file=self.stream))
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self.tick

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def tick(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)
            return
        now = time.monotonic()
        if done < total and now - self._last_line < self.LINE_INTERVAL_S:
            return
        self._last_line = now
        elapsed = now - self._start
        eta = elapsed / done * (total - done) if done else math.nan
        print(f"{self.label}: {done}/{total} runs ({100 * done / max(total, 1):.0f}%), "
              f"{_clock(elapsed)} elapsed" + ("" if done >= total or math.isnan(eta) else f", ETA {_clock(eta)}"),
              file=self.stream, flush=True)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
