"""Reading a workload file: the columnar JSONL reader and the disk cache of
checked records, each beside the line-by-line reader (the reader before
both) timed in the same run.

The file is the terminal-bench preset synthesised to ``--sessions`` sessions
(1,530 by default: 50,425 calls, 8.5 MB of JSONL), written as ``.jsonl`` and
``.jsonl.gz``. For each it reports CPU seconds (medians of ``--repeats``) of:

* ``lines``: the line reader (``json.loads`` per session and every record
  built through its checking constructor);
* ``columns``: the columnar reader (Arrow's JSON reader, the checks over whole
  columns, records built without per-record checks), what a first read costs;
* ``cached``: ``read_workload`` finding the file's records in the disk cache
  (the file hashed, the records unpickled), what every later read costs, in
  a sweep's or compare's every run.

Every reader's records are checked to be identical first.

    .venv/bin/python -m bench.workload_read [--sessions 1530] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _cpu_s(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1530)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        # A cache of our own: the benchmark neither reads nor fills the user's.
        os.environ["BASIN_CACHE_DIR"] = str(Path(tmp) / "cache")
        from basin import diskcache
        from basin.workload import io
        from basin.workload.presets import resolve_workload

        w = resolve_workload("terminal-bench", seed=0, n_sessions=args.sessions)
        print(f"workload: terminal-bench, {len(w.sessions):,} sessions, {w.n_calls:,} calls")
        for suffix in (".jsonl", ".jsonl.gz"):
            path = Path(tmp) / f"bench{suffix}"
            io.write_workload(w, path)
            lines = io._read_jsonl_lines(path)
            columns = io._read_jsonl_columnar(path)
            cached = io.read_workload(path)  # fills the cache
            diskcache._MEMO.clear()
            assert columns is not None, "the columnar reader left the file to the line reader"
            for other in (columns, io.read_workload(path)):
                assert other == lines and other.extra == lines.extra, "records differ"
            assert cached == lines

            def from_cache(path: Path = path) -> None:
                diskcache._MEMO.clear()  # a new process has no in-memory copy
                io.read_workload(path)

            line_s = _cpu_s(lambda path=path: io._read_jsonl_lines(path), args.repeats)
            column_s = _cpu_s(lambda path=path: io._read_jsonl_columnar(path), args.repeats)
            cached_s = _cpu_s(from_cache, args.repeats)
            size_mb = path.stat().st_size / 1e6
            print(f"{suffix:10s} {size_mb:5.1f} MB  lines {line_s * 1e3:6.1f} ms  "
                  f"columns {column_s * 1e3:6.1f} ms ({line_s / column_s:.1f}x)  "
                  f"cached {cached_s * 1e3:6.1f} ms ({line_s / cached_s:.1f}x)")


if __name__ == "__main__":
    main()
