"""``basin vulnerable``: the fluid model's answer for a deployment at a load,
and (marked ``scenario``) the simulator's agreement with the surge it names."""

from __future__ import annotations

import json

import pytest
from tests.cli_helpers import run_basin

from basin.cli.vulnerable import assess, simulate


def test_a_load_inside_the_band_is_vulnerable_with_a_named_surge_and_budget():
    r = assess("1p1d-h100", rate=3.3)
    assert r.verdict == "vulnerable" and r.first_limit == "cache"
    assert r.band_per_min[0] < 3.3 < r.band_per_min[1]
    assert r.n_stable is not None and r.n_unstable is not None and r.n_stable < r.n_unstable
    assert r.named_surge is not None and 1.5 < r.named_surge["factor"] < 2.5  # docs/fluid-model.md: about +91%
    factors = [s["factor"] for s in r.surges]
    assert factors == sorted(factors, reverse=True)  # a longer surge traps at a smaller factor
    assert r.admission is not None and r.admission["budget_sessions"] < r.n_unstable
    assert r.admission["outcome_named_surge"] != "trapped"
    assert r.admission["outcome_three_times_excess"] != "trapped"


def test_below_the_band_it_is_safe_and_above_it_overloaded():
    safe = assess("1p1d-h100", rate=1.0)
    assert safe.verdict == "safe" and safe.named_surge is None and "drains" in safe.reason
    over = assess("1p1d-h100", rate=6.0)
    assert over.verdict == "overloaded" and over.n_stable is None


def test_the_default_load_comes_from_the_critical_rate_when_there_is_one():
    r = assess("1p3d-h200")
    assert r.rate_per_min == pytest.approx(0.5 * 15.6) and "profiles/basin/1p3d-h200.yaml" in r.rate_origin


def test_cli_answers_in_words_and_json(capsys):
    code, out, _ = run_basin(capsys, "vulnerable", "1p1d-h100", "--rate", "3.3")
    assert code == 0 and "VULNERABLE" in out and "keep it out" in out and "tipping" in out
    code, out, _ = run_basin(capsys, "vulnerable", "2P4D-h100-nvl", "--host-ratio", "4", "--json")
    data = json.loads(out)
    assert code == 0 and data["verdict"] in ("vulnerable", "safe", "overloaded") and data["host_ratio"] == 4


def test_bad_input_is_refused_with_the_field(capsys):
    code, _, err = run_basin(capsys, "vulnerable", "1p1d-h100", "--rate", "-1")
    assert code == 2 and "--rate" in err
    code, _, err = run_basin(capsys, "vulnerable", "1p1d-h10")
    assert code == 2 and "did you mean 1p1d-h100" in err
    code, _, err = run_basin(capsys, "vulnerable", "1p1d-h100", "--host-ratio", "-2")
    assert code == 2 and "host_ratio" in err


def test_the_engine_scheduling_policy_is_an_input(capsys):
    r = assess("1p1d-h100", rate=3.3)
    assert (r.schedule_policy, r.schedule_policy_origin) == ("fcfs", "the hardware profile's prefill.schedule_policy")
    lpm = assess("1p1d-h100", rate=3.3, schedule_policy="lpm")
    assert lpm.schedule_policy == "lpm" and lpm.verdict == r.verdict  # the model's answer is fcfs's
    code, out, _ = run_basin(capsys, "vulnerable", "1p1d-h100", "--rate", "3.3", "--schedule-policy", "lpm")
    text = " ".join(out.split())
    assert code == 0 and "engine scheduling: lpm (given (--schedule-policy))" in text
    assert "so this verdict is fcfs's" in text
    code, out, _ = run_basin(capsys, "vulnerable", "1p1d-h100", "--json")
    assert code == 0 and json.loads(out)["schedule_policy"] == "fcfs"


def test_a_bad_or_inapplicable_schedule_policy_is_refused(capsys):
    code, _, err = run_basin(capsys, "vulnerable", "1p1d-h100", "--schedule-policy", "sjf")
    assert code == 2 and "--schedule-policy 'sjf': expected one of fcfs or lpm" in err
    code, _, err = run_basin(capsys, "vulnerable", "1C-h100-nvl", "--schedule-policy", "lpm")
    assert code == 2 and "colocated" in err and "use fcfs" in err


@pytest.mark.scenario
def test_under_lpm_the_named_surge_does_not_trap_the_simulator():
    """The fluid model assumes first-come order; the simulator under SGLang's
    LPM keeps the named surge's seed 1 (trapped under fcfs, below) healthy."""
    r = assess("1p1d-h100", rate=3.3, schedule_policy="lpm")
    assert [s["state"] for s in simulate(r, (1,))] == ["healthy"]


@pytest.mark.scenario
def test_the_named_surge_traps_in_the_simulator_and_half_its_excess_does_not():
    """1P1D H100 GPU-only at 3.3/min: the model names a surge of about x2.1
    for 10 min. The simulator traps at it (5 of 5 seeds from the model's N_s;
    docs/vulnerable.md), and half the excess recovers (5 of 5; required: most
    of them). About 20 s."""
    r = assess("1p1d-h100", rate=3.3)
    assert r.named_surge is not None
    f = r.named_surge["factor"]
    assert [s["state"] for s in simulate(r, (1,))] == ["trapped"]
    smaller = 1.0 + (f - 1.0) / 2
    states = [s["state"] for s in simulate(r, range(5), factor=smaller)]
    assert states.count("healthy") >= 3


@pytest.mark.scenario
def test_every_shipped_deployment_gets_an_answer():
    """About 25 s: the 10-minute surge's bisection for every shipped deployment."""
    from basin.paths import PROFILE_DIR

    for path in sorted((PROFILE_DIR / "deployments").glob("*.yaml")):
        r = assess(path.stem, durations=())
        assert r.verdict in ("vulnerable", "safe", "overloaded"), path.stem
        assert r.first_limit in ("cache", "decode")
