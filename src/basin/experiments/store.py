"""The result store of ``basin sweep``: one folder per run, named by the hash
of everything the run's result depends on.

A run's folder holds its tables (Parquet, :mod:`basin.metrics.io`), its
``summary.json``, its ``provenance.json`` and ``config.json`` (what the hash
stands for). A folder is built under a temporary name and renamed into place
in one step, so a folder that exists under its key is complete: a sweep killed
mid-run leaves at most a temporary folder (removed by the next sweep when its
writer is gone), and two sweeps writing the same run both succeed, the second
finding the first's folder and dropping its own copy. Nothing is ever
overwritten, so a reader never sees a half-written run.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from basin.diskcache import make_key, source_digest
from basin.jsonvalues import json_value
from basin.metrics.io import SUMMARY_FILE, read_summary, write_run
from basin.metrics.summary import RunSummary
from basin.runtables import Table

#: The store's folder inside a sweep's output folder.
STORE_DIR = "runs"
CONFIG_FILE = "config.json"
PROVENANCE_FILE = "provenance.json"
_TMP_PREFIX = ".tmp-"

#: Packages whose sources decide a run's result: a change to any of them makes
#: every key new, so a stored run never outlives the code that computed it.
_RESULT_PACKAGES = ("sim", "policy", "workload", "metrics", "catalog", "predict")
_RESULT_MODULES = ("systems.py", "experiments/plan.py", "experiments/runner.py", "experiments/scenario.py")


@lru_cache(maxsize=1)
def code_digest() -> str:
    """Digest of the simulator's and every result-deciding module's sources."""
    root = Path(__file__).resolve().parents[1]
    paths = [p for pkg in _RESULT_PACKAGES for p in (root / pkg).rglob("*.py")]
    paths += [root / m for m in _RESULT_MODULES]
    # source_digest hashes names and bytes; relative paths keep two same-named files apart.
    return make_key(source_digest(paths), tuple(sorted(str(p.relative_to(root)) for p in paths)))


def run_key(config: Mapping[str, Any]) -> str:
    """The store key of a fully resolved run config (canonical JSON, hashed)."""
    return make_key(json.dumps(json_value(dict(config)), sort_keys=True, separators=(",", ":")))


class RunStore:
    """Runs by key under ``root`` (``DIR/runs``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key

    def has(self, key: str) -> bool:
        """A run is stored when its folder exists with its summary (a folder
        only ever appears whole, see the module's notes)."""
        return (self.path(key) / SUMMARY_FILE).is_file()

    def summary(self, key: str) -> RunSummary:
        return read_summary(self.path(key))

    def put(self, key: str, tables: tuple[Table, Table, Table], summary: RunSummary,
            config: Mapping[str, Any], provenance: Mapping[str, Any]) -> bool:
        """Store one run; False when another writer stored it first (its copy stays)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.has(key):
            return False
        tmp = self.root / f"{_TMP_PREFIX}{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            calls, sessions, timeseries = tables
            write_run(tmp, calls, sessions, timeseries, summary)
            for name, data in ((CONFIG_FILE, config), (PROVENANCE_FILE, provenance)):
                (tmp / name).write_text(json.dumps(json_value(dict(data)), indent=1, sort_keys=True) + "\n",
                                        encoding="utf-8")
            target = self.path(key)
            if target.exists() and not self.has(key):
                # A folder under the key without a summary was made by hand or by an older layout:
                # moved aside (never deleted unseen) so the run can be stored.
                os.replace(target, self.root / f".broken-{key}-{uuid.uuid4().hex[:8]}")
            try:
                os.replace(tmp, target)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and self.has(key):
                    return False  # a concurrent writer finished the same run first
                raise
            return True
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def clean_stale(self) -> list[str]:
        """Remove temporary folders whose writing process is gone (a killed
        sweep's); those of live writers on this machine are left alone."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for child in self.root.iterdir():
            if not (child.is_dir() and child.name.startswith(_TMP_PREFIX)):
                continue
            try:
                pid = int(child.name.rsplit("-", 2)[-2])
            except (ValueError, IndexError):
                continue
            if not _alive(pid):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child.name)
        return removed

    def keys(self) -> list[str]:
        """Every stored run's key."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if not p.name.startswith(".") and self.has(p.name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
