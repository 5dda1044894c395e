"""Running many independent simulations over the machine's cores: the one
process pool of basin-serve (profiles, classification ramps, critical rates,
comparisons and ablations all run their jobs here)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


def _context() -> multiprocessing.context.BaseContext:
    # fork where there is one: spawn would re-run an unguarded calling script
    # in every worker. The workers only simulate (no I/O, no locks shared).
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def run_jobs(fn: Callable[[Job], Result], jobs: Sequence[Job], workers: int | None = None,
             progress: Callable[[int, int], None] | None = None,
             on_result: Callable[[int, Result], None] | None = None) -> list[Result]:
    """``fn`` over ``jobs`` in worker processes (in this process when one
    worker suffices), results in completion order; ``progress(done, total)``
    after each, and ``on_result(index of the job, result)`` before it (in
    this process, e.g. to keep a result on disk as soon as it exists).
    ``fn`` must be a module-level function (it is pickled)."""
    results: list[Result] = []
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
    with ProcessPoolExecutor(max_workers=workers, mp_context=_context()) as pool:
        futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        for done, fut in enumerate(as_completed(futures), start=1):
            result = fut.result()
            results.append(result)
            if on_result is not None:
                on_result(futures[fut], result)
            if progress is not None:
                progress(done, len(jobs))
    return results
