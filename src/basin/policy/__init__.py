"""Control policies: the decision interface, BASIN and the baselines. A policy
never knows whether the simulator or the gateway drives it."""

from basin.policy.base import Admission, ControlDecision, EngineNeeds, Policy, SessionInfo, Signals
from basin.policy.registry import make_policy, policy_names

__all__ = [
    "Admission", "ControlDecision", "EngineNeeds", "Policy", "SessionInfo", "Signals",
    "make_policy", "policy_names",
]
