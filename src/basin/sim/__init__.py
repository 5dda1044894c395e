"""The discrete-event simulator of PD-disaggregated agent serving.

Its hot modules can be compiled with mypyc (``make accel``); the compiled and
the pure-Python modules give bit-identical results (tests/sim/test_digests.py
runs both). ``BASIN_PURE_PYTHON=1`` makes this process ignore the compiled
modules, e.g. to compare the two or to debug with pdb. Compiled modules whose
sources changed since the build are ignored too (with a warning), so an edit
is never shadowed by a stale build.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec, PathFinder
from pathlib import Path

_HERE = Path(__file__).resolve().parent

#: Modules compiled by ``make accel`` (``__init__`` and ``invariants``, whose
#: exceptions subclass builtins, stay Python); setup.py reads this list.
COMPILED_MODULES = ("events", "costs", "cache", "sessions", "prefill", "decode", "router", "lending", "borrow",
                    "recorder", "engine")

#: The digest of the compiled modules' sources, written at build time.
DIGEST_FILE = _HERE / "compiled.sha256"


def source_digest(directory: Path = _HERE) -> str:
    """SHA-256 of the sources of :data:`COMPILED_MODULES`."""
    h = hashlib.sha256()
    for name in COMPILED_MODULES:
        h.update(name.encode())
        h.update((directory / f"{name}.py").read_bytes())
    return h.hexdigest()


class _SourceOnly:
    """Finds ``basin.sim`` modules by their ``.py`` files only."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if not name.startswith(__name__ + "."):
            return None
        spec = PathFinder.find_spec(name, __path__)
        origin = spec.origin if spec is not None else None
        if origin is None or not any(origin.endswith(s) for s in EXTENSION_SUFFIXES):
            return spec
        source = Path(__path__[0]) / (name.rsplit(".", 1)[1] + ".py")
        return importlib.util.spec_from_file_location(name, source)


def _built() -> bool:
    return any((_HERE / f"cache{suffix}").is_file() for suffix in EXTENSION_SUFFIXES)


def _use_sources() -> bool:
    if os.environ.get("BASIN_PURE_PYTHON", "") not in ("", "0"):
        return True
    if not _built():
        return False
    try:
        current = DIGEST_FILE.read_text(encoding="utf-8").strip() == source_digest()
    except OSError:
        current = False
    if not current:
        warnings.warn("the compiled simulator is older than its sources and is ignored; rebuild it with "
                      "`make accel`", stacklevel=2)
    return not current


if __name__ == "basin.sim" and _use_sources():
    sys.meta_path.insert(0, _SourceOnly())


def compiled() -> bool:
    """Whether this process runs the compiled simulator."""
    from basin.sim import cache

    return not (cache.__file__ or "").endswith(".py")
