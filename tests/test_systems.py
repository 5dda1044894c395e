"""Building a policy for a run: each class names what it is handed, the run makes exactly that."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from basin.catalog import load_deployment
from basin.policy.base import Handed, Policy
from basin.policy.continuum import ReloadCosts
from basin.policy.params import PolicyParamError, PolicyParams
from basin.policy.registry import _CLASSES, register
from basin.systems import RunContext, build_options, build_policy


@dataclass(frozen=True, slots=True)
class _ToyParams(PolicyParams):
    keep_s: float = 2.0


class _ToyPolicy(Policy):
    """A new policy: its own module would hold exactly this, plus one registry line."""

    name: ClassVar[str] = "toy"
    Params = _ToyParams
    HANDED = frozenset({"reload_costs"})
    built_with: ClassVar[list[Handed]] = []

    @classmethod
    def build(cls, params: PolicyParams, handed: Handed) -> _ToyPolicy:
        cls.built_with.append(handed)
        return cls(params)

    def describe(self) -> dict[str, object]:
        return {"keep_s": self.params.keep_s}  # type: ignore[attr-defined]


@pytest.fixture
def toy():
    register(_ToyPolicy)
    try:
        yield _ToyPolicy
    finally:
        _CLASSES.pop("toy", None)
        _ToyPolicy.built_with.clear()


def test_a_registered_policy_is_built_with_what_it_asks_for_and_nothing_else(toy) -> None:
    dep = load_deployment("1p1d-h100")
    policy = build_policy("toy", {"keep_s": 5.0}, RunContext(deployment=dep))
    assert isinstance(policy, toy) and policy.params.keep_s == 5.0
    (handed,) = toy.built_with
    assert isinstance(handed.reload_costs, ReloadCosts)
    assert handed.cliff is None and handed.predictor is None
    assert build_options("toy") == ()
    assert policy.describe() == {"keep_s": 5.0}
    with pytest.raises(PolicyParamError, match="'toy', parameter 'profile': unknown"):
        build_policy("toy", {"profile": "x.yaml"})


def test_basin_is_handed_its_cliff_and_predictor_and_the_arrival_time_controller_only_its_cliff() -> None:
    dep = load_deployment("1p3d-h200")
    context = RunContext(deployment=dep, workload="terminal-bench")
    basin = build_policy("basin", {"predictor": "growth:1.5"}, context)
    prior = build_policy("basin-prior", {}, context)
    assert build_options("basin") == ("predictor", "profile") and build_options("basin-prior") == ("profile",)
    assert basin.predictor is not None and prior.predictor is None  # type: ignore[attr-defined]
    described = basin.describe()["cliff_profile"]
    assert isinstance(described, dict) and described["origin"].endswith(".yaml")
    assert prior.describe() == basin.describe()
    assert build_policy("hicache").describe() == {}


def test_online_correction_needs_a_predictor_with_a_growth_model() -> None:
    with pytest.raises(PolicyParamError, match="the predictor 'growth:1.5' carries no fitted growth model"):
        build_policy("basin", {"predictor": "growth:1.5", "online_correction": True},
                     RunContext(workload="terminal-bench"))
