"""Serve an aiohttp application on a free local port for a test: the one
way the tests stand up a small engine, metrics or control endpoint."""

from __future__ import annotations

from aiohttp import web


async def start_app(app: web.Application, **runner_options: object) -> tuple[web.AppRunner, str]:
    """Start ``app`` on 127.0.0.1 at a port the system picks; returns the
    runner (``await runner.cleanup()`` stops it) and the base URL."""
    runner = web.AppRunner(app, **runner_options)  # type: ignore[arg-type]
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"
