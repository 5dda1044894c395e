"""Trace-shaped arrivals in scenarios: ``arrivals.shape`` names a shipped
production rate shape, scaled so that the base rate is the run's mean, with
an optional offset and window into the trace. The session streams are the
Poisson scenarios' own, so runs under different shapes stay paired."""

from __future__ import annotations

import math

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.experiments.plan import arrival_schedule, base_rate_per_min, deployment_for, schedule_for
from basin.experiments.runner import check_runnable, scenario_arrivals
from basin.experiments.scenario import load_scenario
from basin.workload.arrivals import (
    SHIPPED_SHAPES,
    PoissonSchedule,
    TraceShapedSchedule,
    draw_arrivals,
    load_shape,
    shape_minutes,
    shape_names,
    shaped_schedule,
)
from basin.workload.presets import resolve_workload

#: A small pool draws its sessions many times over, which the runner warns of; here that is the point.
pytestmark = pytest.mark.filterwarnings("ignore:workload 'terminal-bench' has only")

#: A small pool and a short run keep the scenario tests quick.
SMALL = ["workload.sessions=60", "surge.factor=1", "duration_min=60", "measure_end_min=45"]


def _shaped(*more: str) -> list[str]:
    return [*SMALL, "arrivals.shape=servegen-m-large", *more]


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed))


def _mean_rate(schedule: TraceShapedSchedule, duration_s: float) -> float:
    """The schedule's mean rate (per minute) over the run, from its steps."""
    edges, rates = schedule._steps
    ends = np.minimum(edges[1:], duration_s)
    within = np.clip(ends - edges[:-1], 0.0, None)
    return float(np.sum(rates * within) / duration_s * 60)


# --------------------------------------------------------------------------
# The shipped shapes


def test_every_shipped_shape_loads_and_names_itself():
    assert shape_names() == sorted(SHIPPED_SHAPES)
    assert {"servegen-m-large", "servegen-m-mid", "servegen-m-small", "servegen-deepseek-r1",
            "servegen-mm-image", "azure-code", "azure-conv"} <= set(shape_names())
    for name in shape_names():
        series = load_shape(name)
        assert series.name == name and max(series.rate_per_s) > 0
    assert shape_minutes("servegen-m-large") == 14 * 24 * 60
    assert shape_minutes("servegen-deepseek-r1") == 24 * 60
    assert shape_minutes("azure-code") == 57


def test_unknown_shape_lists_the_shipped_ones():
    with pytest.raises(BasinInputError, match="unknown arrival shape 'bailian-coder'; the shipped shapes are "
                                              + ", ".join(shape_names())):
        load_shape("bailian-coder")


# --------------------------------------------------------------------------
# The mean holds, the peaks stay where the trace has them


@pytest.mark.parametrize("name, offset, window", [
    ("servegen-m-large", 0.0, None), ("servegen-m-mid", 600.0, 240.0), ("azure-code", 0.0, 57.0),
    ("azure-conv", 10.0, 40.0), ("servegen-deepseek-r1", 300.0, 1440.0 - 300.0),
])
def test_the_base_rate_is_the_mean_over_the_run(name, offset, window):
    schedule = shaped_schedule(name, 15.0, 7200.0, offset, window)
    assert _mean_rate(schedule, 7200.0) == pytest.approx(15.0, rel=1e-9)
    assert schedule.coverage_s >= 7200.0


def test_sampled_arrivals_keep_the_mean():
    schedule = shaped_schedule("servegen-m-large", 12.0, 7200.0, offset_min=1440.0)
    counts = [len(schedule.sample(7200.0, _rng(seed))) for seed in range(6)]
    expected = 6 * 12.0 * 120
    assert abs(sum(counts) - expected) <= 4 * math.sqrt(expected)


def test_peaks_appear_where_the_trace_has_them():
    # Azure code's busiest minute is trace minute 14; 57 trace minutes over a 114-minute run put it
    # at run minutes 28-30, and the quietest stretch (trace minutes 1-2, no requests) at 2-6.
    series = load_shape("azure-code")
    busiest = int(np.argmax(series.rate_per_s))
    assert busiest == 14
    schedule = shaped_schedule("azure-code", 60.0, 114 * 60.0, window_min=57.0)
    times = np.array([t for t, _ in schedule.sample(114 * 60.0, _rng(7))])
    per_two_min = np.bincount((times // 120).astype(int), minlength=57)
    assert int(np.argmax(per_two_min)) == busiest
    assert per_two_min[1] == per_two_min[2] == 0
    # The rate follows the trace's steps exactly, rescaled.
    scale = 60.0 / (float(np.mean(series.rate_per_s)) * 60)
    for minute in (0, 14, 30, 56):
        assert schedule.rate_at(minute * 120 + 60) == pytest.approx(series.rate_per_s[minute] * 60 * scale)


def test_offset_picks_the_part_of_the_trace_the_run_plays():
    series = load_shape("servegen-m-large")
    schedule = shaped_schedule("servegen-m-large", 10.0, 7200.0, offset_min=1440.0)
    rates = np.array(series.rate_per_s[144:156])  # the 12 windows of trace minutes 1440-1560
    expected = rates / rates.mean() * 10.0
    assert [schedule.rate_at(600 * i + 1) for i in range(12)] == pytest.approx(list(expected))


# --------------------------------------------------------------------------
# In scenarios


def test_scenario_arrivals_follow_the_shape_with_the_base_as_mean():
    sc = load_scenario("surge-1p3d", _shaped("arrivals.shape.offset_min=1440", "duration_min=120",
                                             "measure_end_min=90"))
    dep = deployment_for(sc)
    base = base_rate_per_min(sc, dep)
    assert base == pytest.approx(0.5 * 15.6)  # half the critical rate of profiles/basin/1p3d-h200.yaml
    schedule = arrival_schedule(sc, base)
    assert isinstance(schedule, TraceShapedSchedule)
    assert _mean_rate(schedule, 7200.0) == pytest.approx(base)
    arrivals = scenario_arrivals(sc, dep)
    assert abs(len(arrivals) - base * 120) <= 4 * math.sqrt(base * 120)
    assert check_runnable(sc, ["hicache"])[1] == []


def test_same_seed_same_arrivals_and_the_sessions_stay_paired():
    sc = load_scenario("surge-1p3d", _shaped())
    dep = deployment_for(sc)
    first, again = scenario_arrivals(sc, dep), scenario_arrivals(sc, dep)
    assert [(a.arrival_s, a.session.session_id) for a in first] == \
        [(a.arrival_s, a.session.session_id) for a in again]
    other_seed = scenario_arrivals(load_scenario("surge-1p3d", _shaped("seed=1")), dep)
    assert [a.arrival_s for a in other_seed] != [a.arrival_s for a in first]
    # Another shape (or none) moves the arrival times but not the session stream: the k-th arrival
    # gets the same session, so systems and shapes compare on the same sessions.
    other_shape = scenario_arrivals(load_scenario("surge-1p3d", _shaped("arrivals.shape=azure-conv",
                                                                        "arrivals.shape.window_min=55")), dep)
    poisson = scenario_arrivals(load_scenario("surge-1p3d", SMALL), dep)
    for run in (other_shape, poisson):
        n = min(len(run), len(first))
        assert [a.session.session_id for a in run[:n]] == [a.session.session_id for a in first[:n]]
        assert [a.arrival_s for a in run[:n]] != [a.arrival_s for a in first[:n]]


def test_scenarios_without_a_shape_draw_their_poisson_arrivals_as_before():
    sc = load_scenario("surge-1p3d", ["workload.sessions=60", "duration_min=60", "measure_end_min=45"])
    dep = deployment_for(sc)
    assert sc.arrivals.shape is None
    schedule = arrival_schedule(sc, base_rate_per_min(sc, dep))
    assert isinstance(schedule, PoissonSchedule) and schedule == schedule_for(sc, base_rate_per_min(sc, dep))
    workload = resolve_workload("terminal-bench", seed=0, n_sessions=60)
    direct = draw_arrivals(workload, schedule, 3600.0, seed=0)
    drawn = scenario_arrivals(sc, dep, workload)
    assert [(a.arrival_s, a.session.session_id, a.tag) for a in drawn] == \
        [(a.arrival_s, a.session.session_id, a.tag) for a in direct]


def test_shape_by_mapping_and_by_name_are_one_thing():
    by_name = load_scenario("surge-1p3d", _shaped())
    by_fields = load_scenario("surge-1p3d", [*SMALL, "arrivals.shape={name: servegen-m-large, offset_min: 0}"])
    assert by_name == by_fields
    assert by_name.arrivals.shape is not None and by_name.arrivals.shape.window_min is None


# --------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("overrides, message", [
    (_shaped("arrivals.shape=bailian-coder"),
     "field 'arrivals.shape.name': unknown arrival shape 'bailian-coder'; the shipped shapes are azure-code"),
    (_shaped("arrivals.shape.name=servegen-m-lage"), "did you mean servegen-m-large"),
    (_shaped("surge.factor=5"), "a surge on top of it is not supported; set surge.factor to 1"),
    (_shaped("arrivals.rate_changes=[{at_min: 30, per_min: 2}]"), "drop rate_changes"),
    (_shaped("interventions=[{at_min: 30, set_rate_per_min: 2}]"), "set_rate_per_min would be ignored"),
    (_shaped("arrivals.shape=azure-code"),
     "shape 'azure-code' covers 57 trace minutes, so offset_min 0 plus window_min 60 .by default the run's "
     "duration_min, 60. runs past its end; set window_min to at most 57"),
    (_shaped("arrivals.shape.offset_min=20200"), "offset_min 20200 is past the end of shape 'servegen-m-large'"),
    (_shaped("arrivals.shape.window_min=0"), "field 'arrivals.shape.window_min': must be > 0"),
    (_shaped("arrivals.shape.offset_min=-5"), "field 'arrivals.shape.offset_min': must be >= 0"),
    (_shaped("arrivals.shape.speed=2"),
     "a scenario has no field 'arrivals.shape.speed' .fields of arrivals.shape: name, offset_min, window_min."),
])
def test_bad_shapes_are_refused_naming_the_field(overrides, message):
    with pytest.raises(BasinInputError, match=message):
        load_scenario("surge-1p3d", overrides)


def test_a_shape_with_recorded_arrivals_is_refused(tmp_path):
    path = tmp_path / "shaped.yaml"
    path.write_text("name: shaped\ndeployment: 1p3d-h200\narrivals: {from_workload: true, shape: azure-conv}\n")
    with pytest.raises(BasinInputError, match="from_workload has none"):
        load_scenario(str(path))
    with pytest.raises(BasinInputError, match="--set 'arrivals.from_workload=true': field 'arrivals': arrivals.shape "
                                              "shapes a Poisson base rate"):
        load_scenario("trap-1p1d", ["arrivals.from_workload=true", "arrivals.shape=azure-conv"])
    # --set from_workload=true replaces the Poisson base of the file, its shape included.
    path.write_text("name: shaped\ndeployment: 1p3d-h200\nduration_min: 50\nmeasure_end_min: 40\n"
                    "arrivals: {base_per_min: 5, shape: {name: azure-conv, offset_min: 5}}\n")
    assert load_scenario(str(path)).arrivals.shape is not None
    sc = load_scenario(str(path), ["arrivals.from_workload=true"])
    assert sc.arrivals.shape is None and sc.arrivals.from_workload and sc.arrivals.base_per_min is None
    # A shape given by name in the file takes its fields from --set as a section.
    path.write_text("name: shaped\ndeployment: 1p3d-h200\nduration_min: 50\nmeasure_end_min: 40\n"
                    "arrivals: {base_per_min: 5, shape: azure-conv}\n")
    shape = load_scenario(str(path), ["arrivals.shape.offset_min=5"]).arrivals.shape
    assert shape is not None and (shape.name, shape.offset_min) == ("azure-conv", 5.0)


def test_commands_on_a_poisson_base_refuse_a_shaped_scenario():
    sc = load_scenario("surge-1p3d", _shaped())
    with pytest.raises(BasinInputError, match="field 'arrivals.shape': this command takes a Poisson base rate"):
        schedule_for(sc, 5.0)
