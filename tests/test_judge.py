"""A scenario's `judge` section: the state label and window rules in a compressed run's own time."""

from __future__ import annotations

import pytest

from basin.errors import BasinInputError
from basin.experiments.runner import run_scenario
from basin.experiments.scenario import JudgeSpec, load_scenario
from basin.metrics.state import LabelRule, RunState
from basin.metrics.windows import DegradationRule


def test_the_default_judge_is_the_papers_rules():
    assert JudgeSpec().degradation_rule() == DegradationRule()
    assert JudgeSpec().label_rule() == LabelRule()


def test_time_scale_shrinks_every_time_span_and_keeps_the_thresholds():
    judge = JudgeSpec(time_scale=0.25, max_ttft_p50_s=2.0)
    window, label = judge.degradation_rule(), judge.label_rule()
    paper_window, paper_label = DegradationRule(), LabelRule()
    assert window.window_s == paper_window.window_s / 4
    assert window.max_first_call_wait_p50_s == paper_window.max_first_call_wait_p50_s / 4
    assert window.never_start_grace_s == paper_window.never_start_grace_s / 4
    assert window.max_ttft_p50_s == 2.0
    assert window.max_never_start_share == paper_window.max_never_start_share
    assert label.min_end_after_trigger_s == paper_label.min_end_after_trigger_s / 4
    assert label.warmup_s == paper_label.warmup_s / 4
    assert label.min_reference_s == paper_label.min_reference_s / 4
    assert (label.min_improvement, label.min_hit_rate_drop) == (paper_label.min_improvement,
                                                                paper_label.min_hit_rate_drop)


_COMPRESSED = ["duration_min=30", "measure_end_min=22.5", "surge.start_min=3.75", "surge.end_min=6.25",
               "workload.sessions=300"]


def test_a_compressed_run_is_labelled_only_when_judged_in_its_own_time():
    paper_time = run_scenario(load_scenario("trap-1p1d", _COMPRESSED), "hicache").summary
    own_time = run_scenario(load_scenario("trap-1p1d", [*_COMPRESSED, "judge.time_scale=0.25"]), "hicache").summary
    assert paper_time.state is RunState.UNDETERMINED  # 30 minutes hold one 20-minute window
    assert own_time.state is not RunState.UNDETERMINED


@pytest.mark.parametrize("bad", ["judge.time_scale=0", "judge.max_ttft_p50_s=-1", "judge.window_min=5"])
def test_bad_judge_fields_are_refused_by_name(bad):
    field = bad.split("=")[0]
    with pytest.raises(BasinInputError, match=field.split(".")[-1]):
        load_scenario("trap-1p1d", [bad])
