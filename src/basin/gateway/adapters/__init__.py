"""Engine adapters by name: the one list of the engines the gateway fronts.

:data:`ADAPTERS` is read by everything that names an engine: the config's
``engine`` field (:data:`EngineName`), the ``--engine`` help of ``basin
gateway`` and :func:`make_adapter`. A new engine is a module in this package
and one entry here.

Each adapter class is named by its import path and loaded on first use, so
reading the names (every ``basin`` command builds the gateway's --help) does
not import aiohttp and the metrics parser.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal

from basin.errors import BasinInputError, where

if TYPE_CHECKING:
    from basin.gateway.adapters.base import EngineAdapter

#: Engine name -> ``module:class`` of its adapter (the class's ``name`` is the key).
ADAPTERS: dict[str, str] = {
    "sglang": "basin.gateway.adapters.sglang:SGLangAdapter",
    "vllm": "basin.gateway.adapters.vllm:VLLMAdapter",
    "llamacpp": "basin.gateway.adapters.llamacpp:LlamaCppAdapter",
    "openai": "basin.gateway.adapters.generic:OpenAIAdapter",
}

#: The engine names, in the registry's order.
ENGINES: tuple[str, ...] = tuple(ADAPTERS)

#: The config's type for an engine name (validation errors list the names in order).
EngineName = Literal[ENGINES]  # type: ignore[valid-type]


def engine_key(engine: object) -> str:
    """The registry key of ``engine`` (case and surrounding blanks ignored); unknown names raise
    :class:`BasinInputError` listing the known ones."""
    key = engine.strip().lower() if isinstance(engine, str) else None
    if key not in ADAPTERS:
        raise BasinInputError(
            f"{where(field='engine')}: unknown engine {engine!r}; expected one of {', '.join(ENGINES)}"
        )
    return key


def adapter_class(engine: str) -> type[EngineAdapter]:
    """The adapter class registered for ``engine``."""
    module, _, name = ADAPTERS[engine_key(engine)].partition(":")
    return getattr(importlib.import_module(module), name)


def make_adapter(engine: str, *, low_priority_first: bool | None = None) -> EngineAdapter:
    """A fresh adapter for ``engine``; ``low_priority_first`` only applies to SGLang (its direction flag)."""
    return adapter_class(engine).create(low_priority_first=low_priority_first)


def engines_help() -> str:
    """The engine names as a sentence, for help texts: ``a, b, c or d``."""
    *head, last = ENGINES
    return f"{', '.join(head)} or {last}" if head else last
