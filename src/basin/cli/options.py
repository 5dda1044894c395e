"""Parsing of option values shared by several sub-commands."""

from __future__ import annotations

from collections.abc import Sequence

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


def refuse_scenario_shadowed(flags: Sequence[tuple[str, str, bool]]) -> None:
    """Flags a scenario itself sets, ``(flag, its --set key, given)``:
    the first one given is refused rather than silently ignored."""
    for flag, key, given in flags:
        if given:
            raise BasinInputError(f"{flag} does not apply beside --scenario, which sets it; "
                                  f"use --set {key}=VALUE instead")


def parse_jobs(jobs: int | None, flag: str = "--jobs") -> int | None:
    """Worker processes: a positive count, or -1 (as in joblib and make) or
    nothing for every core, which the pool reads as None."""
    if jobs is None or jobs == -1:
        return None
    if jobs < 1:
        raise BasinInputError(f"{flag} {jobs}: give a number of processes >= 1, or -1 for every core")
    return jobs
