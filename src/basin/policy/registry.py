"""Policies by name. A new policy registers here and needs no engine change."""

from __future__ import annotations

from typing import Callable

from basin.errors import BasinInputError
from basin.policy.base import Policy
from basin.policy.hicache import HiCachePolicy

_FACTORIES: dict[str, Callable[..., Policy]] = {
    HiCachePolicy.name: HiCachePolicy,
}


def policy_names() -> list[str]:
    return sorted(_FACTORIES)


def make_policy(name: str, **params: object) -> Policy:
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise BasinInputError(
            f"unknown system '{name}': use one of {', '.join(policy_names())}"
        ) from None
    try:
        return factory(**params)
    except TypeError as exc:
        raise BasinInputError(f"system '{name}': bad parameters ({exc})") from None


def register(name: str, factory: Callable[..., Policy]) -> None:
    _FACTORIES[name] = factory
