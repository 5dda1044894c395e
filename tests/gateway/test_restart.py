"""Issue 41, finding 7: state that survives a restart. A gateway killed (SIGKILL)
or stopped (SIGTERM) in the middle of a surge comes back with the same admitted
sessions, each session's priority and the parked order, from a SQLite file or
from a Redis server two replicas share; parked clients retrying with jitter
are parked again in their old order, and no wave of retries is admitted past
the budget."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
from tests.gateway.test_gate import CONFIG

from basin.gateway.gate import Gate
from basin.gateway.persist import Journal, read_meta, restore
from basin.gateway.sessions import SessionState
from basin.gateway.store import SQLiteStore
from basin.gateway.usage import CallUsage
from basin.policy.basin import BasinParams, BasinPolicy
from basin.predict.peak import GrowthPredictor

ROOT = Path(__file__).resolve().parents[2]
BASIN = Path(sys.executable).with_name("basin")
TOKEN = "restart-admin-token-0123456789"
CHAT = "/v1/chat/completions"
CAPACITY = 10_000
SURGE = 30
REDIS = shutil.which("redis-server") or os.environ.get("BASIN_REDIS_SERVER")


def _gate() -> Gate:
    policy = BasinPolicy(BasinParams(lending=False), predictor=GrowthPredictor(1.5))
    return Gate(policy, CONFIG, capacity_tokens=CAPACITY)


# --------------------------------------------------------------------------- in process
def test_a_gate_comes_back_from_its_store_as_it_was(tmp_path) -> None:
    gate = _gate()
    journal = Journal(gate)
    gate.control_step(0.0)
    for i in range(SURGE):
        sess = gate.open_call(f"s{i}", 1.0 + i * 0.01, 500 + 97 * (i % 7), None, end=False)
        if gate.session_state(sess) is SessionState.ADMITTED:
            gate.forwarded(sess, sess.first_prompt_tokens, 1.5)
            gate.done(sess, CallUsage(sess.first_prompt_tokens - 3, 50, 0), 2.0)
    gate.control_step(3.0)
    store = SQLiteStore(tmp_path / "state.db")
    store.write(journal.capture(3.5, 1_000.0, b"k" * 32))
    store.close()

    again = _gate()
    store = SQLiteStore(tmp_path / "state.db")
    stored = store.load()
    assert stored is not None
    restore(again, stored, read_meta(stored, "test", "basin"), 4.0)
    store.close()
    for mine, theirs in ((gate, again),):
        assert theirs.session_counts() == mine.session_counts()
        assert theirs.parked_order() == mine.parked_order() and len(mine.parked_order()) > 0
        assert theirs.driver.working_set_tokens == mine.driver.working_set_tokens
        assert list(theirs.driver.parked) == list(mine.driver.parked)
        assert list(theirs.driver._arrivals) == list(mine.driver._arrivals)
        for uid in mine.table.by_uid:
            assert theirs.driver.priority_key(uid) == mine.driver.priority_key(uid)
        a, b = mine.policy.state, theirs.policy.state
        assert (b.admit, b.budget, b.b0, b.residents) == (a.admit, a.budget, a.b0, a.residents)
        assert b.reserved == pytest.approx(a.reserved)
        assert theirs.counts == mine.counts
    # A new arrival gets a fresh uid, and a parked session's retry finds its place.
    assert again.open_call("new", 5.0, 400, None, end=False).uid == SURGE
    retry = again.open_call(gate.parked_order()[0], 5.0, 400, None, end=False)
    assert again.session_state(retry) is SessionState.PARKED


def test_a_store_written_by_another_policy_is_refused(tmp_path) -> None:
    from basin.errors import BasinInputError
    gate = _gate()
    journal = Journal(gate)
    store = SQLiteStore(tmp_path / "state.db")
    store.write(journal.capture(1.0, 1.0, b"k"))
    stored = store.load()
    assert stored is not None
    with pytest.raises(BasinInputError, match="policy 'basin'"):
        read_meta(stored, "state.db", "hicache")


# --------------------------------------------------------------------------- real processes
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proc:
    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        self.args, self.env = args, env
        self.proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, **(env or {})},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


async def _wait_up(url: str, seconds: float = 40.0) -> None:
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as client:
        while time.monotonic() < deadline:
            try:
                async with client.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


@contextmanager
def _engine() -> Iterator[str]:
    port = _free_port()
    proc = Proc([sys.executable, "-m", "tests.support.fake_upstream", "--port", str(port)])
    try:
        asyncio.run(_wait_up(f"http://127.0.0.1:{port}/health"))
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill(signal.SIGTERM)


def _gateway(tmp: Path, upstream: str, store: str, port: int, replica: str = "gateway") -> Proc:
    config = {"upstream": upstream, "engine": "llamacpp", "policy": "basin", "predictor": "growth:1.5",
              "cache_tokens": CAPACITY, "policy_params": {"lending": False}, "state_store": store,
              "state_replica": replica, "state_flush_s": 0.1, "listen_port": port, "keepalive_s": 0.2,
              "retry_after_s": 1, "shutdown_timeout_s": 1.0}
    path = tmp / f"gateway-{replica}.yaml"
    path.write_text(json.dumps(config))
    proc = Proc([str(BASIN), "gateway", "--config", str(path), "--log-level", "warning"],
                env={"BASIN_ADMIN_TOKEN": TOKEN})
    asyncio.run(_wait_up(f"http://127.0.0.1:{port}/healthz"))
    return proc


async def _state(url: str) -> dict:
    async with aiohttp.ClientSession() as client:
        async with client.get(url + "/admin/state", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            return await r.json()


def _body(sid: str) -> dict:
    return {"model": "m", "session_id": sid, "messages": [{"role": "user", "content": "t" * 4_000}]}


async def _surge(url: str, prefix: str) -> tuple[dict, list[asyncio.Task]]:
    """SURGE first calls at once; returns the gateway's state once all are admitted or parked, and the
    calls still held (parked)."""
    client = aiohttp.ClientSession()
    calls = [asyncio.create_task(client.post(url + CHAT, json=_body(f"{prefix}{i}"))) for i in range(SURGE)]
    for _ in range(200):
        await asyncio.sleep(0.05)
        state = await _state(url)
        if state["sessions"]["admitted"] + state["sessions"]["parked"] == SURGE:
            break
    await asyncio.sleep(0.5)  # two writes of the store
    state = await _state(url)
    calls.append(asyncio.create_task(_close_later(client)))
    return state, calls


async def _close_later(client: aiohttp.ClientSession) -> None:
    try:
        await asyncio.sleep(3600)
    finally:
        await client.close()


async def _retry_parked(url: str, parked: list[str]) -> list[asyncio.Task]:
    """The parked clients come back after the restart, in a shuffled order with jitter."""
    client = aiohttp.ClientSession()
    order = parked[:]
    random.Random(7).shuffle(order)
    calls = []
    for sid in order:
        calls.append(asyncio.create_task(client.post(url + CHAT, json=_body(sid))))
        await asyncio.sleep(random.Random(sid).uniform(0.0, 0.05))
    await asyncio.sleep(0.5)
    calls.append(asyncio.create_task(_close_later(client)))
    return calls


async def _cancel(calls: list[asyncio.Task]) -> None:
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)


def _check_restored(before: dict, after: dict) -> None:
    assert after["store"]["restored_sessions"] == SURGE
    assert after["sessions"] == before["sessions"]
    assert after["parked_order"] == before["parked_order"]
    assert after["controller"]["admit"] and after["controller"]["budget"] == before["controller"]["budget"]
    assert after["controller"]["reserved"] == pytest.approx(before["controller"]["reserved"])


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_gateway_killed_mid_surge_comes_back_within_the_budget(tmp_path, how) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    store = str(tmp_path / "state.db")
    with _engine() as upstream:
        gateway = _gateway(tmp_path, upstream, store, port)
        try:
            async def surge() -> dict:
                before, calls = await _surge(url, "k")
                assert 1 <= before["sessions"]["admitted"] <= 10 and before["sessions"]["parked"] >= SURGE - 10
                gateway.kill(how)
                results = await asyncio.gather(*calls[:-1], return_exceptions=True)
                if how == signal.SIGTERM:  # parked calls were told to come back, and when
                    answered = [r for r in results if isinstance(r, aiohttp.ClientResponse)]
                    assert sum(1 for r in answered if r.status == 503 and r.headers.get("Retry-After") == "1") \
                        == before["sessions"]["parked"]
                await _cancel(calls)
                return before
            before = asyncio.run(surge())
            gateway = _gateway(tmp_path, upstream, store, port)

            async def come_back() -> None:
                after = await _state(url)
                _check_restored(before, after)
                calls = await _retry_parked(url, before["parked_order"])  # the wave of retries
                again = await _state(url)
                assert again["sessions"] == before["sessions"], "a retry was admitted past the budget"
                assert again["parked_order"] == before["parked_order"]
                await _cancel(calls)
            asyncio.run(come_back())
        finally:
            gateway.kill(signal.SIGKILL)


@contextmanager
def _redis() -> Iterator[str]:
    port = _free_port()
    proc = Proc([str(REDIS), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill(signal.SIGTERM)


@pytest.mark.skipif(REDIS is None and os.environ.get("BASIN_SKIP_REDIS_TESTS") == "1",
                    reason="BASIN_SKIP_REDIS_TESTS=1 and no redis-server")
def test_two_replicas_sharing_redis_one_killed_and_restarted(tmp_path) -> None:
    assert REDIS is not None, "redis-server is missing: run `make test` (scripts/setup_redis.sh) to install it"
    ports = {"a": _free_port(), "b": _free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    with _engine() as upstream, _redis() as store:
        gateways = {name: _gateway(tmp_path, upstream, store, ports[name], replica=name) for name in ports}
        try:
            async def scenario() -> None:  # one event loop: b's held clients stay connected throughout
                before_a, calls_a = await _surge(urls["a"], "a")
                before_b, calls_b = await _surge(urls["b"], "b")
                await asyncio.to_thread(gateways["a"].kill, signal.SIGKILL)
                await _cancel(calls_a)
                gateways["a"] = await asyncio.to_thread(_gateway, tmp_path, upstream, store, ports["a"], "a")
                after_a = await _state(urls["a"])
                _check_restored(before_a, after_a)
                assert (await _state(urls["b"]))["sessions"] == before_b["sessions"]  # b went on untouched
                calls = await _retry_parked(urls["a"], before_a["parked_order"])
                again = await _state(urls["a"])
                assert again["sessions"] == before_a["sessions"]
                assert again["parked_order"] == before_a["parked_order"]
                await _cancel(calls + calls_b)
            asyncio.run(scenario())
        finally:
            for gateway in gateways.values():
                gateway.kill(signal.SIGKILL)
