"""``basin-paper``: BASIN with every addition to the paper's Algorithm 1
switched to the paper's behaviour (section 6; docs/basin.md).

Each addition is a flag of ``BasinParams``; every flag is checked here to
change the one decision it is meant to change, in both directions, on small
hand-made signal sequences (``tests/policy_helpers.py``), and ``basin-paper``
is checked to build as ``basin`` does, with the paper's values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pytest
from tests.cli_helpers import run_basin
from tests.policy_helpers import info, signals

from basin.catalog.cliff_profiles import BASIN_PROFILE_DIR
from basin.experiments.plan import deployment_for, params_for, resolved_params
from basin.experiments.scenario import load_scenario
from basin.policy.base import Admission, Signals
from basin.policy.basin import (
    PAPER_BEHAVIOUR,
    BasinPaperParams,
    BasinPaperPolicy,
    BasinParams,
    BasinPolicy,
    CliffSummary,
    GrowthCorrection,
)
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class, policy_names
from basin.systems import RunContext, build_options, build_policy, expand_systems

#: The paper's value of every addition, written out (not read from PAPER_BEHAVIOUR).
PAPER = {
    "budget_past_cap_with_headroom": False,
    "online_correction": False,
    "reserve_quantile": False,
    "floor_peak_at_first_prompt": False,
    "arrivals_bypass_budget_while_draining": False,
}
#: basin's value of each, which keeps its runs as they were.
OURS = {
    "budget_past_cap_with_headroom": True,
    "online_correction": False,
    "reserve_quantile": True,
    "floor_peak_at_first_prompt": True,
    "arrivals_bypass_budget_while_draining": True,
}

# The helpers' cache: C = max(100K GPU, 200K host) = 200K, so B0 = min(0.9 * 1.9 * C, C) = 200K,
# the fixed cap 2 B0 = 400K and the cliff margin m W_c = 342K.
B0 = 200_000
CTX = 10_000  # mean context: W = active * 10K


class Predictor:
    """Point predictions from a table; with ``quantile``, a reservation of
    that many times the point prediction (as a calibrated predictor states)."""

    def __init__(self, peaks: Mapping[str, float], default: float = 50_000):
        self.peaks = peaks
        self.default = default

    def predict_peak_tokens(self, task_text, first_prompt_tokens, session_id, oracle_peak_tokens):
        return self.peaks.get(session_id, self.default)


class QuantilePredictor(Predictor):
    def reserve_peak_tokens(self, task_text, first_prompt_tokens, session_id, oracle_peak_tokens):
        return 2 * self.predict_peak_tokens(task_text, first_prompt_tokens, session_id, oracle_peak_tokens)


def sig(now: float, active: int = 5, hit: float = 0.95, backlog: int = 0) -> Signals:
    return signals(now, active_sessions=active, mean_context_tokens=float(CTX), working_set_tokens=active * CTX,
                   hit_rate=hit, prefill_backlog_tokens=backlog)


def make(cls: type[BasinPolicy] = BasinPaperPolicy, peaks: Mapping[str, float] | None = None,
         predictor: Predictor | None = None, correction: GrowthCorrection | None = None, **params) -> BasinPolicy:
    return cls(cls.Params(**params), predictor=predictor or Predictor(peaks or {}),
               cliff=CliffSummary(kappa=1.0, x_knee=1.9, lambda_c_per_min=5.0), correction=correction)


def engage(p: BasinPolicy) -> None:
    """Learn the plateau (no control), admit s0, then engage admission (W = 220K >= B0)."""
    p.control(sig(0.0, active=5), [])
    assert p.on_session_arrival(info(0, 1.0), sig(1.0)) is Admission.ADMIT
    p.control(sig(5.0, active=22), [])
    assert p.state.admit and p.state.b0 == B0 and p.state.budget == B0


# ------------------------------------------------------------------ building
def test_basin_paper_is_registered_and_builds_with_the_paper_values():
    assert "basin-paper" in policy_names() and policy_class("basin-paper") is BasinPaperPolicy
    assert "basin-paper" in expand_systems(["all"])  # basin compare --system all runs it
    assert build_options("basin-paper") == build_options("basin") == ("predictor", "profile")
    assert PAPER_BEHAVIOUR == PAPER
    paper = build_policy("basin-paper", {"predictor": "growth:1.5"})
    ours = build_policy("basin", {"predictor": "growth:1.5"})
    assert type(paper) is BasinPaperPolicy and paper.name == "basin-paper"
    assert type(ours) is BasinPolicy
    p_values, o_values = paper.params.as_dict(), ours.params.as_dict()
    assert {k: p_values[k] for k in PAPER} == PAPER
    assert {k: o_values[k] for k in OURS} == OURS
    # Everything else is basin's: the section 6.6 parameters and the implementation settings.
    assert {k: v for k, v in p_values.items() if k not in PAPER} == {k: v for k, v in o_values.items()
                                                                       if k not in PAPER}
    assert BasinParams().as_dict() == o_values  # basin's defaults did not move
    assert type(paper.predictor) is type(ours.predictor)
    assert paper.needs == ours.needs


def test_basin_paper_is_handed_the_same_cliff_profile_and_predictor_as_basin():
    sc = load_scenario("main-1p3d-gpuonly")
    context = RunContext(deployment=deployment_for(sc), workload=sc.workload.name, host_ratio=sc.host_ratio)
    paper = build_policy("basin-paper", {"predictor": "oracle"}, context)
    ours = build_policy("basin", {"predictor": "oracle"}, context)
    assert isinstance(paper, BasinPaperPolicy) and isinstance(ours, BasinPolicy)
    assert paper.cliff == ours.cliff and paper.cliff.origin.endswith("1p3d-h200-gpu-only.yaml")
    assert type(paper.predictor).__name__ == type(ours.predictor).__name__ == "OraclePredictor"
    chosen = str(BASIN_PROFILE_DIR / "1p1d-h100.yaml")
    paper = build_policy("basin-paper", {"predictor": "oracle", "profile": chosen}, context)
    ours = build_policy("basin", {"predictor": "oracle", "profile": chosen}, context)
    assert isinstance(paper, BasinPaperPolicy) and isinstance(ours, BasinPolicy)
    assert paper.cliff == ours.cliff and paper.cliff.origin == chosen


def test_policy_params_reach_basin_paper_as_they_reach_basin():
    sc = load_scenario("trap-1p1d", ["policy_params.reserve_quantile=true", "policy_params.margin=0.8",
                                     "policy_params.predictor=oracle"])
    split = params_for(sc, ["basin", "basin-paper"])
    assert split.notes == ()
    assert split.given["basin-paper"] == split.given["basin"] == {"reserve_quantile": True, "margin": 0.8,
                                                                   "predictor": "oracle"}
    resolved = resolved_params("basin-paper", split.given["basin-paper"])
    assert resolved["reserve_quantile"] is True and resolved["margin"] == 0.8 and resolved["predictor"] == "oracle"
    assert {k: resolved[k] for k in PAPER if k != "reserve_quantile"} == {k: v for k, v in PAPER.items()
                                                                          if k != "reserve_quantile"}


def test_basin_run_runs_basin_paper_with_a_set_flag(capsys, tmp_path):
    short = ["--set", "duration_min=20", "--set", "measure_end_min=15", "--set", "surge.start_min=3",
             "--set", "surge.end_min=6"]
    code, out, err = run_basin(capsys, "run", "trap-1p1d", "--system", "basin-paper", "--set",
                               "policy_params.floor_peak_at_first_prompt=true", *short, "--json", "--no-plots",
                               "--out", str(tmp_path))
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["system"] == "basin-paper"
    prov = json.loads((tmp_path / "provenance.json").read_text())
    ran = prov["systems"]["basin-paper"]["policy_params"]
    assert ran["floor_peak_at_first_prompt"] is True
    assert {k: ran[k] for k in PAPER if k != "floor_peak_at_first_prompt"} == {
        k: v for k, v in PAPER.items() if k != "floor_peak_at_first_prompt"}
    assert prov["systems"]["basin-paper"]["cliff_profile"]["origin"].endswith("1p1d-h100.yaml")


# ----------------------------------------------------- each flag, one decision
def _capped_run(p: BasinPolicy) -> tuple[list[float], bool]:
    """s0 reserves 150K; s1 (400K) waits, fitting only a budget of 550K, past
    the fixed cap; W = 220K is below the cliff margin, reuse on its plateau,
    no backlog: the engine has headroom. Returns the budgets and whether s1
    was released."""
    engage(p)
    assert p.on_session_arrival(info(1, 6.0), sig(6.0, active=22)) is Admission.PARK
    budgets = []
    for t in range(10, 300, 5):
        d = p.control(sig(float(t), active=22), [1])
        budgets.append(p.state.budget)
        if d.release:
            assert d.release == (1,)
            return budgets, True
    return budgets, False


@pytest.mark.parametrize("cls", [BasinPolicy, BasinPaperPolicy])
def test_budget_past_cap_with_headroom_decides_whether_a_session_beyond_2_b0_enters(cls):
    peaks = {"s0": 150_000, "s1": 400_000}
    fixed, released = _capped_run(make(cls, peaks, cooldown_s=10_000.0, budget_past_cap_with_headroom=False))
    assert not released and max(fixed) == 2 * B0  # the paper's bounded range
    lifted, released = _capped_run(make(cls, peaks, cooldown_s=10_000.0, budget_past_cap_with_headroom=True))
    assert released and lifted[-1] >= 550_000 > 2 * B0
    # basin-paper's default is the fixed range.
    assert not _capped_run(make(BasinPaperPolicy, peaks, cooldown_s=10_000.0))[1]


@pytest.mark.parametrize("cls", [BasinPolicy, BasinPaperPolicy])
def test_reserve_quantile_decides_what_a_session_holds_against_the_budget(cls):
    # Point predictions of 60K, quantiles of 120K: with B = B0 = 200K two point
    # reservations fit (120K), two quantiles do not (240K).
    verdicts = {}
    for on in (False, True):
        p = make(cls, predictor=QuantilePredictor({"s0": 60_000, "s1": 60_000}), reserve_quantile=on)
        engage(p)
        verdicts[on] = p.on_session_arrival(info(1, 6.0), sig(6.0, active=22))
        # Off: both residents at 60K; on: s0 alone, at its 120K quantile.
        assert (p.state.residents, p.state.reserved) == ((1, 120_000) if on else (2, 120_000))
        assert p.priority_key(1) == 6.0 + 60_000 / 30.0  # the priority keeps the point prediction
    assert verdicts == {False: Admission.ADMIT, True: Admission.PARK}
    paper = make(BasinPaperPolicy, predictor=QuantilePredictor({"s0": 60_000}))
    paper.on_session_arrival(info(0, 1.0), sig(1.0))
    assert paper.state.reserved == 60_000  # basin-paper reserves the point prediction


@pytest.mark.parametrize("cls", [BasinPolicy, BasinPaperPolicy])
def test_floor_peak_at_first_prompt_decides_the_priority_order(cls):
    # s1 sent a 30K first prompt but is predicted to peak at 1K; s2 (5K, 5K) arrives later.
    keys, reserved = {}, {}
    for on in (False, True):
        p = make(cls, {"s1": 1_000, "s2": 5_000}, floor_peak_at_first_prompt=on)
        p.on_session_arrival(info(1, 0.0, prompt=30_000), sig(0.0))
        p.on_session_arrival(info(2, 100.0, prompt=5_000), sig(100.0))
        keys[on] = (p.priority_key(1), p.priority_key(2))
        reserved[on] = p.state.reserved
    assert keys[False] == (0.0 + 1_000 / 30.0, 100.0 + 5_000 / 30.0)  # the prediction as it comes: s1 first
    assert keys[True] == (0.0 + 30_000 / 30.0, 100.0 + 5_000 / 30.0)  # raised to its prompt: s2 first
    assert keys[False][0] < keys[False][1] and keys[True][0] > keys[True][1]
    assert reserved == {False: 6_000, True: 35_000}
    # The quantile a predictor reserves is floored (or not) alike.
    for on, expected in ((False, 2_000), (True, 30_000)):
        p = make(cls, predictor=QuantilePredictor({"s1": 1_000}), reserve_quantile=True,
                 floor_peak_at_first_prompt=on)
        p.on_session_arrival(info(1, 0.0, prompt=30_000), sig(0.0))
        assert p.state.reserved == expected


def _draining(p: BasinPolicy) -> None:
    """Admission engaged with s1 parked (it fits no budget), then released
    (W below alpha_R B0 for the cool-down) while s1 still waits: B = 1.1 B0."""
    engage(p)
    assert p.on_session_arrival(info(1, 6.0), sig(6.0, active=22)) is Admission.PARK
    p.control(sig(20.0, active=5), [1])
    assert not p.state.admit and math.isclose(p.state.budget, 1.1 * B0)


@pytest.mark.parametrize("cls", [BasinPolicy, BasinPaperPolicy])
def test_arrivals_bypass_budget_while_draining_decides_whether_a_newcomer_skips_the_budget(cls):
    peaks = {"s0": 150_000, "s1": 10 ** 12, "s2": 100_000, "s3": 50_000}
    verdicts = {}
    for on in (False, True):
        p = make(cls, peaks, cooldown_s=10.0, arrivals_bypass_budget_while_draining=on)
        _draining(p)
        # s2 precedes s1; 150K + 100K exceeds B = 220K.
        verdicts[on] = p.on_session_arrival(info(2, 21.0), sig(21.0))
        # s3 precedes both and fits (150K + 50K): it enters under either rule.
        assert p.on_session_arrival(info(3, 22.0), sig(22.0)) is Admission.ADMIT
    assert verdicts == {False: Admission.PARK, True: Admission.ADMIT}
    # While admission is engaged the two rules are one: the budget decides.
    for on in (False, True):
        p = make(cls, {"s0": 150_000, "s2": 100_000}, cooldown_s=10.0, arrivals_bypass_budget_while_draining=on)
        engage(p)
        assert p.on_session_arrival(info(2, 6.0), sig(6.0, active=22)) is Admission.PARK


@pytest.mark.parametrize("cls", [BasinPolicy, BasinPaperPolicy])
def test_online_correction_decides_whether_a_reservation_is_revised(cls):
    # log R = log(1 + c) + log 2: twice the context so far.
    corr = GrowthCorrection(intercept=math.log(2), coef_context=1.0, coef_calls=0.0, coef_initial=0.0)
    for on in (False, True):
        p = make(cls, {"s1": 50_000}, correction=corr, online_correction=on)
        p.on_session_arrival(info(1, 0.0), sig(0.0))
        key = p.priority_key(1)
        p.on_call_finished(1, 100_000, False, 5.0)
        assert math.isclose(p.state.reserved, 2 * 100_001 if on else 50_000)
        assert p.priority_key(1) == key
    paper = make(BasinPaperPolicy, {"s1": 50_000}, correction=corr)
    paper.on_session_arrival(info(1, 0.0), sig(0.0))
    paper.on_call_finished(1, 100_000, False, 5.0)
    assert paper.state.reserved == 50_000  # basin-paper keeps the fixed reservation


def test_every_addition_has_a_decision_test_here():
    tested = {"budget_past_cap_with_headroom", "reserve_quantile", "floor_peak_at_first_prompt",
              "arrivals_bypass_budget_while_draining", "online_correction"}
    assert set(PAPER_BEHAVIOUR) == tested


# ------------------------------------------------------------- bad values
@pytest.mark.parametrize(("field", "value", "message"), [
    ("budget_past_cap_with_headroom", "false", "expected true or false"),
    ("online_correction", 0, "expected true or false"),
    ("reserve_quantile", "yes", "expected true or false"),
    ("floor_peak_at_first_prompt", 1, "expected true or false"),
    ("arrivals_bypass_budget_while_draining", None, "expected true or false"),
    ("margin", 0.0, "must be in (0, 1]"),
    ("budget_high", 0.1, "must be >= budget_low"),
    ("backlog_ticks", 0, "must be >= 1"),
])
def test_bad_values_are_refused_naming_the_field(field, value, message):
    with pytest.raises(PolicyParamError) as exc:
        BasinPaperParams(**{field: value})
    assert exc.value.field == field and exc.value.policy == "basin-paper"
    assert f"policy 'basin-paper', parameter '{field}'" in str(exc.value) and message in str(exc.value)
    with pytest.raises(PolicyParamError, match=f"parameter '{field}'"):
        build_policy("basin-paper", {"predictor": "oracle", field: value})
    sc = load_scenario("trap-1p1d", [f"policy_params.{field}={json.dumps(value)}"])
    with pytest.raises(PolicyParamError) as exc:
        params_for(sc, ["basin-paper"])
    assert exc.value.field == field and exc.value.policy == "basin-paper"


def test_bad_names_options_and_changes_are_refused_naming_the_field():
    with pytest.raises(PolicyParamError, match=r"'basin-paper', parameter 'reserve_quantiles': unknown; "
                                               r"known parameters: .*reserve_quantile.*predictor, profile"):
        build_policy("basin-paper", {"reserve_quantiles": True})
    with pytest.raises(PolicyParamError, match="'basin-paper', parameter 'predictor': expected text"):
        build_policy("basin-paper", {"predictor": 3})
    with pytest.raises(PolicyParamError, match="'basin-paper', parameter 'online_correction'.*ridge:q=0.9"):
        build_policy("basin-paper", {"predictor": "oracle", "online_correction": True})
    with pytest.raises(TypeError, match="takes BasinPaperParams"):
        BasinPaperPolicy(BasinParams())
    p = build_policy("basin-paper", {"predictor": "oracle"})
    with pytest.raises(PolicyParamError, match="parameter 'reserve_quantile'"):
        p.update_params(reserve_quantile="on")
    assert p.params == BasinPaperParams()  # the old settings stay
    assert p.update_params(reserve_quantile=True) == BasinPaperParams(reserve_quantile=True)


@pytest.mark.parametrize("cls", [BasinPolicy, BasinPaperPolicy])
def test_a_flag_changed_between_decisions_takes_effect(cls):
    p = make(cls, {"s0": 150_000, "s1": 10 ** 12, "s2": 100_000}, cooldown_s=10.0,
             arrivals_bypass_budget_while_draining=False)
    _draining(p)
    p.update_params(arrivals_bypass_budget_while_draining=True)
    assert p.on_session_arrival(info(2, 21.0), sig(21.0)) is Admission.ADMIT
