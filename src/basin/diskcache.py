"""Results kept on disk between processes, keyed by everything they depend on.

Expensive pure computations (synthesised workloads, ramp runs, fitted
predictors) are stored under ``$BASIN_CACHE_DIR`` (default
``$XDG_CACHE_HOME/basin-serve``, else ``~/.cache/basin-serve``), one folder a
kind. A key names the inputs *and* a digest of the sources that compute the
result, so a code change never serves a stale value. Writes go to a temporary
file and are renamed into place, so concurrent writers and interrupted runs
leave either a whole entry or none; an unreadable entry is recomputed.
``BASIN_NO_DISK_CACHE=1`` turns the cache off.
"""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def cache_root() -> Path:
    """The folder every disk cache of the project lives under."""
    root = os.environ.get("BASIN_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "basin-serve"


def cache_dir(kind: str) -> Path:
    """The folder of one kind of cached result (e.g. ``workloads``)."""
    return cache_root() / kind


def enabled() -> bool:
    return os.environ.get("BASIN_NO_DISK_CACHE", "") in ("", "0")


def source_digest(paths: Iterable[Path]) -> str:
    """Digest of files' names and bytes (the code a cached result depends on)."""
    h = hashlib.sha256()
    for path in sorted(paths):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def make_key(*parts: object) -> str:
    """A file-safe key from the ``repr`` of its parts (use plain data and
    frozen dataclasses, whose ``repr`` names every field)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


#: The last few results this process read or computed (a run asks for its
#: workload twice: for the sessions and for the predictor's training set);
#: bounded, so that a sweep over many seeds does not hold every workload.
_MEMO: OrderedDict[tuple[str, str], Any] = OrderedDict()
_MEMO_ENTRIES = 4


def _remember(kind: str, key: str, value: Any) -> None:
    _MEMO[(kind, key)] = value
    _MEMO.move_to_end((kind, key))
    while len(_MEMO) > _MEMO_ENTRIES:
        _MEMO.popitem(last=False)


def cached(kind: str, key: str, compute: Callable[[], T]) -> T:
    """The stored result of ``kind``/``key``, else ``compute()`` stored.

    Values are shared within a process: treat them as read-only. An
    unwritable cache costs a warning, never the result.
    """
    if not enabled():
        return compute()
    memo = _MEMO.get((kind, key))
    if memo is not None:
        _MEMO.move_to_end((kind, key))
        return memo
    path = cache_dir(kind) / f"{key}.pickle"
    value = _load(path)
    if value is not None:
        _remember(kind, key, value)
        return value
    value = compute()
    _remember(kind, key, value)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{key}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"could not keep a {kind} result in {path.parent}: {exc}", stacklevel=2)
    return value


def _load(path: Path) -> Any:
    if not path.is_file():
        return None
    # Unpickling a workload makes some 150,000 objects, none of them garbage;
    # the cyclic collector would walk them again and again while they arrive.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        return None  # torn or from an older layout: compute again
    finally:
        if collecting:
            gc.enable()
