"""Starting an emulator in the test's own event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from basin.emulate.config import EmulatorConfig
from basin.emulate.server import EmulatorServer


@asynccontextmanager
async def emulator(**fields: Any) -> AsyncIterator[tuple[EmulatorServer, aiohttp.ClientSession]]:
    cfg = {"deployment": "1p3d-h200", "speed": 50.0, "listen_port": 0, **fields}
    server = EmulatorServer(EmulatorConfig(**cfg))
    await server.start()
    client = aiohttp.ClientSession()
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def events(raw: bytes) -> list[str]:
    """The data payloads of an SSE stream, in order."""
    return [e[len("data: "):] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


def last_json(raw: bytes) -> dict:
    """The last JSON event of a stream (the usage chunk when usage was asked for)."""
    payloads = [p for p in events(raw) if p != "[DONE]"]
    return json.loads(payloads[-1])
