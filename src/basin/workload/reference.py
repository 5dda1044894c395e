"""A session's unloaded time: the reference its slowdown is measured against.

One definition for the simulator and the real load client: its tool gaps plus,
per call, the new suffix's prefill (after the reused prefix), the fixed
overheads, the server's front end reading the whole prompt, the KV transfer
and batch-one decode of its output, all at the catalogue's calibrated costs of
the deployment's hardware.

The per-call costs are computed for many sessions at once, as arrays (the
profiles' cost methods take arrays), and each session's costs are then added
in call order, one term at a time from zero, so that a session's total is the
same number whichever batch it was computed in.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from basin.catalog import HardwareProfile
from basin.workload.records import Call


def unloaded_reference_s(calls: Sequence[Call], hardware: HardwareProfile) -> float:
    """Unloaded time of ``calls`` (a session, or its calls from where it joined)."""
    return unloaded_references_s([calls], hardware)[0]


def unloaded_references_s(sessions: Sequence[Sequence[Call]], hardware: HardwareProfile) -> list[float]:
    """Unloaded time of each call sequence in ``sessions`` (see the module docstring)."""
    flat = [c for calls in sessions for c in calls]
    if not flat:
        return [0.0] * len(sessions)
    # Each column read by a C loop (a list of each field first took twice as long).
    n = len(flat)
    prompt = np.fromiter(map(attrgetter("prompt_tokens"), flat), dtype=np.int64, count=n)
    new = np.fromiter(map(attrgetter("new_tokens"), flat), dtype=np.int64, count=n)
    output = np.fromiter(map(attrgetter("output_tokens"), flat), dtype=np.int64, count=n)
    gap = np.fromiter(map(attrgetter("tool_gap_s"), flat), dtype=np.float64, count=n)
    pre, dec = hardware.prefill, hardware.decode
    terms = np.empty((len(flat), 3))
    terms[:, 0] = pre.step_overhead_s + pre.tokens_cost_s(new, prompt - new) + hardware.transfer_s \
        + prompt * pre.frontend_s_per_prompt_token
    m = np.maximum(output - 1, 0)
    terms[:, 1] = m * dec.step_s(1, prompt + 1) + dec.step_per_context_token_s * m * (m - 1) / 2.0
    # A session's last call is followed by no tool gap (adding 0.0 changes no sum).
    terms[:, 2] = gap
    ends = np.cumsum([len(calls) for calls in sessions])
    terms[ends[ends > 0] - 1, 2] = 0.0
    values = terms.ravel().tolist()
    out: list[float] = []
    start = 0
    for end in ends.tolist():
        out.append(functools.reduce(operator.add, values[3 * start:3 * end], 0.0))
        start = end
    return out
