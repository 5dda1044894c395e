"""Running many independent simulations over the machine's cores."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Sequence, TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


def run_jobs(fn: Callable[[Job], Result], jobs: Sequence[Job], workers: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> list[Result]:
    """``fn`` over ``jobs`` in worker processes (in this process when one
    worker suffices), results in completion order; ``progress(done, total)``
    after each. ``fn`` must be a module-level function (it is pickled)."""
    results: list[Result] = []
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        for done, job in enumerate(jobs, start=1):
            results.append(fn(job))
            if progress is not None:
                progress(done, len(jobs))
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, job) for job in jobs]
        for done, fut in enumerate(as_completed(futures), start=1):
            results.append(fut.result())
            if progress is not None:
                progress(done, len(jobs))
    return results
