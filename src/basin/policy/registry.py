"""Policies by name. A new policy registers its class here and needs no
engine change; building one for a run (its predictor, its cliff profile, the
deployment's costs) is :mod:`basin.systems`' job, not the registry's."""

from __future__ import annotations

from basin.errors import BasinInputError
from basin.policy.base import Policy
from basin.policy.basin import BasinPaperPolicy, BasinPolicy, BasinPriorPolicy
from basin.policy.composition import CompositionPolicy
from basin.policy.concur import ConcurPolicy
from basin.policy.continuum import ContinuumPolicy
from basin.policy.crossflow import CrossflowPolicy
from basin.policy.hicache import HiCachePolicy
from basin.policy.thunderagent import ThunderAgentPolicy

_CLASSES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (HiCachePolicy, ContinuumPolicy, ThunderAgentPolicy, ConcurPolicy, CrossflowPolicy,
                CompositionPolicy, BasinPolicy, BasinPriorPolicy, BasinPaperPolicy)
}


def policy_names() -> list[str]:
    return sorted(_CLASSES)


def policy_class(name: str) -> type[Policy]:
    try:
        return _CLASSES[name]
    except KeyError:
        raise BasinInputError(f"unknown system '{name}': use one of {', '.join(policy_names())}") from None


def register(cls: type[Policy]) -> None:
    """Add a policy class under its ``name`` (plug-ins and tests)."""
    _CLASSES[cls.name] = cls
