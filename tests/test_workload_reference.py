"""The unloaded reference: one number per session, whichever batch computes it."""

from __future__ import annotations

import pytest

from basin.catalog import load_hardware
from basin.workload.presets import resolve_workload
from basin.workload.records import Call
from basin.workload.reference import unloaded_reference_s, unloaded_references_s


def _call_by_call(calls: list[Call] | tuple[Call, ...], hw) -> float:
    """The definition, one call at a time through the profiles' cost methods."""
    pre, dec = hw.prefill, hw.decode
    total = 0.0
    for k, c in enumerate(calls):
        total += pre.step_overhead_s + pre.tokens_cost_s(c.new_tokens, c.reused_tokens) + hw.transfer_s
        m = max(c.output_tokens - 1, 0)
        total += m * dec.step_s(1, c.prompt_tokens + 1) + dec.step_per_context_token_s * m * (m - 1) / 2.0
        if k < len(calls) - 1:
            total += c.tool_gap_s
    return total


@pytest.mark.parametrize("hardware", ["h200", "h100-nvl"])
def test_a_batch_gives_each_session_the_number_it_gets_alone(hardware):
    hw = load_hardware(hardware)
    sessions = resolve_workload("terminal-bench").sessions[:60]
    # Whole sessions, sessions joined part-way, and one that joined after its last call.
    seqs = [s.calls for s in sessions] + [s.calls[len(s.calls) // 2:] for s in sessions] + [()]
    batch = unloaded_references_s(seqs, hw)
    assert batch == [unloaded_reference_s(c, hw) for c in seqs]  # exactly, not approximately
    assert batch == [_call_by_call(c, hw) for c in seqs]
    assert batch[-1] == 0.0 and all(v > 0 for v in batch[:-1])
    assert unloaded_references_s([], hw) == []
