"""Arrival processes: measured rates and surge windows, paired streams,
trace shapes, the session draw and the warm start."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.paths import DATA_DIR
from basin.workload.agent_tables import load_agent_table
from basin.workload.arrivals import (
    PoissonSchedule,
    RateChange,
    RateSeries,
    Surge,
    TraceShapedSchedule,
    draw_arrivals,
    load_rate_series,
)
from basin.workload.records import Workload


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed))


def _count(arrivals, lo_min: float, hi_min: float, tag: str | None = None) -> int:
    return sum(lo_min * 60 <= t < hi_min * 60 and (tag is None or g == tag) for t, g in arrivals)


def _close(count: int, expected: float, sigmas: float = 4.0) -> bool:
    return abs(count - expected) <= sigmas * math.sqrt(expected)


def test_base_rate_is_measured_from_samples():
    arrivals = PoissonSchedule(base_per_min=30).sample(200 * 60, _rng())
    assert _close(len(arrivals), 30 * 200)
    times = [t for t, _ in arrivals]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 200 * 60
    gaps = np.diff(times)
    assert np.mean(gaps) == pytest.approx(2.0, rel=0.05)
    assert np.std(gaps) == pytest.approx(2.0, rel=0.1)  # exponential: sd = mean
    assert {g for _, g in arrivals} == {"base"}


def test_surge_adds_burst_arrivals_only_inside_its_window():
    schedule = PoissonSchedule(base_per_min=20, surges=[Surge(start_min=30, end_min=50, factor=3)])
    arrivals = schedule.sample(100 * 60, _rng(1))
    assert _close(_count(arrivals, 30, 50, "burst"), 2 * 20 * 20)
    assert _count(arrivals, 0, 30, "burst") == _count(arrivals, 50, 100, "burst") == 0
    assert _close(_count(arrivals, 30, 50, "base"), 20 * 20)
    assert _close(_count(arrivals, 0, 100, "base"), 20 * 100)
    assert schedule.rate_at(29.9 * 60) == 20 and schedule.rate_at(30 * 60) == 60 and schedule.rate_at(50 * 60) == 20


def test_factor_below_one_thins_the_base_stream():
    schedule = PoissonSchedule(base_per_min=40, surges=[{"start_min": 10, "end_min": 60, "factor": 0.25}])
    arrivals = schedule.sample(60 * 60, _rng(2))
    assert _close(_count(arrivals, 10, 60), 0.25 * 40 * 50)
    assert _close(_count(arrivals, 0, 10), 40 * 10)
    assert _count(arrivals, 0, 60, "burst") == 0
    assert _count(PoissonSchedule(40, surges=[Surge(10, 20, 0)]).sample(1800, _rng(2)), 10, 20) == 0


def test_surges_and_thinning_keep_every_other_base_arrival_in_place():
    plain = PoissonSchedule(base_per_min=5).sample(3600, _rng(4))
    surged = PoissonSchedule(base_per_min=5, surges=[Surge(15, 25, 4), Surge(40, 45, 0.5)]).sample(3600, _rng(4))
    surged_base = [t for t, g in surged if g == "base"]
    outside_thinning = [t for t, _ in plain if not 40 * 60 <= t < 45 * 60]
    assert [t for t in surged_base if not 40 * 60 <= t < 45 * 60] == outside_thinning
    assert set(surged_base) <= {t for t, _ in plain}


def test_rate_changes_switch_the_base_rate():
    schedule = PoissonSchedule(base_per_min=10, rate_changes=[RateChange(at_min=60, per_min=40)],
                               surges=[Surge(70, 80, 2)])
    arrivals = schedule.sample(120 * 60, _rng(5))
    assert _close(_count(arrivals, 0, 60), 10 * 60)
    assert _close(_count(arrivals, 60, 120, "base"), 40 * 60)
    assert _close(_count(arrivals, 70, 80, "burst"), 40 * 10)  # the surge multiplies the changed rate
    assert schedule.rate_at(59 * 60) == 10 and schedule.rate_at(75 * 60) == 80
    # A later change never moves earlier arrivals.
    earlier = PoissonSchedule(base_per_min=10).sample(60 * 60, _rng(5))
    assert [t for t, g in arrivals if t < 3600 and g == "base"] == [t for t, _ in earlier]


def test_sampling_is_deterministic_by_seed():
    schedule = PoissonSchedule(base_per_min=3.3, surges=[Surge(15, 25, 2)])
    assert schedule.sample(7200, _rng(9)) == schedule.sample(7200, _rng(9))
    assert schedule.sample(7200, _rng(9)) != schedule.sample(7200, _rng(10))


@pytest.mark.parametrize(("make", "message"), [
    (lambda: PoissonSchedule(base_per_min=-1), "base_per_min: expected a finite number >= 0"),
    (lambda: PoissonSchedule(base_per_min=math.nan), "base_per_min"),
    (lambda: PoissonSchedule(3, surges=[Surge(25, 15, 2)]), "surge 25-15 min: end_min must be after start_min"),
    (lambda: PoissonSchedule(3, surges=[Surge(10, 20, -2)]), "surge factor"),
    (lambda: PoissonSchedule(3, surges=[Surge(10, 20, 2), Surge(15, 30, 3)]), "10-20 min and 15-30 min overlap"),
    (lambda: PoissonSchedule(3, surges=[{"start_min": 1, "end": 2, "factor": 2}]), "surge 1: unknown field 'end'"),
    (lambda: PoissonSchedule(3, surges=None), "surges: expected a list, got None"),
    (lambda: PoissonSchedule(3, rate_changes=[RateChange(5, -1)]), "rate change at 5 min: per_min"),
    (lambda: PoissonSchedule(3, rate_changes=[RateChange(5, 1), RateChange(5, 2)]), "two rate changes at 5 min"),
    (lambda: PoissonSchedule(3).sample(-10, _rng()), "duration_s: expected a finite number > 0"),
])
def test_bad_schedules_are_input_errors(make, message):
    with pytest.raises(BasinInputError, match=message):
        make()


# --------------------------------------------------------------------------
# Rate traces


def test_shipped_rate_traces_load():
    servegen = load_rate_series("servegen")
    assert len(servegen.t_s) == 2016 and servegen.end_s == 14 * 24 * 3600
    assert np.mean(servegen.rate_per_s) == pytest.approx(196, abs=1)  # m-large mean (workloads.md)
    azure = load_rate_series("azure")
    assert len(azure.t_s) == 57 and azure.t_s[1] - azure.t_s[0] == 60
    with (DATA_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv").open() as f:
        stamps = [datetime.fromisoformat(line.split(",")[0]) for line in list(f)[1:]]
    in_complete_minutes = sum((t - stamps[0]).total_seconds() < 57 * 60 for t in stamps)
    assert len(stamps) == 8819 and in_complete_minutes > 8500
    assert sum(azure.rate_per_s) * 60 == pytest.approx(in_complete_minutes)


def test_rate_series_round_trips_through_csv(tmp_path):
    series = load_rate_series("servegen", column="m_mid_req_per_s")
    series.to_csv(tmp_path / "mid.csv")
    back = load_rate_series("servegen", tmp_path / "mid.csv")
    assert back.t_s == series.t_s and back.rate_per_s == pytest.approx(series.rate_per_s)


def test_bad_rate_files_name_line_and_field(tmp_path):
    reason = DATA_DIR / "servegen_rates" / "servegen_reason_mm_aggregate_rate_10min.csv"
    with pytest.raises(BasinInputError, match="choose one of deepseek_r1_req_per_s, mm_image_req_per_s"):
        load_rate_series("servegen", reason)
    assert load_rate_series("servegen", reason, "deepseek_r1_req_per_s").name.endswith("deepseek_r1_req_per_s")
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,rate\n0,1\n600,-2\n")
    with pytest.raises(BasinInputError, match="bad.csv line 3, field 'rate': expected a number >= 0"):
        load_rate_series("servegen", bad)
    bad.write_text("t_s,rate\n0,1\n0,2\n")
    with pytest.raises(BasinInputError, match="line 3, field 't_s': times must increase"):
        load_rate_series("servegen", bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,1,1\nyesterday,1,1\n")
    with pytest.raises(BasinInputError, match="line 3, field 'TIMESTAMP'"):
        load_rate_series("azure", bad)
    with pytest.raises(BasinInputError, match="choose servegen or azure"):
        load_rate_series("bailian")


def _step_series() -> RateSeries:
    # 10-minute windows: quiet, busy (3x), quiet.
    return RateSeries(t_s=(0.0, 600.0, 1200.0), rate_per_s=(1.0, 3.0, 1.0), name="steps", end_s=1800.0)


def test_trace_shape_is_rescaled_to_the_chosen_mean_rate():
    schedule = TraceShapedSchedule(_step_series(), mean_per_min=30)
    assert schedule.rate_at(0) == pytest.approx(18) and schedule.rate_at(700) == pytest.approx(54)
    arrivals = schedule.sample(1800, _rng(3))
    assert _close(len(arrivals), 30 * 30)
    assert _close(_count(arrivals, 10, 20), 540) and _close(_count(arrivals, 0, 10), 180)


def test_time_scale_compresses_trace_windows_onto_run_minutes():
    # Ten trace minutes per run minute: the busy window is run minute 1.
    schedule = TraceShapedSchedule(_step_series(), mean_per_min=300, time_scale=10)
    assert schedule.coverage_s == 180
    arrivals = schedule.sample(180, _rng(4))
    assert _close(_count(arrivals, 1, 2), 540) and _close(_count(arrivals, 2, 3), 180)


def test_offset_and_span_pick_the_part_whose_mean_is_chosen():
    # From the middle of the quiet first window, over 10 min (5 quiet, 5 busy): mean shape 2.
    schedule = TraceShapedSchedule(_step_series(), mean_per_min=20, start_offset_s=300, span_s=600)
    assert schedule.rate_at(0) == pytest.approx(10) and schedule.rate_at(400) == pytest.approx(30)
    assert _close(len(schedule.sample(600, _rng(6))), 200)


def test_production_trace_mean_is_kept_over_a_two_hour_run():
    schedule = TraceShapedSchedule(load_rate_series("servegen"), mean_per_min=12, time_scale=10, span_s=7200)
    counts = [len(schedule.sample(7200, _rng(seed))) for seed in range(5)]
    assert _close(sum(counts), 5 * 12 * 120)


def test_trace_schedule_errors():
    with pytest.raises(BasinInputError, match="longer than the 1800 s the trace 'steps' covers"):
        TraceShapedSchedule(_step_series(), mean_per_min=5).sample(3600, _rng())
    with pytest.raises(BasinInputError, match="mean_per_min"):
        TraceShapedSchedule(_step_series(), mean_per_min=0)
    with pytest.raises(BasinInputError, match="span_s 4000 is longer"):
        TraceShapedSchedule(_step_series(), mean_per_min=5, span_s=4000)
    with pytest.raises(BasinInputError, match="past the end"):
        TraceShapedSchedule(_step_series(), mean_per_min=5, start_offset_s=1800)
    with pytest.raises(BasinInputError, match="no requests in the chosen span"):
        TraceShapedSchedule(RateSeries((0.0, 60.0), (0.0, 1.0), "late", 120.0), mean_per_min=5, span_s=60)
    with pytest.raises(BasinInputError, match="rates must be >= 0"):
        RateSeries((0.0,), (-1.0,), "neg", 60.0)


# --------------------------------------------------------------------------
# Sessions onto arrivals


@pytest.fixture(scope="module")
def tb() -> Workload:
    return load_agent_table("terminalbench-claude")


@pytest.fixture(scope="module")
def swe() -> Workload:
    return load_agent_table("swebench-deepseek")


def test_arrival_times_do_not_depend_on_the_workload_or_warm_start(tb, swe):
    schedule = PoissonSchedule(3.3, surges=[Surge(15, 25, 4)])
    a = draw_arrivals(tb, schedule, 7200, seed=11)
    b = draw_arrivals(swe, schedule, 7200, seed=11, warm_sessions=42, burst_workload=tb)
    times = [(x.arrival_s, x.tag) for x in a]
    assert times == [(x.arrival_s, x.tag) for x in b if x.tag != "warm"]
    assert times == schedule.sample(7200, np.random.default_rng(np.random.SeedSequence(11).spawn(4)[0]))


def test_base_draws_do_not_depend_on_burst_or_warm_draws(tb, swe):
    schedule = PoissonSchedule(3.3, surges=[Surge(15, 25, 4)])
    def base_sessions(arrivals):  # the drawn sessions, without the suffix that keeps ids unique
        return [x.session.session_id.split("~")[0] for x in arrivals if x.tag == "base"]

    plain = base_sessions(draw_arrivals(tb, schedule, 7200, seed=2))
    other = draw_arrivals(tb, schedule, 7200, seed=2, warm_sessions=10, burst_workload=swe)
    assert base_sessions(other) == plain
    assert all(x.session.session_id.startswith("swe") for x in other if x.tag == "burst")


def test_draws_are_deterministic_and_use_each_session_once_per_pass(tb):
    schedule = PoissonSchedule(60)
    a = draw_arrivals(tb, schedule, 3600, seed=5)
    assert a == draw_arrivals(tb, schedule, 3600, seed=5)
    assert a != draw_arrivals(tb, schedule, 3600, seed=6)
    first_pass = [x.session.session_id for x in a[:171]]
    assert len(set(first_pass)) == 171 and not any("~" in s for s in first_pass)
    ids = [x.session.session_id for x in a]
    assert len(set(ids)) == len(ids)
    assert a[171].session.session_id.endswith("~2")


def test_warm_start_sessions_are_active_mid_trajectory_at_time_zero(tb):
    arrivals = draw_arrivals(tb, PoissonSchedule(3.3), 600, seed=1, warm_sessions=42)
    warm = arrivals[:42]
    assert all(x.tag == "warm" and x.arrival_s == 0.0 for x in warm)
    assert all(x.tag != "warm" for x in arrivals[42:])
    assert all(0 <= x.start_call < x.session.n_calls for x in warm)
    assert np.mean([x.start_call > 0 for x in warm]) > 0.8


def test_warm_start_favours_long_lived_sessions(tb):
    # Steady operation holds sessions in proportion to their lifetime.
    warm = draw_arrivals(tb, PoissonSchedule(1), 60, seed=0, warm_sessions=2000)
    warm = [x for x in warm if x.tag == "warm"]
    tool_s = [sum(c.tool_gap_s for c in x.session.calls) for x in warm]
    assert np.mean(tool_s) > 1.5 * np.mean([sum(c.tool_gap_s for c in s.calls) for s in tb.sessions])


def test_bad_draw_requests_are_input_errors(tb):
    with pytest.raises(BasinInputError, match="warm_sessions"):
        draw_arrivals(tb, PoissonSchedule(1), 60, seed=0, warm_sessions=-1)
    with pytest.raises(BasinInputError, match="duration_s"):
        draw_arrivals(tb, PoissonSchedule(1), 0, seed=0)
