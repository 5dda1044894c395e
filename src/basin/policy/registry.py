"""Policies by name. A new policy adds its class to ``_CLASSES`` (one line)
and needs no other change: its class says what it is built with
(``Policy.HANDED``) and builds itself (``Policy.build``); :mod:`basin.systems`
makes those ingredients for a run (docs/architecture.md, "Adding a policy")."""

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
