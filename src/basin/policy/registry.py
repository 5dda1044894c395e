"""Policies by name. A new policy registers here and needs no engine change."""

from __future__ import annotations

import inspect
from typing import Callable

from basin.errors import BasinInputError
from basin.policy.base import Policy
from basin.policy.basin import BasinPolicy, BasinPriorPolicy, make_basin, make_basin_prior
from basin.policy.composition import CompositionPolicy
from basin.policy.concur import ConcurPolicy
from basin.policy.continuum import ContinuumPolicy
from basin.policy.crossflow import CrossflowPolicy
from basin.policy.hicache import HiCachePolicy
from basin.policy.thunderagent import ThunderAgentPolicy

_FACTORIES: dict[str, Callable[..., Policy]] = {
    HiCachePolicy.name: HiCachePolicy,
    ContinuumPolicy.name: ContinuumPolicy,
    ThunderAgentPolicy.name: ThunderAgentPolicy,
    ConcurPolicy.name: ConcurPolicy,
    CrossflowPolicy.name: CrossflowPolicy,
    CompositionPolicy.name: CompositionPolicy,
    BasinPolicy.name: make_basin,
    BasinPriorPolicy.name: make_basin_prior,
}


def policy_names() -> list[str]:
    return sorted(_FACTORIES)


def make_policy(name: str, context: dict[str, object] | None = None, **params: object) -> Policy:
    """A policy by name. ``context`` carries what a run knows (deployment,
    workload); a factory receives the entries its signature asks for."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise BasinInputError(
            f"unknown system '{name}': use one of {', '.join(policy_names())}"
        ) from None
    if context:
        accepted = inspect.signature(factory).parameters
        params = {**{k: v for k, v in context.items() if k in accepted}, **params}
    try:
        return factory(**params)
    except TypeError as exc:
        raise BasinInputError(f"system '{name}': bad parameters ({exc})") from None


def register(name: str, factory: Callable[..., Policy]) -> None:
    _FACTORIES[name] = factory
