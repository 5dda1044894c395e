"""The optional compiled build of the hot modules, and when it is used.

``make accel`` compiles :data:`COMPILED_MODULES` with mypyc (``BASIN_COMPILE=1``
in ``setup.py``): the simulator's hot modules and the policy driver every
call of every run goes through. The compiled and the pure-Python modules give
bit-identical results (tests/sim/test_digests.py runs both).
``BASIN_PURE_PYTHON=1`` makes a process ignore the compiled modules, e.g. to
compare the two or to debug with pdb. Compiled modules whose sources changed
since the build are ignored too (with a warning), so an edit is never
shadowed by a stale build. ``basin/__init__`` decides this once per process,
before any of these modules can be imported.

Standard library only: ``setup.py`` loads this file on its own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

#: Modules compiled by ``make accel``. ``basin.sim``'s ``__init__`` and
#: ``invariants`` (whose exceptions subclass builtins) stay Python, and so
#: do the policies: a compiled class cannot subclass an interpreted one.
COMPILED_MODULES = tuple(f"basin.sim.{name}" for name in (
    "tournament", "events", "costs", "cache", "requests", "sessions", "lending", "prefill", "decode", "borrow",
    "router", "core", "cluster", "colocated", "recorder", "engine")) + ("basin.policy.driver",)

#: The digest of the compiled modules' sources, written at build time.
DIGEST_FILE = _PACKAGE / "compiled.sha256"


def source_path(module: str, package_dir: Path = _PACKAGE) -> Path:
    """The source file of ``module`` (a name in :data:`COMPILED_MODULES`)."""
    return package_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")


def source_digest(package_dir: Path = _PACKAGE) -> str:
    """SHA-256 of the sources of :data:`COMPILED_MODULES`."""
    h = hashlib.sha256()
    for name in COMPILED_MODULES:
        h.update(name.encode())
        h.update(source_path(name, package_dir).read_bytes())
    return h.hexdigest()


class _SourceOnly:
    """Finds the compiled modules by their ``.py`` files only."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name not in COMPILED_MODULES:
            return None
        return importlib.util.spec_from_file_location(name, source_path(name))


def _built() -> bool:
    return any(source_path(name).with_suffix(suffix).is_file()
               for name in COMPILED_MODULES for suffix in EXTENSION_SUFFIXES)


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
        warnings.warn("the compiled modules are older than their sources and are ignored; rebuild them with "
                      "`make accel`", stacklevel=3)
    return not current


def install() -> None:
    """Make this process import the sources where the build must not be used
    (``basin/__init__`` calls it, once, before any compiled module is imported)."""
    if _use_sources():
        sys.meta_path.insert(0, _SourceOnly())

