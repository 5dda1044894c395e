"""Which policies a gateway runs: it reads each policy's engine needs and
refuses, at start, those that need a mechanism only an engine provides."""

from __future__ import annotations

import pytest

from basin.errors import BasinInputError
from basin.gateway.config import GatewayConfig
from basin.gateway.server import build_policy, gateway_policies
from cli_helpers import run_basin

UPSTREAM = "http://127.0.0.1:9"


def test_the_gateway_runs_the_policies_an_unmodified_engine_can_serve() -> None:
    assert gateway_policies() == ["basin", "basin-paper", "basin-prior", "concur", "hicache", "thunderagent"]


@pytest.mark.parametrize("policy, mechanism", [
    ("crossflow", "prefill on decode instances"),
    ("composition", "prefill on decode instances"),
    ("continuum", "prefix-cache TTL pins"),
])
def test_policies_needing_the_engine_are_refused_naming_the_mechanism(policy: str, mechanism: str) -> None:
    with pytest.raises(BasinInputError, match=f"policy '{policy}' needs .*{mechanism}.* use one of basin, "):
        build_policy(GatewayConfig(upstream=UPSTREAM, policy=policy))


def test_basin_runs_without_lending_and_an_explicit_request_for_it_is_refused() -> None:
    policy = build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin"))
    assert policy.needs.required() == ()
    assert policy.needs.preferred() == ("decode reservation at prefill completion",)
    with pytest.raises(BasinInputError, match="decode-memory lending"):
        build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin", policy_params={"lending": True}))


def test_wrong_parameters_are_refused_at_start() -> None:
    with pytest.raises(BasinInputError, match="parameter 'budget_high': expected a number, got '1,0'"):
        build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin", policy_params={"budget_high": "1,0"}))
    with pytest.raises(BasinInputError, match=r"parameter 'context_smoothing_s': must be in \(0, 604800\]"):
        build_policy(GatewayConfig(upstream=UPSTREAM, policy="basin", policy_params={"context_smoothing_s": 0}))


def test_the_command_refuses_crossflow_before_listening(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_basin(capsys, "gateway", "--upstream", UPSTREAM, "--policy", "crossflow")
    assert code == 2
    assert "policy 'crossflow' needs prefill on decode instances inside the engine" in err
    assert "Traceback" not in err
