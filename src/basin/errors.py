"""Errors a user can act on.

Every error raised for bad input is a :class:`BasinInputError`: the CLI prints
its message (which names the file, the line or row, the field and the fix) and
exits with status 2 instead of showing a traceback.
"""

from __future__ import annotations


class BasinInputError(Exception):
    """Bad input from the user: a file, a flag, a scenario field."""


def where(path: object | None = None, line: int | None = None, row: int | None = None,
          field: str | None = None) -> str:
    """Render a location prefix such as ``calls.jsonl line 12, field 'prompt_tokens'``."""
    parts: list[str] = []
    if path is not None:
        parts.append(str(path))
    if line is not None:
        parts.append(f"line {line}")
    if row is not None:
        parts.append(f"row {row}")
    loc = " ".join(parts)
    if field is not None:
        loc = f"{loc}, field '{field}'" if loc else f"field '{field}'"
    return loc
