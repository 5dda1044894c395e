"""Where a sweep's runs execute: the local process pool (the default) or Ray.

Both call the same module-level function on the same jobs and hand each
result back to the calling process as it arrives (``on_result``), which keeps
it in the result store; so the table a sweep writes does not depend on the
executor. Ray is an optional extra (``pip install 'basin-serve[ray]'``); with
no ``address`` a local Ray instance is started on ``workers`` CPUs and shut
down afterwards.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from basin.errors import BasinInputError
from basin.experiments.pool import run_jobs

Job = TypeVar("Job")
Result = TypeVar("Result")

ExecutorName = Literal["local", "ray"]
EXECUTORS: tuple[str, ...] = ("local", "ray")
#: CPUs a locally started Ray instance gets when ``--jobs`` is not given
#: (small: the machine is usually shared, and Ray's own processes need room).
RAY_LOCAL_CPUS = 2


def check_executor(name: str, address: str | None) -> None:
    """Refuse an unknown executor, an address without Ray, or Ray not installed,
    before anything runs."""
    if name not in EXECUTORS:
        raise BasinInputError(f"--executor '{name}': use one of {', '.join(EXECUTORS)}")
    if address is not None and name != "ray":
        raise BasinInputError(f"--address {address}: only the Ray executor connects to a cluster; "
                              "add --executor ray, or drop --address")
    if name == "ray":
        _ray()
        if address is not None:
            _check_reachable(address)


def _ray() -> Any:
    try:
        # Lazy: ray takes about 0.23 s to import; only this path uses it.
        import ray
    except ImportError:
        raise BasinInputError("--executor ray needs Ray, which is not installed: pip install 'basin-serve[ray]' "
                              "(the 'ray' extra), or use --executor local") from None
    return ray


def execute(fn: Callable[[Job], Result], jobs: Sequence[Job], on_result: Callable[[int, Result], None] | None = None,
            *, executor: str = "local", workers: int | None = None, address: str | None = None,
            progress: Callable[[int, int], None] | None = None) -> list[Result]:
    """``fn`` over ``jobs`` on the chosen executor, results in the jobs'
    order; ``on_result(index, result)`` in this process as each finishes,
    then ``progress(done, total)``."""
    check_executor(executor, address)
    if not jobs:
        return []
    if executor == "local":
        return run_jobs(fn, jobs, workers, progress, on_result, ordered=True)
    results: dict[int, Result] = {}

    def keep(index: int, result: Result) -> None:
        results[index] = result
        if on_result is not None:
            on_result(index, result)

    _run_ray(fn, jobs, keep, workers, address, progress)
    return [results[i] for i in range(len(jobs))]


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse at once a cluster address nothing answers on (Ray itself retries
    for minutes before giving up)."""
    if address in ("auto", "local"):
        return  # Ray finds these itself and fails fast when there is none
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise BasinInputError(f"--address {address}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise BasinInputError(f"--address {address}: nothing answers there ({exc.strerror or exc}); start the "
                              "cluster with `ray start --head`, or leave out --address for a local one") from None


def _run_ray(fn: Callable[[Job], Result], jobs: Sequence[Job], on_result: Callable[[int, Result], None],
             workers: int | None, address: str | None, progress: Callable[[int, int], None] | None) -> None:
    ray = _ray()
    started = False
    if not ray.is_initialized():
        options: dict[str, Any] = {"include_dashboard": False, "logging_level": "WARNING",
                                   "configure_logging": True}
        try:
            if address is not None:
                ray.init(address=address, **options)
            else:
                cpus = workers or min(RAY_LOCAL_CPUS, os.cpu_count() or 1)
                ray.init(num_cpus=cpus, **options)
        except ConnectionError as exc:
            raise BasinInputError(f"--address {address}: no Ray cluster answered ({exc}); start one with "
                                  "`ray start --head` or leave out --address for a local one") from None
        started = True
    try:
        task = ray.remote(num_cpus=1)(fn)
        # With an address, --jobs caps the runs in flight (the cluster has its own size).
        limit = workers if (address is not None and workers) else len(jobs)
        pending: dict[Any, int] = {}
        queued = list(enumerate(jobs))
        done = 0
        while queued or pending:
            while queued and len(pending) < limit:
                index, job = queued.pop(0)
                pending[task.remote(job)] = index
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                index = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    raise exc.as_instanceof_cause() from None  # the run's own error, not Ray's wrapper
                on_result(index, result)
                done += 1
                if progress is not None:
                    progress(done, len(jobs))
    finally:
        if started:
            ray.shutdown()
