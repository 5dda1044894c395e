"""Output paths checked before anything runs.

A command that writes into ``--out`` used to find out it could not only
after the whole simulation had run (a file where a folder was needed, a
folder without write permission): a traceback and the work lost. These
checks walk the path as the writer would and refuse it at once, in one line
naming the flag and the fix (exit 2, as for any bad input).
"""

from __future__ import annotations

import os
from pathlib import Path

from basin.errors import BasinInputError


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a file or a folder)."""
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    return probe


def _check_creatable_folder(folder: Path, flag: str, given: Path) -> None:
    """``folder`` is a folder one can write into, or can be made one
    (``given`` is the flag's value, for the message)."""
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        what = "is a file" if existing == given else f"needs the folder {existing}, which is a file"
        raise BasinInputError(f"{flag} {given}: {what}, not a folder; choose another {flag} "
                              "(or move the file away)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BasinInputError(f"{flag} {given}: the folder {existing} is not writable; choose a folder you "
                              "can write to")


def check_out_dir(path: Path | None, flag: str = "--out") -> None:
    """Refuse ``path`` as an output folder unless it is, or can become, a
    writable folder (nothing is created)."""
    if path is not None:
        _check_creatable_folder(Path(path), flag, Path(path))


def check_out_file(path: Path | None, flag: str = "--out") -> None:
    """Refuse ``path`` as an output file when it is a folder, an existing file
    one cannot overwrite, or its folder cannot be made or written."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise BasinInputError(f"{flag} {path}: is a folder; give a file name inside it")
    if path.exists() and not os.access(path, os.W_OK):
        raise BasinInputError(f"{flag} {path}: the file exists and is not writable; give another file")
    _check_creatable_folder(path.parent, flag, path)
