"""Workload statistics: definitions on a hand-made workload, figures on shipped data."""

from __future__ import annotations

import pytest

from basin.workload.agent_tables import load_agent_table
from basin.workload.records import Call, Session, Workload
from basin.workload.stats import workload_stats

KEYS = [
    "sessions", "calls", "calls_per_session_p50", "calls_per_session_p90", "prompt_tokens_p50",
    "prompt_tokens_p90", "reuse_fraction", "output_tokens_p50", "tool_gap_s_p50", "tool_gap_s_p90",
    "peak_context_p50", "peak_context_p90", "peak_over_first_prompt_p50",
]


def test_definitions_on_a_hand_made_workload() -> None:
    s0 = Session("s0", (Call(100, 100, 10, 1.0), Call(130, 20, 5, 3.0), Call(200, 65, 1, 9.0)))
    s1 = Session("s1", (Call(50, 50, 7, 4.0),))
    st = workload_stats(Workload("hand", (s0, s1)))
    assert list(st.to_dict()) == KEYS
    assert (st.sessions, st.calls) == (2, 4)
    assert (st.calls_per_session_p50, st.calls_per_session_p90) == (2.0, pytest.approx(2.8))
    assert (st.prompt_tokens_p50, st.prompt_tokens_p90) == (115.0, pytest.approx(179.0))
    # calls with a predecessor: 130 - 20 and 200 - 65 reused of 130 + 200 sent; call 0 does not count
    assert st.reuse_fraction == pytest.approx((110 + 135) / (130 + 200))
    assert st.output_tokens_p50 == 6.0
    # each session's last gap is not a gap between calls (9.0 and 4.0 are ignored)
    assert (st.tool_gap_s_p50, st.tool_gap_s_p90) == (2.0, pytest.approx(2.8))
    # peak context is a session's largest prompt
    assert (st.peak_context_p50, st.peak_context_p90) == (125.0, pytest.approx(185.0))
    # s0 grows to twice its first prompt, s1 never grows
    assert st.peak_over_first_prompt_p50 == 1.5


def test_one_call_sessions_have_no_gaps_and_no_reuse() -> None:
    st = workload_stats(Workload("single", (Session("a", (Call(10, 10, 1),)), Session("b", (Call(30, 30, 2),)))))
    assert st.tool_gap_s_p50 is None and st.tool_gap_s_p90 is None and st.reuse_fraction is None
    assert st.to_dict()["tool_gap_s_p50"] is None


def test_mooncake_conversation_figures() -> None:
    from basin.workload.mooncake import load_mooncake_workload

    st = workload_stats(load_mooncake_workload("mooncake-conversation"))
    assert (st.sessions, st.calls) == (7386, 12_031)
    assert st.prompt_tokens_p50 == pytest.approx(6.9e3, rel=0.01)
    assert st.prompt_tokens_p90 == pytest.approx(27.4e3, rel=0.01)
    assert st.output_tokens_p50 == 350
    assert st.tool_gap_s_p50 == pytest.approx(123, abs=3)


def _real(name: str) -> Workload:
    return load_agent_table(name)


def test_swebench_deepseek_reproduces_workloads_md_1a() -> None:
    st = workload_stats(_real("swebench-deepseek"))
    assert (st.sessions, st.calls) == (192, 15_415)
    assert (st.calls_per_session_p50, st.calls_per_session_p90) == (76, 115)
    assert round(st.prompt_tokens_p50, -2) == 19_200 and round(st.prompt_tokens_p90, -2) == 42_500
    assert round(st.reuse_fraction, 3) == 0.990
    assert st.output_tokens_p50 == 90
    assert round(st.tool_gap_s_p50, 2) == 0.26 and round(st.tool_gap_s_p90, 2) == 0.49
    assert round(st.peak_context_p50, -2) == 34_300


def test_terminalbench_claude_reproduces_workloads_md_1b() -> None:
    st = workload_stats(_real("terminalbench-claude"))
    assert (st.sessions, st.calls) == (171, 3484)
    assert (st.calls_per_session_p50, st.calls_per_session_p90) == (18, 36)
    assert round(st.prompt_tokens_p50, -2) == 5_800 and round(st.prompt_tokens_p90, -3) == 21_000
    assert round(st.reuse_fraction, 3) == 0.967
    assert st.output_tokens_p50 == 97
    assert st.tool_gap_s_p50 == pytest.approx(0.125, abs=1e-3)  # workloads.md: 0.13 s
    assert round(st.tool_gap_s_p90, 1) == 21.6
    assert round(st.peak_context_p50, -2) == 9_500
