"""Parsing of option values shared by several sub-commands."""

from __future__ import annotations

from basin.errors import BasinInputError


def parse_seeds(text: str) -> tuple[int, ...]:
    """``--seeds 0,1,2`` as whole numbers, at least one."""
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise BasinInputError(f"--seeds '{text}': expected comma-separated whole numbers, e.g. 0,1,2") from None
    if not seeds:
        raise BasinInputError("--seeds: give at least one seed, e.g. --seeds 0,1,2")
    return seeds
