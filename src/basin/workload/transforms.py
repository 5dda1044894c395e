"""Workload transforms for sensitivity runs (the paper scales tool time by 3,
10 or 30 and output length by 3).

Each factor scales one recorded quantity and leaves the others as recorded,
as a replay of recorded trajectories does:

* ``tool_time``: every tool gap;
* ``output``: every call's generated tokens. Later prompts keep their
  recorded lengths (a replay resends the recorded conversation), so only a
  shorter output can change them: the reused prefix of the next call is then
  capped by what the previous call actually left, and the rest of its
  prompt counts as new;
* ``prompt``: every prompt length and the shared system-prompt prefix. The
  reused part scales with it, capped in the same way, so reuse stays valid.

Token counts are rounded to whole tokens and a non-empty output or prompt
never rounds to zero. Block hashes describe the recorded prompts, so they
are dropped when prompts are rescaled.
"""

from __future__ import annotations

import math
from dataclasses import replace

from basin.errors import BasinInputError
from basin.workload.records import Call, Session, Workload


def _check_factor(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BasinInputError(
            f"scale factor '{name}' must be a finite number > 0 (1 keeps it as recorded), got {value!r}")
    return float(value)


def _scaled_count(tokens: int, factor: float) -> int:
    return max(1, round(tokens * factor)) if tokens else 0


def _scale_session(s: Session, tool_time: float, output: float, prompt: float) -> Session:
    calls: list[Call] = []
    for k, c in enumerate(s.calls):
        new_prompt = _scaled_count(c.prompt_tokens, prompt)
        if k == 0:
            reused = 0
        else:
            prev = calls[-1]
            reused = min(round(c.reused_tokens * prompt), prev.context_tokens, new_prompt)
        calls.append(Call(
            prompt_tokens=new_prompt,
            new_tokens=new_prompt - reused,
            output_tokens=_scaled_count(c.output_tokens, output),
            tool_gap_s=c.tool_gap_s * tool_time,
            block_hashes=c.block_hashes if prompt == 1.0 else None,
        ))
    shared = min(round(s.shared_prefix_tokens * prompt), calls[0].prompt_tokens)
    return replace(s, calls=tuple(calls), shared_prefix_tokens=shared)


def scale_workload(w: Workload, tool_time: float = 1.0, output: float = 1.0, prompt: float = 1.0) -> Workload:
    """``w`` with tool gaps, output lengths and prompt lengths scaled.

    The result is named after the factors that differ from 1, e.g.
    ``terminal-bench[tools x3]`` or ``terminal-bench[tools x3, output x3]``.
    """
    factors = {"tools": _check_factor("tool_time", tool_time), "output": _check_factor("output", output),
               "prompt": _check_factor("prompt", prompt)}
    changed = [f"{label} x{value:g}" for label, value in factors.items() if value != 1.0]
    if not changed:
        return w
    sessions = tuple(_scale_session(s, factors["tools"], factors["output"], factors["prompt"])
                     for s in w.sessions)
    label = ", ".join(changed)
    description = f"{w.description} ({label})" if w.description else label
    return replace(w, name=f"{w.name}[{label}]", sessions=sessions, description=description,
                   block_tokens=w.block_tokens if factors["prompt"] == 1.0 else None, extra=dict(w.extra))


def truncate_calls(w: Workload, max_calls: int) -> Workload:
    """``w`` with every session cut to its first ``max_calls`` calls: short
    sessions with real prompts, such as the paper's burst of short sessions."""
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        raise BasinInputError(f"max_calls: expected a whole number >= 1, got {max_calls!r}")
    sessions = []
    for s in w.sessions:
        if len(s.calls) <= max_calls:
            sessions.append(s)
            continue
        calls = s.calls[:max_calls]
        last = replace(calls[-1], tool_gap_s=0.0)
        sessions.append(replace(s, calls=calls[:-1] + (last,)))
    label = f"first {max_calls} calls"
    description = f"{w.description} ({label})" if w.description else label
    return replace(w, name=f"{w.name}[{label}]", sessions=tuple(sessions), description=description,
                   extra=dict(w.extra))
