"""The synthetic presets meet the paper's figures, are deterministic, carry an
honest text signal, and the preset files are what the fit script writes."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from basin.errors import BasinInputError
from basin.paths import REPO_ROOT
from basin.workload.agent_tables import load_agent_table
from basin.workload.records import Call, Session
from basin.workload.synthetic import (
    SYNTHETIC_PRESETS,
    load_preset_file,
    measure_targets,
    resample_gaps,
    rescale_trajectory,
    synthesize,
)

TB_CALLS_MEAN = 7108 / 216


def _within(measured: float, target: float, tolerance: float) -> bool:
    return abs(measured / target - 1) <= tolerance


def test_presets_are_registered_with_the_paper_targets():
    tb, pro = SYNTHETIC_PRESETS["terminal-bench"], SYNTHETIC_PRESETS["swe-pro"]
    assert (tb.name, tb.default_sessions, pro.default_sessions) == ("terminal-bench", 216, 70)
    assert tb.targets.prompt_p50_tokens == 25_600 and tb.targets.prompt_p90_tokens == 77_000
    assert tb.targets.reuse_fraction == 0.982 and tb.targets.output_p50_tokens == 160
    assert tb.targets.tool_gap_p50_s == 0.42 and tb.targets.peak_context_p50_tokens == 40_000
    assert pro.targets.prompt_p50_tokens == 83_000 and pro.targets.peak_context_p50_tokens == 107_000
    assert pro.targets.tool_gap_p50_s == 0.048
    assert tb.description and pro.description


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_terminal_bench_meets_the_paper_figures(seed):
    w = synthesize("terminal-bench", seed=seed)
    m, t = measure_targets(w), SYNTHETIC_PRESETS["terminal-bench"].targets
    assert len(w.sessions) == 216
    for name in ("prompt_p50_tokens", "prompt_p90_tokens", "reuse_fraction", "output_p50_tokens",
                 "tool_gap_p50_s", "peak_context_p50_tokens"):
        assert _within(getattr(m, name), getattr(t, name), 0.10), name
    assert _within(m.calls_per_session_mean, TB_CALLS_MEAN, 0.20)
    assert _within(float(np.median([s.n_calls for s in w.sessions])), TB_CALLS_MEAN, 0.20)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_terminal_bench_tool_gaps_have_the_papers_tail(seed):
    # Median 0.42 s with a long right tail reaching about 100 s (paper Fig. 3b):
    # the mean is dominated by the tail, and 99% of gaps stay within ~110 s.
    w = synthesize("terminal-bench", seed=seed)
    gaps = np.array([c.tool_gap_s for s in w.sessions for c in s.calls[:-1]])
    assert _within(float(np.median(gaps)), 0.42, 0.10)
    assert gaps.mean() > 20 * np.median(gaps)
    assert 80.0 < np.percentile(gaps, 99) < 130.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_swe_pro_meets_the_paper_figures(seed):
    w = synthesize("swe-pro", seed=seed)
    m, t = measure_targets(w), SYNTHETIC_PRESETS["swe-pro"].targets
    assert len(w.sessions) == 70
    for name in ("prompt_p50_tokens", "peak_context_p50_tokens", "tool_gap_p50_s"):
        assert _within(getattr(m, name), getattr(t, name), 0.10), name


def test_synthesis_is_deterministic_by_seed_and_prefix_stable():
    a = synthesize("terminal-bench", n_sessions=40, seed=7)
    assert a == synthesize("terminal-bench", n_sessions=40, seed=7)
    assert a.sessions != synthesize("terminal-bench", n_sessions=40, seed=8).sessions
    longer = synthesize("terminal-bench", n_sessions=300, seed=7)
    assert longer.sessions[:40] == a.sessions
    assert len({s.session_id for s in longer.sessions}) == 300


def test_default_draw_uses_every_trajectory_before_repeating_one():
    w = synthesize("terminal-bench", seed=3)
    sources = list(w.extra["trajectory"].values())
    assert len(set(sources[:192])) == 192


def test_sessions_carry_their_trajectory_text_and_the_shared_prefix():
    swe = {s.session_id: s for s in load_agent_table("swebench-deepseek").sessions}
    for name in SYNTHETIC_PRESETS:
        w = synthesize(name, n_sessions=30)
        for s in w.sessions:
            real = swe[w.extra["trajectory"][s.session_id]]
            assert s.task_text == real.task_text and s.task_text
            assert real.session_id in s.source
            assert s.prefix_group == name
            assert s.shared_prefix_tokens == SYNTHETIC_PRESETS[name].params.shared_prefix_tokens == 1310
            assert s.calls[0].prompt_tokens >= real.calls[0].prompt_tokens


def test_task_text_predicts_size_as_weakly_as_in_the_real_table():
    # Real SWE-bench: Spearman(log text length, log peak) = 0.21.
    w = synthesize("terminal-bench", seed=0)
    text = [len(s.task_text) for s in w.sessions]
    peak = [max(c.prompt_tokens for c in s.calls) for s in w.sessions]
    assert 0.1 < spearmanr(np.log(text), np.log(peak))[0] < 0.35


def _params(**changes):
    return replace(SYNTHETIC_PRESETS["terminal-bench"].params, **changes)


def test_thinned_trajectory_keeps_first_and_last_call_and_total_growth():
    real = load_agent_table("swebench-deepseek").sessions[0]
    p = _params(calls_scale=0.5, calls_exponent=1.0, context_scale=1.0, size_exponent=0.0, output_scale=1.0,
                tool_gap_scale=2.0, tool_gap_exponent=1.0)
    s = rescale_trajectory(real, p, [1.0, 2.0, 3.0], "x")
    assert s.n_calls == round(0.5 * real.n_calls)
    assert s.calls[0] == replace(real.calls[0], tool_gap_s=2.0)
    assert s.calls[-1].prompt_tokens == real.calls[-1].prompt_tokens
    assert s.calls[-1].output_tokens == real.calls[-1].output_tokens and s.calls[-1].tool_gap_s == 0
    assert all(b.reused_tokens == a.context_tokens for a, b in zip(s.calls, s.calls[1:]))
    assert sorted({c.tool_gap_s for c in s.calls[:-1]}) == [2.0, 4.0, 6.0]


def test_size_exponent_stretches_large_sessions_more():
    swe = load_agent_table("swebench-deepseek").sessions
    p = _params(calls_scale=1.0, calls_exponent=1.0, size_exponent=1.0, context_scale=1.0, output_scale=1.0)
    small, large = sorted(swe, key=lambda s: s.peak_context_tokens)[::191]
    growth = [rescale_trajectory(s, p, [0.0], "x").calls[-1].prompt_tokens - s.calls[0].prompt_tokens
              for s in (small, large)]
    real_growth = [s.calls[-1].prompt_tokens - s.calls[0].prompt_tokens for s in (small, large)]
    assert growth[0] < real_growth[0] and growth[1] > real_growth[1]


def test_resample_gaps_keeps_order_when_stretching_and_compressing():
    assert list(resample_gaps([1.0, 2.0, 3.0], 6)) == [1, 1, 2, 2, 3, 3]
    assert list(resample_gaps([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3)) == [1, 3, 5]
    assert resample_gaps([1.0], 0).size == 0


def test_one_call_trajectory_stays_one_call():
    one = Session("one", (Call(prompt_tokens=500, new_tokens=500, output_tokens=20),))
    s = rescale_trajectory(one, _params(), [], "x")
    assert s.n_calls == 1 and s.calls[0].prompt_tokens == 500 and s.calls[0].tool_gap_s == 0
    assert s.shared_prefix_tokens == 500  # the shared prefix cannot outgrow the prompt


def test_bad_requests_are_input_errors():
    with pytest.raises(BasinInputError, match="choose one of .*terminal-bench"):
        synthesize("terminalbench")
    with pytest.raises(BasinInputError, match="n_sessions must be a whole number >= 1"):
        synthesize("swe-pro", n_sessions=0)


def _preset_file(tmp_path: Path, edit) -> Path:
    text = (Path(__file__).parents[1] / "src/basin/workload/presets_data/swe-pro.yaml").read_text()
    path = tmp_path / "swe-pro.yaml"
    path.write_text(edit(text))
    return path


def test_broken_preset_files_name_the_field(tmp_path):
    ok = load_preset_file(_preset_file(tmp_path, lambda t: t))
    assert ok == SYNTHETIC_PRESETS["swe-pro"]
    cases = {
        "context_scale: 2": ("context_scale: -2", "params.context_scale'.*> 0"),
        "gap_table: null": ("gap_table: tb", "params.gap_table'.*unknown table 'tb'"),
        "default_sessions: 70": ("default_sessions: seventy", "default_sessions'.*whole number"),
        "  size_exponent: 0.0": ("  size_exponent: 0.0\n  colour: red", "params.colour'.*unknown field"),
    }
    for old, (new, message) in cases.items():
        assert old in _preset_file(tmp_path, lambda t: t).read_text()
        with pytest.raises(BasinInputError, match=message):
            load_preset_file(_preset_file(tmp_path, lambda t, o=old, n=new: t.replace(o, n, 1)))


def test_preset_files_are_what_the_fit_script_writes():
    script = REPO_ROOT / "scripts" / "fit_presets.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_sessions_peak_is_its_largest_call_context():
    sessions = load_agent_table("swebench-deepseek").sessions
    assert all(s.peak_context_tokens == max(c.context_tokens for c in s.calls) for s in sessions)
    # The peak need not be the last call's (a session that compacts shrinks).
    s = Session("x", (Call(100, 100, 50, 1.0), Call(30, 30, 5, 0.0)))
    assert s.peak_context_tokens == 150
