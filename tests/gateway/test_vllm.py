"""The gateway in front of a real vLLM (the CPU build, ``make engine``).

One server serves the module, started with one running request at a time
(``--max-num-seqs 1``) so that a queue forms as soon as a second call
arrives and its order is the engine's own scheduling decision, and with a
KV pool of 512 blocks (65,536 tokens) so that capacity is read exactly.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import numpy as np
import pytest
from tests.support.vllm_server import VLLMServer, free_port

from basin.gateway.config import GatewayConfig
from basin.gateway.server import GatewayServer

pytestmark = pytest.mark.engine

KV_BLOCKS = 512
ADMIN_TOKEN = "test-admin-token-0123"
CHAT = "/v1/chat/completions"
_WORDS = ("agent tool file patch test build error trace module function value index cache request token "
          "branch commit review parser config server client thread queue memory buffer").split()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    server = VLLMServer(extra_args=("--max-num-seqs", "1", "--num-gpu-blocks-override", str(KV_BLOCKS)),
                        log_path=tmp_path_factory.mktemp("vllm") / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _text(name: str, words: int) -> str:
    rng = random.Random(name)
    return f"Notes of {name}: " + " ".join(rng.choices(_WORDS, k=words))


def _messages(name: str, turn: int, words: int = 600) -> list[dict]:
    messages = [{"role": "user", "content": _text(name, words)}]
    for k in range(turn):
        messages += [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": f"Step {k + 1}."}]
    return messages


async def _chat(client: aiohttp.ClientSession, url: str, model: str, name: str, turn: int, *,
                max_tokens: int = 2, stream: bool = False, end: bool = False, words: int = 600) -> dict:
    body = {"model": model, "messages": _messages(name, turn, words), "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"X-Session-Id": name, "X-Session-End": "true" if end else "false"}
    async with client.post(url + CHAT, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        if not stream:
            return (await resp.json())["usage"]
        usage = None
        async for line in resp.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
        assert usage is not None, "the stream carried no usage"
        return usage


async def _blocker(client: aiohttp.ClientSession, engine: VLLMServer, tokens: int) -> asyncio.Task:
    """A call sent to the engine directly that decodes ``tokens`` tokens, first
    in its queue (priority 0, before any gateway session): while it runs the
    engine (one request at a time) queues everything else. Returns once it has
    decoded a token (vLLM sends the role chunk before the request is scheduled).
    The task's result says how the call ended, for a precondition's message."""
    body = {"model": engine.model, "messages": [{"role": "user", "content": "Keep going."}],
            "max_tokens": tokens, "ignore_eos": True, "stream": True, "priority": 0}
    resp = await client.post(engine.url + CHAT, json=body)
    assert resp.status == 200, await resp.text()
    while True:  # its first decoded token: it holds the engine's only running slot
        event = await resp.content.readuntil(b"\n\n")
        assert event, "the blocker's stream ended before its first token"
        if event.startswith(b"data: {") and json.loads(event[6:]).get("choices", [{}])[0].get("delta", {}).get(
                "content"):
            break

    async def finish() -> str:
        async with resp:
            try:
                rest = await resp.read()
            except aiohttp.ClientConnectionError as exc:
                return f"released ({type(exc).__name__})"  # see _release
            return f"ended by the engine after {rest.count(b'data: ')} more events; last: {rest[-200:]!r}"
    task = asyncio.create_task(finish())
    task.response = resp  # type: ignore[attr-defined]
    return task


def _release(blocker: asyncio.Task) -> None:
    """End the blocker now: its client hangs up and vLLM aborts it, freeing its slot."""
    blocker.response.close()  # type: ignore[attr-defined]


def _log_tail(engine: VLLMServer, lines: int = 30) -> str:
    if engine.log_path is None or not engine.log_path.is_file():
        return "(no engine log)"
    return "\n".join(engine.log_path.read_text(errors="replace").splitlines()[-lines:])


def _gateway(engine: VLLMServer, **kw) -> GatewayServer:
    cfg: dict = dict(upstream=engine.url, engine="vllm", listen_port=0, scrape_interval_s=3600.0,
                     policy="hicache", admin_token=ADMIN_TOKEN)
    cfg.update(kw)
    return GatewayServer(GatewayConfig(**cfg))


async def _state(client: aiohttp.ClientSession, gateway: GatewayServer) -> dict:
    async with client.get(gateway.url + "/admin/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as resp:
        assert resp.status == 200
        return await resp.json()


class _EngineNotBusy(Exception):
    """The blocker ended before every call had queued: the order measured would not be the engine's."""


def test_the_vllm_adapter_reads_queue_kv_use_capacity_and_hit_rate_from_the_real_engine(engine):
    async def busy_snapshot(client: aiohttp.ClientSession, gateway: GatewayServer, attempt: int) -> dict:
        # Long enough to outlast a few 2-second scrape timeouts on a loaded machine.
        blocker = await _blocker(client, engine, tokens=16000)
        queued = [asyncio.create_task(_chat(client, gateway.url, engine.model, f"Q{i}-{attempt}", 0))
                  for i in range(3)]
        busy: dict = {}
        for _ in range(20):  # a scrape may time out on a busy machine: the next one counts
            await asyncio.sleep(0.25)
            await gateway.poller.scrape_once()
            busy = (await _state(client, gateway))["engine"]["snapshot"] or {}
            if busy.get("queue_requests") == 3 or blocker.done():
                break
        ended_early = blocker.done()
        _release(blocker)
        await asyncio.gather(blocker, *queued)
        if ended_early:
            raise _EngineNotBusy(blocker.result())
        return busy

    async def go():
        gateway = _gateway(engine)
        await gateway.start()
        try:
            async with aiohttp.ClientSession() as client:
                failures = []
                for attempt in range(3):  # the precondition (a busy engine) can fail on a stalled machine
                    try:
                        busy = await busy_snapshot(client, gateway, attempt)
                        break
                    except _EngineNotBusy as exc:
                        failures.append(str(exc))
                else:
                    pytest.fail(f"the blocker never held the engine: {failures}\nengine log:\n{_log_tail(engine)}")
                await gateway.poller.scrape_once()
                for turn in range(1, 4):  # one session's growing conversation: its prefix is reused
                    await _chat(client, gateway.url, engine.model, "Q0-0", turn)
                await gateway.poller.scrape_once()
                warm = (await _state(client, gateway))["engine"]["snapshot"]
        finally:
            await gateway.stop()
        return busy, warm

    busy, warm = asyncio.run(go())
    print(f"busy: {busy}\nwarm: {warm}")
    assert busy["running_requests"] == 1 and busy["queue_requests"] == 3
    assert busy["kv_used_fraction"] > 0
    assert busy["cache_capacity_tokens"] == KV_BLOCKS * engine.block_size_tokens
    # Three more calls of a ~650-token conversation: all but its last partial block and new turn cached.
    assert 0.7 < warm["hit_rate"] <= 1.0


async def _served_order(engine: VLLMServer, gateway: GatewayServer, names: list[str], attempt: int) -> list[str]:
    """Sessions arrive one second apart (the gateway's priority is the arrival
    second), then call again in the reverse order while the engine is busy;
    returns the order the engine served those calls in."""
    async with aiohttp.ClientSession() as client:
        for name in names:
            await _chat(client, gateway.url, engine.model, f"{name}{attempt}", 0, words=50)
            await asyncio.sleep(1.05)
        gateway.gate.tick(gateway.clock())
        blocker = await _blocker(client, engine, tokens=16000)  # released once the calls queue
        done: list[str] = []

        async def second(name: str) -> None:
            await _chat(client, gateway.url, engine.model, f"{name}{attempt}", 1, words=50)
            done.append(name)
        calls = []
        for name in reversed(names):
            calls.append(asyncio.create_task(second(name)))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # the last call reaches vLLM's queue
        busy = not blocker.done()
        _release(blocker)
        await asyncio.gather(blocker, *calls)
        if not busy:
            raise _EngineNotBusy(blocker.result())
        return done


def test_the_priority_the_gateway_writes_reorders_vllms_queue(engine):
    """Under BASIN with ordering on, the earliest session is served first
    though it called last; with the gateway passing through (hicache: no
    priority written) the engine serves in arrival order."""
    names = ["A", "B", "C", "D"]

    async def go(policy: str, params: dict) -> tuple[list[str], bool]:
        failures = []
        for attempt in range(3):  # the precondition (a busy engine) can fail on a stalled machine
            gateway = _gateway(engine, policy=policy, policy_params=params, cache_tokens=1_000_000)
            await gateway.start()
            try:
                return await _served_order(engine, gateway, names, attempt), gateway.gate.ordered
            except _EngineNotBusy as exc:
                failures.append(str(exc))
            finally:
                await gateway.stop()
        pytest.fail(f"the engine was never still busy when the last call queued; the blocker: {failures}\n"
                    f"engine log:\n{_log_tail(engine)}")

    ordered, on = asyncio.run(go("basin", {"alpha_order": 1e-6}))
    passed, off = asyncio.run(go("hicache", {}))
    print(f"ordering on: {ordered}; passing through: {passed}")
    assert on and not off
    assert ordered == names, "lower priority value (earlier session) first"
    assert passed == list(reversed(names)), "without a priority the engine serves first come, first served"


def test_session_usage_and_cached_tokens_come_back_streamed_or_not(engine):
    async def go():
        gateway = _gateway(engine)
        await gateway.start()
        try:
            async with aiohttp.ClientSession() as client:
                usages = [await _chat(client, gateway.url, engine.model, "U", 0, max_tokens=8, stream=True),
                          await _chat(client, gateway.url, engine.model, "U", 1, max_tokens=8),
                          await _chat(client, gateway.url, engine.model, "U", 2, max_tokens=8, stream=True)]
                state = await _state(client, gateway)
        finally:
            await gateway.stop()
        return usages, state

    usages, state = asyncio.run(go())
    first, second, third = usages
    assert first["prompt_tokens"] > 600 and first["completion_tokens"] == 8
    assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - engine.block_size_tokens
    assert third["prompt_tokens_details"]["cached_tokens"] > second["prompt_tokens_details"]["cached_tokens"] - 1
    assert state["sessions"]["admitted"] == 1
    assert state["working_set_tokens"] == third["prompt_tokens"] + third["completion_tokens"]


def test_a_recording_of_real_traffic_replays_in_the_simulator(engine, tmp_path):
    from basin.catalog import load_deployment, load_hardware
    from basin.gateway.record import recorded_arrivals
    from basin.gateway.replay import ReplaySettings, replay
    from basin.sim.engine import SimConfig, Simulator
    from basin.systems import RunContext, build_policy
    from basin.workload.arrivals import SessionArrival
    from basin.workload.io import read_workload
    from basin.workload.records import Call, Session

    sessions = [SessionArrival(0.3 * i, Session(f"R{i}", tuple(
        Call(prompt_tokens=400 + 60 * k, new_tokens=60, output_tokens=6, tool_gap_s=0.2) for k in range(3)),
        task_text=f"Replay task {i}."), "base") for i in range(3)]
    path = tmp_path / "traffic.jsonl"

    async def go():
        gateway = _gateway(engine, record=str(path))
        await gateway.start()
        try:
            return await replay(sessions, ReplaySettings(target=gateway.url, model=engine.model))
        finally:
            await gateway.stop()

    records, summary = asyncio.run(go())
    assert summary.completed == 3 and all(r.outcome == "ok" for r in records)
    sent = {(r.session_id, r.call_index): (r.prompt_tokens, r.completion_tokens) for r in records}
    workload = read_workload(path)
    assert sorted(s.session_id for s in workload.sessions) == ["R0", "R1", "R2"]
    arrivals = recorded_arrivals(workload)
    dep = load_deployment("1p3d-h200")
    hw = load_hardware(dep.hardware)
    policy = build_policy("hicache", {}, RunContext(deployment=dep, workload="terminal-bench", hardware=hw))
    result = Simulator(SimConfig(hardware=hw, deployment=dep, arrivals=arrivals, duration_s=600.0), policy).run()
    ids = dict(zip(result.sessions["session_uid"].tolist(), result.sessions["session_id"].tolist()))
    got = {(ids[u], int(k)): (int(p), int(o)) for u, k, p, o in zip(
        result.calls["session_uid"], result.calls["call_index"], result.calls["prompt_tokens"],
        result.calls["output_tokens"])}
    assert got == sent, "the simulator replays the calls the real engine counted"
    assert np.isfinite(result.sessions["finished_s"]).all()


def _healthz(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _basin(*args: str) -> list[str]:
    return [sys.executable, "-m", "basin", *args]


#: Two streams of this many tokens, one after the other (one running request), take
#: about 15 s at 3.6 ms a token: well inside the gateway's 30-s shutdown_timeout_s.
DRAINED_TOKENS = 2000


def test_sigterm_drains_the_real_engines_streams(engine, tmp_path):
    """`basin gateway` stopped with SIGTERM while two streams run: both end
    whole (every token, then [DONE]), the process exits 0, and nothing new is taken."""
    port = free_port()
    log = open(tmp_path / "gateway.log", "wb")
    proc = subprocess.Popen(_basin("gateway", "--upstream", engine.url, "--engine", "vllm", "--policy", "hicache",
                                   "--listen", f"127.0.0.1:{port}"), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _healthz(url):
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.2)

        async def go():
            async with aiohttp.ClientSession() as client:
                bodies = [{"model": engine.model, "messages": _messages(f"S{i}", 0, 100), "max_tokens": DRAINED_TOKENS,
                           "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
                          for i in range(2)]
                streams = [await client.post(url + CHAT, json=b, headers={"X-Session-Id": f"S{i}"})
                           for i, b in enumerate(bodies)]
                await streams[0].content.readuntil(b"\n\n")
                proc.send_signal(signal.SIGTERM)
                texts = [await asyncio.wait_for(s.read(), 120) for s in streams]
                return texts

        texts = asyncio.run(go())
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    for text in texts:
        assert text.rstrip().endswith(b"data: [DONE]")
        # vLLM may put several tokens in one event when its client lags: count by the final usage.
        usage = [json.loads(line[6:])["usage"] for line in text.split(b"\n")
                 if line.startswith(b"data: {") and b'"usage":{' in line.replace(b" ", b"")]
        assert usage and usage[-1]["completion_tokens"] == DRAINED_TOKENS, "every token reached the client"
    assert not _healthz(url)
    assert "SIGTERM received: draining" in (tmp_path / "gateway.log").read_text()


def test_an_engine_restart_mid_run_is_survived(engine):
    """vLLM killed and restarted (same port) while a session is live and a
    stream runs: the cut stream ends early with the gateway's error event,
    calls during the outage get a
    clear 502/503, and afterwards the same session carries on with its
    priority and the gateway's signals recover."""
    async def go():
        gateway = _gateway(engine, policy="basin", policy_params={"alpha_order": 1e-6},
                           cache_tokens=1_000_000, scrape_interval_s=0.5)
        await gateway.start()
        try:
            async with aiohttp.ClientSession() as client:
                await _chat(client, gateway.url, engine.model, "L", 0)
                gateway.gate.tick(gateway.clock())
                rank = gateway.gate.priority_rank(gateway.gate.table.get("L"))
                body = {"model": engine.model, "messages": _messages("L", 1), "max_tokens": 12000,
                        "ignore_eos": True, "stream": True}
                stream = await client.post(gateway.url + CHAT, json=body, headers={"X-Session-Id": "L"})
                await stream.content.readuntil(b"\n\n")
                # A crash (SIGKILL): a SIGTERM lets vLLM finish the stream it runs, which cuts nothing.
                restart = asyncio.create_task(asyncio.to_thread(engine.restart, signal.SIGKILL))
                cut = await asyncio.wait_for(stream.read(), 60)
                await asyncio.sleep(1.0)
                body["max_tokens"], body["stream"] = 2, False
                async with client.post(gateway.url + CHAT, json=body, headers={"X-Session-Id": "L"}) as resp:
                    outage = (resp.status, await resp.json())
                await restart
                usage = await _chat(client, gateway.url, engine.model, "L", 2)
                await asyncio.sleep(1.2)
                state = await _state(client, gateway)
                after = gateway.gate.priority_rank(gateway.gate.table.get("L"))
        finally:
            await gateway.stop()
        return cut, outage, usage, state, rank, after

    cut, outage, usage, state, rank, after = asyncio.run(go())
    print(f"cut stream tail: {cut[-200:]!r}\noutage: {outage}")
    tokens = sum(line.count(b'"content"') for line in cut.split(b"\n") if line.startswith(b"data: {\"id"))
    assert b'"error"' in cut and tokens < 12000, "the cut stream ends early with an error event"
    assert outage[0] in (502, 503) and outage[1]["error"]["message"]
    assert usage["prompt_tokens"] > 600
    assert state["sessions"]["admitted"] == 1 and after == rank
    assert state["engine"]["snapshot"] is not None and state["engine"]["scrape_age_s"] < 5
