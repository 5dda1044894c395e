"""HTTP helpers for the adapters' start-up probes: a network error becomes a
reason to report, never an exception out of the probe."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from basin.gateway.exposition import MetricsError
from basin.gateway.netio import TooLarge, read_capped

#: How long a start-up feature probe may take per request, and how much it reads.
PROBE_TIMEOUT_S = 5.0
PROBE_MAX_BYTES = 16 * 1024 * 1024

NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, TooLarge)


def server_root(base_url: str) -> str:
    """Engine root from the configured upstream: tolerate a trailing slash or ``/v1``."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root


def describe_failure(exc: BaseException, timeout_s: float) -> str:
    """One-line cause for logs and the state endpoint (a bare TimeoutError has no message)."""
    if isinstance(exc, asyncio.TimeoutError):
        return f"timed out after {timeout_s:g} s"
    if isinstance(exc, MetricsError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def get_text(session: aiohttp.ClientSession, url: str, timeout_s: float) -> tuple[int, str]:
    """(HTTP status, body) of a GET that does not follow redirects."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(url, timeout=timeout, allow_redirects=False) as resp:
        return resp.status, (await read_capped(resp, PROBE_MAX_BYTES)).decode("utf-8", "replace")


async def get_or_warn(session: aiohttp.ClientSession, url: str, engine: str,
                      warnings: list[str]) -> tuple[int, str] | None:
    """GET ``url`` at start-up; a network error becomes a warning (and None)."""
    try:
        return await get_text(session, url, PROBE_TIMEOUT_S)
    except NETWORK_ERRORS as exc:
        why = describe_failure(exc, PROBE_TIMEOUT_S)
        warnings.append(f"{engine}: cannot read {url} ({why}); engine signals unknown.")
        return None


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[dict | None, str | None]:
    """(JSON object, None) or (None, why not); never raises on network errors."""
    try:
        status, body = await get_text(session, url, PROBE_TIMEOUT_S)
    except NETWORK_ERRORS as exc:
        return None, f"GET {url}: {describe_failure(exc, PROBE_TIMEOUT_S)}"
    if status != 200:
        return None, f"GET {url}: HTTP {status}"
    try:
        data = json.loads(body)
    except ValueError:
        return None, f"GET {url}: the answer is not JSON"
    if not isinstance(data, dict):
        return None, f"GET {url}: the answer is not a JSON object"
    return data, None


def as_bool(value: object) -> bool | None:
    """A server-info flag as a bool; None when it is not recognisably one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    return None
