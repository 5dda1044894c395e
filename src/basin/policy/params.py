"""Policy parameters: one frozen, self-checking dataclass per policy.

Every policy keeps its settings in a :class:`PolicyParams` subclass, so a run
records exactly what it ran with, a wrong type or an out-of-range value is
refused when the policy is built (never halfway through a run), and drivers
change settings only through :meth:`PolicyParams.with_params`, which checks
the new values the same way.

A subclass declares its fields with type hints (``bool``, ``int``,
``float``, ``str``, ``Literal[...]``, optionally ``| None``) and states its
ranges in :meth:`PolicyParams.check` with :meth:`PolicyParams.require`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin

from basin.errors import BasinInputError

P = TypeVar("P", bound="PolicyParams")


class PolicyParamError(BasinInputError):
    """A policy parameter of the wrong type, out of range, or unknown."""

    def __init__(self, policy: str, field: str, message: str):
        super().__init__(f"policy '{policy}', parameter '{field}': {message}")
        self.policy = policy
        self.field = field


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyParams:
    """Base of every policy's parameters (no fields of its own)."""

    #: The registry name of the policy these parameters belong to (for messages).
    policy: ClassVar[str] = "policy"

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            checked = _checked(self.policy, f.name, hints[f.name], value)
            if checked is not value:
                object.__setattr__(self, f.name, checked)
        self.check()

    def check(self) -> None:
        """Ranges and relations between fields; subclasses override."""

    def require(self, condition: bool, field: str, message: str) -> None:
        if not condition:
            raise PolicyParamError(self.policy, field, f"{message} (got {getattr(self, field)!r})")

    # ------------------------------------------------------------ building
    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls: type[P], values: Mapping[str, object] | None = None) -> P:
        """Parameters from a mapping (a scenario's ``policy_params``, CLI
        flags, an admin request); unknown names are refused with the list of
        known ones."""
        values = dict(values or {})
        _refuse_unknown(cls, values)
        return cls(**values)

    def with_params(self: P, **changes: object) -> P:
        """A copy with ``changes`` applied, checked like a new instance."""
        _refuse_unknown(type(self), changes)
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _refuse_unknown(cls: type[PolicyParams], values: Mapping[str, object]) -> None:
    known = cls.names()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise PolicyParamError(cls.policy, unknown[0],
                               f"unknown; known parameters: {', '.join(known) or '(none)'}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _checked(policy: str, name: str, hint: Any, value: object) -> object:
    """``value`` if it is of type ``hint`` (an int where a float is expected
    becomes that float), else a :class:`PolicyParamError` naming the field."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        if len(inner) == 1:
            return _checked(policy, name, inner[0], value)
        raise TypeError(f"{name}: unions of several types are not supported in policy parameters")
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise PolicyParamError(policy, name, f"must be one of {', '.join(repr(c) for c in choices)}, "
                                                 f"got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise PolicyParamError(policy, name, f"expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyParamError(policy, name, f"expected a whole number, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PolicyParamError(policy, name, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise PolicyParamError(policy, name, f"expected a finite number, got {value!r}")
        return float(value) if isinstance(value, int) else value
    if hint is str:
        if not isinstance(value, str):
            raise PolicyParamError(policy, name, f"expected text, got {value!r}")
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if isinstance(value, Mapping):
            if issubclass(hint, PolicyParams):
                return hint.from_mapping(value)
            try:
                return hint(**value)
            except TypeError as exc:
                raise PolicyParamError(policy, name, str(exc)) from None
        raise PolicyParamError(policy, name, f"expected a mapping of {hint.__name__} fields, got {value!r}")
    raise TypeError(f"{name}: type {hint!r} is not supported in policy parameters")
