"""Control policies: the decision interface, BASIN and the baselines, and the
one driver that feeds them. A policy never knows whether the simulator, the
emulator or the gateway drives it, and never reads a file: what it needs
(a predictor, a cliff summary, engine costs) is handed to it."""

from basin.policy.base import (
    Admission,
    BorrowSettings,
    ControlDecision,
    EngineNeeds,
    Policy,
    SessionInfo,
    Signals,
)
from basin.policy.params import PolicyParamError, PolicyParams
from basin.policy.registry import policy_class, policy_names

__all__ = [
    "Admission", "BorrowSettings", "ControlDecision", "EngineNeeds", "Policy", "PolicyParamError",
    "PolicyParams", "SessionInfo", "Signals", "policy_class", "policy_names",
]
