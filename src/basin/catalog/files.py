"""Where catalogue entries live: ``profiles/<kind>/<name>.yaml``, a path, or
(for calibrated profiles, which are both a hardware profile and a deployment)
``<user profile folder>/<name>.yaml``."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR


def close_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Known names a mistyped ``name`` may have meant: those it begins (``h100``
    for ``h100-nvl``), then the closest spellings; for "did you mean" hints."""
    known = list(known)
    lowered = name.lower()
    starts = [k for k in known if k.lower().startswith(lowered) or lowered.startswith(k.lower())]
    similar = difflib.get_close_matches(lowered, [k.lower() for k in known], n=n, cutoff=0.6)
    by_lower = {k.lower(): k for k in known}
    out = list(dict.fromkeys(starts + [by_lower[s] for s in similar]))
    return [k for k in out if k != name][:n]


def unknown_name_message(kind: str, name: str, known: list[str], also: str = "or a path to a YAML file") -> str:
    """``unknown <kind> '<name>': did you mean ...? use one of ...``."""
    close = close_names(name, known)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return f"unknown {kind} '{name}': {hint}use one of {', '.join(known) or '(none shipped)'} {also}".rstrip()


def user_profile_names() -> list[str]:
    """Names of the calibrated profiles in the user profile folder."""
    # Lazy: basin.catalog.calibrated imports this module (an import circle).
    from basin.catalog.calibrated import user_profile_dir

    folder = user_profile_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def named_file(kind: str, name_or_path: str) -> Path:
    """The YAML file of a catalogue entry (``kind`` is a folder of
    ``profiles/``: hardware, deployments), by name or path; a name not shipped
    is looked up in the user profile folder (calibrated profiles)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = PROFILE_DIR / kind / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    entry = kind.removesuffix("s")  # "deployments" -> "deployment"; "hardware" stays
    if path.suffix in (".yaml", ".yml"):
        raise BasinInputError(f"{path}: {entry} file not found")
    if path.name == name_or_path and name_or_path:
        # Lazy: basin.catalog.calibrated imports this module (an import circle).
        from basin.catalog.calibrated import user_profile_dir

        mine = user_profile_dir() / f"{name_or_path}.yaml"
        if mine.is_file():
            return mine
    known = sorted(p.stem for p in (PROFILE_DIR / kind).glob("*.yaml")) + user_profile_names()
    raise BasinInputError(unknown_name_message(entry, name_or_path, known))
