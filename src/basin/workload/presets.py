"""The workload registry: every place that asks for a workload asks here.

A workload spec is either a preset name or a workload file path. Presets are
of three kinds:

* ``real``: the per-call agent tables shipped in ``data/derived``;
* ``synthetic``: generators fitted to the paper's figures (seeded, sized);
* ``trace``: Mooncake request traces with sessions rebuilt from prefixes.

Real tables and traces are immutable, so each is loaded once per process.
Callers must not mutate the returned workload's ``extra`` dict: it is shared.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from basin.errors import BasinInputError
from basin.workload.agent_tables import AGENT_TABLES, load_agent_table
from basin.workload.io import SESSION_START_KEY, WORKLOAD_SUFFIXES, read_workload, workload_suffix
from basin.workload.mooncake import MOONCAKE_TRACES, load_mooncake_workload
from basin.workload.records import Workload

#: Sessions of each real table and each rebuilt trace, so listing presets
#: loads nothing (the tests check them against the data).
_REAL_SESSIONS = {"swebench-deepseek": 192, "terminalbench-claude": 171}
_TRACE_SESSIONS = {"mooncake-conversation": 7386, "mooncake-synthetic": 2321}


@dataclass(frozen=True, slots=True)
class PresetInfo:
    """One named workload as ``basin workload list`` shows it."""

    name: str
    kind: str  # "real", "synthetic" or "trace"
    description: str
    #: Sessions the preset yields (a synthetic preset's default size).
    sessions: int


def list_presets() -> list[PresetInfo]:
    """All presets: real tables, then synthetic generators, then traces."""
    # Lazy: this import loads pydantic (48 modules); only this path uses it.
    from basin.workload.synthetic import SYNTHETIC_PRESETS

    presets = [PresetInfo(name, "real", AGENT_TABLES[name].description, n)
               for name, n in _REAL_SESSIONS.items()]
    presets += [PresetInfo(p.name, "synthetic", p.description, p.default_sessions)
                for p in SYNTHETIC_PRESETS.values()]
    presets += [PresetInfo(name, "trace", desc, _TRACE_SESSIONS[name])
                for name, (_, desc) in MOONCAKE_TRACES.items()]
    return presets


@functools.cache
def _fixed_workload(name: str) -> Workload:
    if name in _REAL_SESSIONS:
        return load_agent_table(name)
    return load_mooncake_workload(name)


def resolve_workload(spec: str, seed: int = 0, n_sessions: int | None = None) -> Workload:
    """The workload a preset name or file path stands for.

    A synthetic preset is generated with ``seed`` and ``n_sessions`` (None:
    its default size). For real tables, traces and files, ``n_sessions``
    draws that many distinct sessions with ``seed``, kept in their original
    order; None takes them all.
    """
    if spec in _REAL_SESSIONS or spec in MOONCAKE_TRACES:
        w = _fixed_workload(spec)
    elif workload_suffix(spec) is not None or Path(spec).exists():
        w = read_workload(spec)
    else:
        # Lazy: this import loads pydantic (48 modules); only this path uses it.
        from basin.workload.synthetic import SYNTHETIC_PRESETS, synthesize

        if spec not in SYNTHETIC_PRESETS:
            names = ", ".join(p.name for p in list_presets())
            raise BasinInputError(
                f"unknown workload '{spec}': not a preset ({names}) and not a workload file "
                f"({', '.join(WORKLOAD_SUFFIXES)})")
        return synthesize(spec, n_sessions=n_sessions, seed=seed)
    return w if n_sessions is None else sample_sessions(w, n_sessions, seed)


def sample_sessions(w: Workload, n_sessions: int, seed: int = 0) -> Workload:
    """``n_sessions`` distinct sessions of ``w`` drawn with ``seed``, in their original order."""
    if not 1 <= n_sessions <= len(w.sessions):
        raise BasinInputError(
            f"workload '{w.name}' has {len(w.sessions)} sessions; cannot take {n_sessions} "
            f"(ask for 1 to {len(w.sessions)})")
    keep = np.sort(np.random.default_rng(seed).choice(len(w.sessions), size=n_sessions, replace=False))
    sessions = tuple(w.sessions[i] for i in keep)
    extra = dict(w.extra)
    starts = extra.get(SESSION_START_KEY)
    if isinstance(starts, dict):
        extra[SESSION_START_KEY] = {s.session_id: starts[s.session_id] for s in sessions
                                    if s.session_id in starts}
    return replace(w, sessions=sessions, extra=extra)


def small_trace_warning(w: Workload, draws: int) -> str | None:
    """Why replaying ``draws`` sessions from ``w`` misleads, or None if it does not.

    A run draws sessions in shuffled passes, every session once before any
    twice; a small trace asked for many sessions replays the same few
    conversations over and over, so the cache sees far more exact repeats
    than real traffic would. Past two passes that is worth saying.
    """
    n = len(w.sessions)
    if draws <= n:
        return None
    return (f"workload '{w.name}' has only {n} sessions; {draws} sessions would replay each about "
            f"{draws / n:.1f} times, so results reflect these few conversations repeated (use a larger "
            f"log or trace, or fewer sessions)")


def warn_if_reused(w: Workload, draws: int) -> None:
    """Emit :func:`small_trace_warning` as a ``UserWarning`` when ``draws`` sessions outrun ``w`` twice over."""
    if draws > 2 * len(w.sessions):
        message = small_trace_warning(w, draws)
        if message:
            warnings.warn(message, UserWarning, stacklevel=2)
