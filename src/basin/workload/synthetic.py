"""Synthetic presets: real trajectories rescaled to the paper's workloads.

The paper's traces (216 Terminal-Bench trajectories, 70 SWE-bench Pro
sessions) are not public; only their summary figures are. A preset therefore
resamples *real* sessions from a shipped agent table and rescales them with
parameters fitted offline (``scripts/fit_presets.py``) so that the summary
statistics match the paper. Shapes are never invented: call sequences, the
per-call growth of the context, outputs and tool-gap sequences all come from
real trajectories; only their scale (and spread, through two exponents) is
fitted. ``presets_data/README.md`` explains the method and the choices.

One synthetic session is built from one real *trajectory* (its token
sequence and task text) and, optionally, the tool-gap sequence of a session
of another table:

* calls: ``m = round(calls_scale * n ** calls_exponent)`` (within 1..n) of
  the trajectory's ``n`` calls are kept, evenly spaced and always including
  the first and the last; the tokens of the skipped calls (their new
  suffixes and outputs) join the next kept call's new suffix, so the context
  grows exactly as in the trajectory, in fewer, larger steps;
* context: every new suffix after call 0 is multiplied by
  ``context_scale * (size / size_reference_tokens) ** size_exponent``, where
  size is the trajectory's largest prompt (a monotone stretch, so session
  sizes keep their order and their relation to the task text);
* call 0 keeps the trajectory's first prompt (system prompt plus task) and
  adds ``first_call_extra_tokens`` of per-session context;
* outputs are multiplied by ``output_scale``;
* tool gaps: the gap table session's sequence is stretched or compressed in
  order to ``m - 1`` gaps (:func:`resample_gaps`), then mapped by
  ``gap -> tool_gap_scale * gap ** tool_gap_exponent``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from basin import diskcache
from basin.errors import BasinInputError, where
from basin.workload.agent_tables import AGENT_TABLES, load_agent_table, table_files
from basin.workload.records import Call, Session, Workload
from basin.workload.stats import workload_stats
from basin.yamlfile import safe_load

#: Where the fitted preset files live (one YAML file per preset).
PRESETS_DATA_DIR = Path(__file__).resolve().parent / "presets_data"


@dataclass(frozen=True, slots=True)
class PresetTargets:
    """Summary statistics of a workload as the paper reports them; None where
    the paper gives no figure. Defined as in :mod:`basin.workload.stats`
    (peak context = largest prompt of a session)."""

    prompt_p50_tokens: float
    prompt_p90_tokens: float | None
    reuse_fraction: float | None
    output_p50_tokens: float | None
    tool_gap_p50_s: float
    tool_gap_mean_s: float | None
    peak_context_p50_tokens: float
    calls_per_session_mean: float | None


@dataclass(frozen=True, slots=True)
class SynthesisParams:
    """Fitted parameters of a preset (see the module docstring for the formulas)."""

    #: Agent table whose trajectories are resampled (token sequences, task texts).
    trajectory_table: str
    #: Agent table whose tool-gap sequences are resampled; None: each
    #: trajectory's own gaps.
    gap_table: str | None
    calls_scale: float
    calls_exponent: float
    context_scale: float
    size_exponent: float
    size_reference_tokens: float
    first_call_extra_tokens: int
    output_scale: float
    tool_gap_scale: float
    tool_gap_exponent: float
    #: Leading call-0 tokens common to every session (the agent's system
    #: prompt and task template), cached once per preset.
    shared_prefix_tokens: int


@dataclass(frozen=True, slots=True)
class SyntheticPreset:
    """A named synthetic workload: its targets and the parameters fitted to them."""

    name: str
    description: str
    default_sessions: int
    targets: PresetTargets
    params: SynthesisParams


# --------------------------------------------------------------------------
# Building sessions


def kept_call_count(n_calls: int, params: SynthesisParams) -> int:
    """How many of a trajectory's ``n_calls`` calls a synthetic session keeps
    (at least two when there are two, so the first and last call survive)."""
    wanted = round(params.calls_scale * n_calls ** params.calls_exponent)
    return min(n_calls, max(2, wanted))


def resample_gaps(gaps_s: Sequence[float], n_gaps: int) -> np.ndarray:
    """A real gap sequence stretched or compressed, in order, to ``n_gaps`` gaps.

    Gap ``j`` takes the source gap at the same relative position, so a
    session whose long builds come late keeps them late, and the share of
    long gaps in a session is kept.
    """
    if n_gaps == 0:
        return np.zeros(0)
    source = np.asarray(gaps_s, dtype=float)
    if source.size == 0:
        raise ValueError("a gap source needs at least one gap")
    return source[(np.arange(n_gaps) * source.size) // n_gaps]


def rescale_trajectory(trajectory: Session, params: SynthesisParams, gaps_s: Sequence[float],
                       session_id: str, prefix_group: str | None = None, source: str = "") -> Session:
    """One synthetic session from a real trajectory and a raw gap sequence.

    ``gaps_s`` (unscaled gaps of the gap source) are resampled to the kept
    calls and mapped here. Prompts are rebuilt cumulatively (previous prompt
    plus previous output plus the scaled new suffix), so every call reuses its
    whole predecessor, as the agents in the tables do.
    """
    real = trajectory.calls
    n_kept = kept_call_count(len(real), params)
    kept = sorted({round(j * (len(real) - 1) / (n_kept - 1)) for j in range(n_kept)}) if n_kept > 1 else [0]
    size = max(c.prompt_tokens for c in real)
    growth = params.context_scale * (size / params.size_reference_tokens) ** params.size_exponent
    gaps = params.tool_gap_scale * np.power(resample_gaps(gaps_s, n_kept - 1), params.tool_gap_exponent)

    calls: list[Call] = []
    context = 0  # prompt plus output of the previous kept call
    for j, k in enumerate(kept):
        if j == 0:
            new = real[0].prompt_tokens + params.first_call_extra_tokens
        else:
            skipped = range(kept[j - 1] + 1, k)
            appended = real[k].new_tokens + sum(real[i].new_tokens + real[i].output_tokens for i in skipped)
            new = round(growth * appended)
        prompt = context + new
        output = real[k].output_tokens
        output = max(1, round(params.output_scale * output)) if output else 0
        gap = float(gaps[j]) if j < n_kept - 1 else 0.0
        calls.append(Call(prompt_tokens=prompt, new_tokens=new, output_tokens=output, tool_gap_s=gap))
        context = prompt + output
    return Session(session_id=session_id, calls=tuple(calls), task_text=trajectory.task_text,
                   shared_prefix_tokens=min(params.shared_prefix_tokens, calls[0].prompt_tokens),
                   prefix_group=prefix_group,
                   source=source or f"{params.trajectory_table} {trajectory.session_id}")


@functools.cache
def _table(name: str) -> Workload:
    return load_agent_table(name)


def _cycled_order(rng: np.random.Generator, population: int, n: int) -> np.ndarray:
    """``n`` indices: shuffled passes over the population, so every item is
    used once before any is used twice; a longer draw extends a shorter one."""
    passes = [rng.permutation(population) for _ in range(-(-n // population))]
    return np.concatenate(passes)[:n]


def synthesize(name: str, n_sessions: int | None = None, seed: int = 0) -> Workload:
    """Generate ``n_sessions`` (default: the preset's) sessions of preset ``name``.

    Deterministic by ``seed`` (see :func:`synthesize_preset`).
    """
    preset = SYNTHETIC_PRESETS.get(name)
    if preset is None:
        raise BasinInputError(
            f"unknown synthetic preset '{name}'; choose one of {', '.join(SYNTHETIC_PRESETS)}")
    return synthesize_preset(preset, n_sessions, seed)


def synthesize_preset(preset: SyntheticPreset, n_sessions: int | None = None, seed: int = 0) -> Workload:
    """Generate sessions of a preset object (a registered one or one just fitted).

    Trajectories and gap sources come from two independent streams of
    ``seed``, each a sequence of shuffled passes over its table, so the first
    k sessions of a larger draw equal a draw of k sessions.
    """
    name = preset.name
    n = preset.default_sessions if n_sessions is None else n_sessions
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BasinInputError(f"preset '{name}': n_sessions must be a whole number >= 1, got {n!r}")
    # Kept on disk: synthesis is a sixth of a short run, and sweeps repeat it.
    key = diskcache.make_key("synthesize", preset, n, seed, _inputs_digest(preset.params))
    return diskcache.cached("workloads", key, lambda: _synthesize(preset, n, seed))


@functools.cache
def _inputs_digest(p: SynthesisParams) -> str:
    """Digest of what a synthesis reads besides its arguments: the workload
    code and the tables it draws from."""
    files = list(Path(__file__).parent.glob("*.py"))
    for table in (p.trajectory_table, p.gap_table):
        if table is not None:
            files += [f for f in table_files(table) if f is not None]
    return diskcache.source_digest(files)


def _synthesize(preset: SyntheticPreset, n: int, seed: int) -> Workload:
    name = preset.name
    p = preset.params
    trajectories = _table(p.trajectory_table).sessions
    trajectory_stream, gap_stream = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    trajectory_order = _cycled_order(trajectory_stream, len(trajectories), n)
    # With no gap table, each trajectory is its own gap source.
    gap_sources = trajectories if p.gap_table is None else [
        s for s in _table(p.gap_table).sessions if s.n_calls > 1]
    gap_order = trajectory_order if p.gap_table is None else _cycled_order(gap_stream, len(gap_sources), n)

    width = max(4, len(str(n - 1)))
    sessions: list[Session] = []
    origin: dict[str, str] = {}
    for i, t in enumerate(trajectory_order):
        sid = f"{name}-{i:0{width}d}"
        trajectory = trajectories[t]
        gap_source = gap_sources[gap_order[i]]
        label = f"{p.trajectory_table} {trajectory.session_id}"
        if p.gap_table is not None:
            label += f"; gaps {p.gap_table} {gap_source.session_id}"
        gaps = [c.tool_gap_s for c in gap_source.calls[:-1]]
        sessions.append(rescale_trajectory(trajectory, p, gaps, sid, prefix_group=name, source=label))
        origin[sid] = trajectory.session_id
    extra: dict[str, object] = {"seed": seed, "trajectory": origin}
    task_ids = _table(p.trajectory_table).extra.get("task_id")
    if isinstance(task_ids, dict):
        extra["task_id"] = {sid: task_ids[src] for sid, src in origin.items() if src in task_ids}
    return Workload(name=name, sessions=tuple(sessions), description=preset.description,
                    origin=f"synthetic preset {name} (seed {seed})", extra=extra)


def measure_targets(w: Workload) -> PresetTargets:
    """The :class:`PresetTargets` statistics measured on a workload.

    Percentiles, reuse, gaps and peak are :func:`basin.workload.stats.workload_stats`'s;
    the two means (tool gap over all gaps, calls per session) are added here.
    """
    stats = workload_stats(w)
    gaps = [c.tool_gap_s for s in w.sessions for c in s.calls[:-1]]
    if stats.tool_gap_s_p50 is None:
        raise BasinInputError(f"workload '{w.name}' has no tool gaps (every session has one call)")
    return PresetTargets(
        prompt_p50_tokens=stats.prompt_tokens_p50,
        prompt_p90_tokens=stats.prompt_tokens_p90,
        reuse_fraction=stats.reuse_fraction,
        output_p50_tokens=stats.output_tokens_p50,
        tool_gap_p50_s=stats.tool_gap_s_p50,
        tool_gap_mean_s=float(np.mean(gaps)),
        peak_context_p50_tokens=stats.peak_context_p50,
        calls_per_session_mean=stats.calls / stats.sessions,
    )


# --------------------------------------------------------------------------
# Preset files


def _typed(value: Any, annotation: str, loc: str) -> Any:
    """Check one YAML value against a field annotation (float, int, str, optional)."""
    optional = annotation.endswith(" | None")
    base = annotation.removesuffix(" | None")
    if value is None:
        if optional:
            return None
        raise BasinInputError(f"{loc}: required, got nothing")
    if base == "str":
        if isinstance(value, str) and value:
            return value
        raise BasinInputError(f"{loc}: expected a non-empty string, got {value!r}")
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if base == "int":
        if not number or value != int(value) or value < 0:
            raise BasinInputError(f"{loc}: expected a whole number >= 0, got {value!r}")
        return int(value)
    if not number:
        raise BasinInputError(f"{loc}: expected a number, got {value!r}")
    return float(value)


def _section(cls: type, data: object, path: Path, section: str) -> Any:
    if not isinstance(data, dict):
        raise BasinInputError(f"{where(path, field=section)}: expected a mapping of fields")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise BasinInputError(
            f"{where(path, field=f'{section}.{unknown[0]}')}: unknown field; known: {', '.join(names)}")
    values = {f.name: _typed(data.get(f.name), str(f.type), where(path, field=f"{section}.{f.name}"))
              for f in fields(cls)}
    return cls(**values)


def load_preset_file(path: Path) -> SyntheticPreset:
    """Read one preset file (``presets_data/<name>.yaml``, written by the fit script)."""
    try:
        data = safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise BasinInputError(f"{path}: unreadable preset file ({exc})") from exc
    if not isinstance(data, dict):
        raise BasinInputError(f"{path}: expected a mapping with name, description, targets and params")
    name = _typed(data.get("name"), "str", where(path, field="name"))
    description = _typed(data.get("description"), "str", where(path, field="description"))
    default_sessions = _typed(data.get("default_sessions"), "int", where(path, field="default_sessions"))
    if default_sessions < 1:
        raise BasinInputError(f"{where(path, field='default_sessions')}: expected at least 1")
    targets = _section(PresetTargets, data.get("targets"), path, "targets")
    params = _section(SynthesisParams, data.get("params"), path, "params")
    for table_field in ("trajectory_table", "gap_table"):
        table = getattr(params, table_field)
        if table is not None and table not in AGENT_TABLES:
            raise BasinInputError(
                f"{where(path, field=f'params.{table_field}')}: unknown table '{table}'; "
                f"choose one of {', '.join(AGENT_TABLES)}")
    positive = ("calls_scale", "context_scale", "size_reference_tokens", "output_scale", "tool_gap_scale",
                "tool_gap_exponent")
    for field_name in positive:
        if getattr(params, field_name) <= 0:
            raise BasinInputError(f"{where(path, field=f'params.{field_name}')}: expected a number > 0")
    return SyntheticPreset(name=name, description=description, default_sessions=default_sessions,
                           targets=targets, params=params)


def _load_presets() -> dict[str, SyntheticPreset]:
    presets: dict[str, SyntheticPreset] = {}
    for path in sorted(PRESETS_DATA_DIR.glob("*.yaml")):
        preset = load_preset_file(path)
        if preset.name != path.stem:
            raise BasinInputError(f"{where(path, field='name')}: '{preset.name}' must match the file name")
        presets[preset.name] = preset
    return presets


#: The synthetic presets by name, read from ``presets_data/*.yaml``.
SYNTHETIC_PRESETS: dict[str, SyntheticPreset] = _load_presets()
