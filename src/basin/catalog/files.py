"""Where catalogue entries live: ``profiles/<kind>/<name>.yaml``, or a path."""

from __future__ import annotations

from pathlib import Path

from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR


def named_file(kind: str, name_or_path: str) -> Path:
    """The YAML file of a catalogue entry (``kind`` is a folder of
    ``profiles/``: hardware, deployments), by name or path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = PROFILE_DIR / kind / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in (PROFILE_DIR / kind).glob("*.yaml"))
    raise BasinInputError(
        f"unknown {kind[:-1]} '{name_or_path}': use one of {', '.join(known)} or a path to a YAML file"
    )
