"""scale_workload scales exactly one quantity per factor and keeps every
record valid."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.errors import BasinInputError
from basin.workload.agent_tables import load_agent_table
from basin.workload.records import Call, Session, Workload
from basin.workload.transforms import scale_workload


@pytest.fixture(scope="module")
def tb() -> Workload:
    w = load_agent_table("terminalbench-claude")
    return Workload(name="tb", sessions=w.sessions[:20], description="a slice")


def _hashed() -> Workload:
    calls = (Call(128, 128, 10, 1.0, block_hashes=(1, 2)), Call(200, 62, 5, 0.0, block_hashes=(1, 2, 3)))
    return Workload(name="h", sessions=(Session("s", calls, shared_prefix_tokens=64, prefix_group="g"),),
                    block_tokens=64)


def test_tool_time_scales_gaps_only(tb):
    w = scale_workload(tb, tool_time=3)
    assert w.name == "tb[tools x3]" and w.description == "a slice (tools x3)"
    for a, b in zip(tb.sessions, w.sessions):
        assert [c.tool_gap_s for c in b.calls] == pytest.approx([3 * c.tool_gap_s for c in a.calls])
        assert [(c.prompt_tokens, c.new_tokens, c.output_tokens) for c in b.calls] == [
            (c.prompt_tokens, c.new_tokens, c.output_tokens) for c in a.calls]


def test_longer_outputs_leave_recorded_prompts_alone(tb):
    w = scale_workload(tb, output=3)
    assert w.name == "tb[output x3]"
    for a, b in zip(tb.sessions, w.sessions):
        assert [c.output_tokens for c in b.calls] == [3 * c.output_tokens for c in a.calls]
        assert [(c.prompt_tokens, c.new_tokens) for c in b.calls] == [(c.prompt_tokens, c.new_tokens) for c in a.calls]


def test_shorter_outputs_move_the_missing_history_into_the_new_suffix(tb):
    w = scale_workload(tb, output=0.5)
    for b in w.sessions:
        for prev, call in zip(b.calls, b.calls[1:]):
            assert call.reused_tokens == prev.context_tokens  # the tables' agents resend everything
    a, b = tb.sessions[0], w.sessions[0]
    assert b.calls[1].new_tokens == a.calls[1].new_tokens + a.calls[0].output_tokens - b.calls[0].output_tokens


def test_prompt_scaling_scales_prompts_and_reuse(tb):
    w = scale_workload(tb, prompt=2, tool_time=3)
    assert w.name == "tb[tools x3, prompt x2]"
    for a, b in zip(tb.sessions, w.sessions):
        assert [c.prompt_tokens for c in b.calls] == [2 * c.prompt_tokens for c in a.calls]
        assert [c.output_tokens for c in b.calls] == [c.output_tokens for c in a.calls]


def test_prompt_scaling_drops_block_hashes_and_scales_the_shared_prefix():
    w = scale_workload(_hashed(), prompt=0.5)
    assert w.block_tokens is None and all(c.block_hashes is None for c in w.sessions[0].calls)
    assert w.sessions[0].shared_prefix_tokens == 32
    kept = scale_workload(_hashed(), tool_time=2)
    assert kept.block_tokens == 64 and kept.sessions[0].calls[1].block_hashes == (1, 2, 3)


def test_small_factors_never_round_a_call_away():
    w = scale_workload(_hashed(), output=0.01, prompt=0.001)
    assert all(c.prompt_tokens >= 1 and c.output_tokens >= 1 for c in w.sessions[0].calls)


def test_identity_returns_the_workload(tb):
    assert scale_workload(tb) is tb


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "3"])
def test_non_positive_or_non_numeric_factors_are_input_errors(tb, bad):
    with pytest.raises(BasinInputError, match="'tool_time' must be a finite number > 0"):
        scale_workload(tb, tool_time=bad)


@settings(max_examples=40, deadline=None)
@given(tool_time=st.floats(0.05, 50), output=st.floats(0.05, 20), prompt=st.floats(0.05, 20))
def test_any_positive_factors_give_valid_records(tb, tool_time, output, prompt):
    # Constructing the records checks every invariant (reuse within the previous context).
    w = scale_workload(tb, tool_time=tool_time, output=output, prompt=prompt)
    for a, b in zip(tb.sessions, w.sessions):
        assert b.n_calls == a.n_calls
        for ca, cb in zip(a.calls, b.calls):
            assert cb.prompt_tokens == max(1, round(ca.prompt_tokens * prompt))
            assert cb.tool_gap_s == pytest.approx(ca.tool_gap_s * tool_time)


def test_truncate_calls_keeps_valid_short_sessions():
    from basin.workload.synthetic import synthesize
    from basin.workload.transforms import truncate_calls

    w = synthesize("terminal-bench", n_sessions=30, seed=3)
    short = truncate_calls(w, 5)
    assert all(1 <= len(s.calls) <= 5 for s in short.sessions)
    assert all(s.calls[-1].tool_gap_s == 0.0 for s in short.sessions)
    for a, b in zip(w.sessions, short.sessions):
        assert b.calls[:-1] == a.calls[: len(b.calls) - 1]
    with pytest.raises(BasinInputError, match="max_calls"):
        truncate_calls(w, 0)
