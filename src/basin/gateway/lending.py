"""The policy's decode-memory lending switch, sent to the engine over HTTP.

Lending happens inside the engine, and no stock engine (SGLang, vLLM) lets a
client switch it; ``basin emulate`` does, at ``POST /emulator/lending``. With
``lending_url`` set, the gate hands each control step's decision to a
:class:`LendingSwitch`, which posts it only when it differs from what the
engine last confirmed. The post runs as a task on the gateway's event loop,
so the control step never waits for it, and a failure is logged and counted,
never raised: the next control step (the driver restates its decision at
every tick) tries again.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from basin.gateway.adapters.probe import describe_failure
from basin.gateway.netio import TooLarge, read_capped

log = logging.getLogger("basin.gateway")

#: Longest wait for the engine to answer one switch.
LENDING_TIMEOUT_S = 2.0
#: Longest answer read (the engine's state is a small JSON object).
MAX_ANSWER_BYTES = 64 * 1024

#: What is switched: lending on or off, and its cap as a share of decode KV (phi).
Switch = tuple[bool, float]


class LendingError(RuntimeError):
    """The engine did not take the switch (an HTTP status other than 200)."""


class LendingSwitch:
    """Keeps the engine's lending where the policy wants it, one post at a time."""

    def __init__(self, url: str, session: aiohttp.ClientSession, timeout_s: float = LENDING_TIMEOUT_S):
        self.url = url
        self.session = session
        self.timeout_s = timeout_s
        #: The policy's latest decision, and what the engine last confirmed (None: not yet known,
        #: so the first decision is always sent, whatever state an earlier run left the engine in).
        self.wanted: Switch | None = None
        self.confirmed: Switch | None = None
        self.posts = 0
        #: Failed posts in all, and in a row (0 after a success).
        self.failures = 0
        self.failures_in_a_row = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    def want(self, on: bool, cap_fraction: float) -> None:
        """The control step's decision; posts it when it differs from the confirmed state and no post
        is under way (a change made meanwhile is posted when that one succeeds). Never raises or waits."""
        self.wanted = (on, cap_fraction)
        if self._task is None and self.wanted != self.confirmed:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._failed(RuntimeError("no running event loop to post from"))
                return
            self._task = loop.create_task(self._post(self.wanted))

    async def _post(self, switch: Switch) -> None:
        on, cap = switch
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self.session.post(self.url, json={"on": on, "cap_fraction": cap}, timeout=timeout,
                                         allow_redirects=False) as resp:
                try:
                    data = await read_capped(resp, MAX_ANSWER_BYTES)
                except TooLarge:
                    data = b"(an answer too long to read)"
                if resp.status != 200:
                    raise LendingError(f"HTTP {resp.status}: {data[:200].decode('utf-8', 'replace').strip()!r}")
        except Exception as exc:  # CancelledError is not an Exception: a stop still stops it
            self._task = None
            self._failed(exc)
            return
        self._task = None
        self.posts += 1
        if self.failures_in_a_row:
            log.warning("lending switch to %s works again after %d failures in a row", self.url,
                        self.failures_in_a_row)
        self.failures_in_a_row = 0
        self.last_error = None
        self.confirmed = switch
        log.info("decode-memory lending %s (confirmed by %s)", "on" if on else "off", self.url)
        if self.wanted is not None and self.wanted != self.confirmed:
            self.want(*self.wanted)

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.failures_in_a_row += 1
        self.last_error = f"lending switch to {self.url} failed: {describe_failure(exc, self.timeout_s)}"
        if self.failures_in_a_row == 1:
            log.warning("%s (retried at the next control step; the policy goes on)", self.last_error)

    def state(self) -> dict[str, object]:
        """For ``/admin/state``: where the switch goes, what is wanted and confirmed, and failures."""
        def view(switch: Switch | None) -> dict[str, object] | None:
            return None if switch is None else {"on": switch[0], "cap_fraction": switch[1]}
        return {"url": self.url, "wanted": view(self.wanted), "confirmed": view(self.confirmed),
                "posts": self.posts, "failures": self.failures, "failures_in_a_row": self.failures_in_a_row,
                "last_error": self.last_error}

    async def stop(self) -> None:
        """Cancel a post under way (before the client session closes)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
