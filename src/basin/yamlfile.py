"""Reading the project's YAML files with errors a user can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from basin.errors import BasinInputError

#: libyaml's parser when PyYAML was built with it (the same documents, several
#: times faster: profiles are read at every run's start).
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(stream: Any) -> Any:
    """``yaml.safe_load`` on the fastest safe loader available."""
    return yaml.load(stream, Loader=_Loader)


def load_yaml(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return safe_load(fh)
    except FileNotFoundError:
        raise BasinInputError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise BasinInputError(f"{path}: not valid YAML ({exc})") from None


def load_mapping(path: Path, kind: str, fields: str) -> dict[str, Any]:
    """A ``kind`` file (sweep, tuning, scenario, ...) whose top level must be a
    mapping of ``fields``: its data, or an error naming the file and what was
    expected."""
    if not path.is_file():
        raise BasinInputError(f"{path}: {kind} file not found")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise BasinInputError(f"{path}: expected a mapping of {fields} at the top level")
    return data


def validation_message(path: object, exc: ValidationError) -> str:
    """One readable line per problem: file, field path, what was expected."""
    lines = [f"{path}: invalid"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  field '{loc}': {err['msg']}{shown}")
    return "\n".join(lines)
