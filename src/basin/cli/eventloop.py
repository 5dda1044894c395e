"""The event loop the network commands run on: uvloop where it is installed (a
dependency on Linux and macOS), else asyncio's own. The gateway, the emulator and
the replay client are each one event loop on every call's path, so the faster
loop is worth having in all three."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on uvloop when it is available."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result
