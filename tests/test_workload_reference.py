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
        total += pre.step_overhead_s + pre.tokens_cost_s(c.new_tokens, c.reused_tokens) + hw.transfer_s \
            + c.prompt_tokens * pre.frontend_s_per_prompt_token
        m = max(c.output_tokens - 1, 0)
        total += m * dec.step_s(1, c.prompt_tokens + 1) + dec.step_per_context_token_s * m * (m - 1) / 2.0
        if k < len(calls) - 1:
            total += c.tool_gap_s
    return total


def _with_front_end(name: str):
    hw = load_hardware(name)
    return hw.model_copy(update={"prefill": hw.prefill.model_copy(update={"frontend_s_per_prompt_token": 2e-6})})


@pytest.mark.parametrize("hardware", ["h200", "h100-nvl", "h200 with a front end"])
def test_a_batch_gives_each_session_the_number_it_gets_alone(hardware):
    hw = _with_front_end("h200") if hardware.endswith("front end") else load_hardware(hardware)
    sessions = resolve_workload("terminal-bench").sessions[:60]
    # Whole sessions, sessions joined part-way, and one that joined after its last call.
    seqs = [s.calls for s in sessions] + [s.calls[len(s.calls) // 2:] for s in sessions] + [()]
    batch = unloaded_references_s(seqs, hw)
    assert batch == [unloaded_reference_s(c, hw) for c in seqs]  # exactly, not approximately
    assert batch == [_call_by_call(c, hw) for c in seqs]
    assert batch[-1] == 0.0 and all(v > 0 for v in batch[:-1])
    assert unloaded_references_s([], hw) == []


def test_the_front_ends_read_of_every_prompt_token_is_part_of_the_reference():
    calls = resolve_workload("terminal-bench").sessions[0].calls
    extra = unloaded_reference_s(calls, _with_front_end("h200")) - unloaded_reference_s(calls, load_hardware("h200"))
    assert extra == pytest.approx(2e-6 * sum(c.prompt_tokens for c in calls), rel=1e-9)
