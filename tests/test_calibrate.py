"""`basin calibrate`: fits, finding a calibrated profile by name or path, the
engines it refuses (one line, exit 2), and the round trip through `basin
emulate`: calibrating the emulator recovers the emulated hardware's figures."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml
from aiohttp import web
from tests.cli_helpers import run_basin
from tests.support.local_app import start_app

from basin.calibrate.fit import fit_batch, fit_context, fit_nonnegative, fit_prefill, spread
from basin.catalog import load_deployment, load_hardware
from basin.errors import BasinInputError

# ----------------------------------------------------------------------------- fits


def test_prefill_fit_recovers_known_costs_and_keeps_residuals() -> None:
    rng = np.random.default_rng(1)
    u = np.array([64, 256, 1024, 4096, 16384, 32, 512, 8192], dtype=float)
    p = np.array([0, 0, 0, 0, 0, 16000, 16000, 16000], dtype=float)
    truth = 0.014 + u / 36000 + 2.24e-10 * u * (p + u / 2)
    fit = fit_prefill(u, p, truth * (1 + rng.normal(0, 0.01, len(u))))
    assert fit["fixed_s"] == pytest.approx(0.014, rel=0.1)
    assert 1 / fit["s_per_token"] == pytest.approx(36000, rel=0.05)
    assert fit["attention_s_per_token_position"] == pytest.approx(2.24e-10, rel=0.15)
    assert len(fit.residuals) == len(u) and 0 < fit.rms_residual < 0.05


def test_prefill_fit_separates_the_front_ends_read_of_every_prompt_token() -> None:
    rng = np.random.default_rng(2)
    u = np.array([64, 156, 380, 926, 2256, 5497, 13395, 32640, 78, 296, 2084, 16313], dtype=float)
    p = np.array([0] * 8 + [16128] * 4, dtype=float)
    steps = np.ceil(u / 2048)
    truth = 0.015 * steps + u / 32000 + 1.6e-8 * u * (p + u / 2) + 1.9e-6 * (u + p)
    fit = fit_prefill(u, p, truth * (1 + rng.normal(0, 0.01, len(u))), steps)
    assert fit["s_per_prompt_token"] == pytest.approx(1.9e-6, rel=0.15)
    assert 1 / fit["s_per_token"] == pytest.approx(32000, rel=0.05) and fit.rms_residual < 0.03
    # Without the term a long cached prefix is underpredicted: the fit bends the others instead.
    three = fit_nonnegative(("fixed_s", "s_per_token", "attention"),
                            np.column_stack([steps, u, u * (p + u / 2)]), truth)
    assert three.rms_residual > 3 * fit.rms_residual
    # Uncached calls alone cannot tell it from the per-token cost: it is 0, not a guess.
    alone = fit_prefill(u[:8], p[:8], truth[:8], steps[:8])
    assert alone["s_per_prompt_token"] == 0.0 and alone.names[-1] == "s_per_prompt_token"


def test_decode_fits_separate_context_from_batch() -> None:
    ctx = np.array([100, 1000, 10000, 30000], dtype=float)
    single = fit_context(ctx, 0.005 + 0.00035 + 3.3e-9 * ctx)
    assert single["per_context_token_s"] == pytest.approx(3.3e-9, rel=1e-6)
    b = np.array([1, 2, 4, 8, 16, 32, 16, 32], dtype=float)
    c = b * np.array([200, 200, 200, 200, 200, 200, 2000, 2000])
    batch = fit_batch(b, c, 0.005 + 0.00035 * b + 3.3e-9 * c, single["per_context_token_s"])
    assert batch["base_s"] == pytest.approx(0.005, rel=1e-6)
    assert batch["per_request_s"] == pytest.approx(0.00035, rel=1e-6)


def test_spread_reports_median_and_iqr() -> None:
    s = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["iqr"] == 2.0 and s["n"] == 5 and s["samples"][-1] == 100.0


# ----------------------------------------------------------------------------- the catalogue


def _calibrated(name: str, topology: str | None = "colocated") -> dict:
    """A calibrated profile file as ``basin calibrate`` writes it (colocated by default);
    ``topology=None`` is a file written before the colocated topology existed."""
    hw = yaml.safe_load((Path(__file__).parents[1] / "profiles" / "hardware" / "h100-nvl.yaml").read_text())
    hw["name"] = name
    shape: dict = {"prefill_instances": 1, "decode_instances": 1, "host_ratio": 0.0}
    if topology is not None:
        shape["topology"] = topology
    return {"kind": "basin-calibrated-profile", "version": 1, "name": name, "hardware": hw,
            "deployment": shape, "calibration": {"note": "test"}}


def test_a_calibrated_file_is_a_deployment_and_its_hardware_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(_calibrated("mine")))
    dep = load_deployment(str(path))
    assert (dep.name, dep.shape, dep.topology, dep.host_ratio) == ("mine", "1C", "colocated", 0.0)
    assert Path(dep.hardware) == path.resolve()
    assert load_hardware(dep.hardware).decode.kv_tokens == 1660000
    assert load_hardware(str(path)).name == "mine"


@pytest.mark.parametrize("topology, shape", [("pd", "1P1D"), (None, "1P1D")])
def test_a_pd_calibrated_file_and_one_written_before_colocated_are_1p1d(tmp_path: Path, topology, shape) -> None:
    path = tmp_path / "side.yaml"
    path.write_text(yaml.safe_dump(_calibrated("side", topology)))
    dep = load_deployment(str(path))
    assert (dep.shape, dep.topology) == (shape, "pd")


def test_a_colocated_calibrated_file_with_a_host_tier_or_two_shapes_names_the_field(tmp_path: Path) -> None:
    for field, value in (("host_ratio", 1.0), ("decode_instances", 2)):
        data = _calibrated("bad")
        data["deployment"][field] = value
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(BasinInputError, match="colocated") as info:
            load_deployment(str(path))
        assert "deployment" in str(info.value)


def test_a_calibrated_profile_is_found_by_name_in_the_user_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BASIN_PROFILES", str(tmp_path))
    (tmp_path / "my-engine.yaml").write_text(yaml.safe_dump(_calibrated("my-engine")))
    dep = load_deployment("my-engine")
    assert dep.hardware == "my-engine" and load_hardware("my-engine").prefill.chunk_tokens == 8192
    assert (dep.topology, dep.shape) == ("colocated", "1C")
    scaled = load_deployment("2P4D-my-engine")  # a shape of it, as for any hardware
    assert (scaled.prefill_instances, scaled.decode_instances, scaled.hardware) == (2, 4, "my-engine")
    assert scaled.topology == "pd"
    servers = load_deployment("3C-my-engine")  # three colocated servers of it
    assert (servers.shape, servers.topology, servers.hardware, servers.host_ratio) == ("3C", "colocated",
                                                                                      "my-engine", 0.0)
    with pytest.raises(BasinInputError, match="my-engine"):  # the hint lists user profiles
        load_deployment("my-engin")
    # a copy under another file name is that name (BASIN's cliff profiles are looked up by it)
    (tmp_path / "renamed.yaml").write_text(yaml.safe_dump(_calibrated("my-engine")))
    assert load_deployment("renamed").name == "renamed"


def test_commands_take_a_calibrated_profile_by_name(capsys, tmp_path: Path, monkeypatch) -> None:
    from basin.emulate.config import emulator_config
    from basin.emulate.engine import EmulatedEngine
    from basin.sim.colocated import ColocatedCluster

    monkeypatch.setenv("BASIN_PROFILES", str(tmp_path))
    (tmp_path / "my-engine.yaml").write_text(yaml.safe_dump(_calibrated("my-engine")))
    hardware, dep = emulator_config(deployment="my-engine").resolve()
    assert dep.name == "my-engine" and hardware.decode.kv_tokens == 1660000
    assert isinstance(EmulatedEngine(hardware, dep).cluster, ColocatedCluster)  # basin emulate --deployment
    code, out, err = run_basin(capsys, "vulnerable", "my-engine", "--rate", "3")
    assert code == 0 and "my-engine" in out, err
    code, out, err = run_basin(capsys, "deployment", "show", "my-engine")
    assert code == 0 and "calibrated profile" in out and "my-engine: 1C on my-engine" in out, err
    code, out, err = run_basin(capsys, "deployment", "show", "1C-my-engine", "--json")
    assert code == 0 and json.loads(out)["shape"] == "1C", err
    # One pool, no host tier: a host ratio is refused in one line, not silently added.
    code, _, err = run_basin(capsys, "deployment", "show", "my-engine", "--host-ratio", "1")
    assert code == 2 and "colocated" in err and "host" in err and "Traceback" not in err, err
    code, out, err = run_basin(capsys, "profile", "my-engine", "--repeats", "1", "--steps", "6", "--step-min", "10",
                               "--no-plot", "--out", str(tmp_path / "cliff.yaml"), "--json")
    assert code == 0 and (tmp_path / "cliff.yaml").is_file(), err
    cliff = yaml.safe_load((tmp_path / "cliff.yaml").read_text())
    assert (cliff["deployment"], cliff["host_cache_tokens"], cliff["gpu_cache_tokens"]) == ("my-engine", 0, 1090000)


def test_basin_run_sets_a_colocated_calibrated_profile_as_the_deployment(capsys, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """``basin run SCENARIO --set deployment=NAME`` runs the file's colocated server: the same run as
    its shape ``1C-NAME``, and not the 1P1D of the same hardware."""
    monkeypatch.setenv("BASIN_PROFILES", str(tmp_path))
    data = _calibrated("mine")
    data["hardware"]["prefill"]["prefix_cache_tokens"] = 200_000  # a server that fills: one pool for all
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(data))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({"name": "s", "deployment": "1p1d-h100", "workload": {
        "name": "terminal-bench", "sessions": 40}, "arrivals": {"base_per_min": 3.0}, "duration_min": 10,
        "measure_end_min": 10, "host_ratio": 0.0}))
    rows = {}
    for dep in ("mine", "1C-mine", "1P1D-mine"):
        code, text, err = run_basin(capsys, "run", str(scenario), "--set", f"deployment={dep}", "--out",
                                    str(tmp_path / "run"), "--no-plots", "--json")
        assert code == 0, err
        rows[dep] = {k: v for k, v in json.loads(text)[0].items() if "deployment" not in k and "time" not in k}
    assert rows["mine"]["n_completed"] > 0
    assert rows["mine"] == rows["1C-mine"], {k: (v, rows["1C-mine"].get(k)) for k, v in rows["mine"].items()
                                             if rows["1C-mine"].get(k) != v}
    assert rows["mine"] != rows["1P1D-mine"]


def test_a_broken_calibrated_file_names_its_field(tmp_path: Path) -> None:
    data = _calibrated("bad")
    data["hardware"]["decode"]["kv_tokens"] = -5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(BasinInputError, match="kv_tokens"):
        load_deployment(str(path))


def test_out_refuses_a_shipped_name_and_a_bad_name(capsys) -> None:
    code, _, err = run_basin(capsys, "calibrate", "--engine", "http://127.0.0.1:9", "--out", "h200")
    assert code == 2 and "--out h200" in err and "shipped" in err
    code, _, err = run_basin(capsys, "calibrate", "--engine", "http://127.0.0.1:9", "--out", "a/b")
    assert code == 2 and "--out" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- engines it refuses


@contextmanager
def fake_engine(*, usage: bool = True, caching: bool = True, report_cached: bool = True,
                context: int | None = 8192, scheduler: dict | None = None) -> Iterator[str]:
    """A tiny OpenAI-compatible engine: one token a word, 50 us a computed
    token; with ``caching`` the longest whole-message prefix seen before is
    not computed, and ``report_cached`` says how many tokens that was. With
    ``scheduler``, vLLM's development ``/server_info`` serves it as its
    ``vllm_config.scheduler_config``."""
    seen: list[tuple[str, ...]] = []

    async def server_info(request: web.Request) -> web.Response:
        if scheduler is None:
            return web.Response(status=404)
        assert request.query.get("config_format") == "json"  # vLLM's default is a text dump
        return web.json_response({"vllm_config": {"scheduler_config": scheduler}, "vllm_env": {}})

    async def models(_request: web.Request) -> web.Response:
        entry: dict = {"id": "fake"}
        if context is not None:
            entry["max_model_len"] = context
        return web.json_response({"data": [entry]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        contents = tuple(m["content"] for m in body["messages"])
        sizes = [len(c.split()) for c in contents]
        hit = 0
        for old in seen:
            k = 0
            while k < min(len(old), len(contents)) and old[k] == contents[k]:
                k += 1
            hit = max(hit, sum(sizes[:k])) if caching else 0
        seen.append(contents)
        await asyncio.sleep(0.001 + 5e-5 * (sum(sizes) - hit))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body.get("max_tokens", 1)):
            await resp.write(b'data: {"choices": [{"delta": {"content": " x"}}]}\n\n')
            await asyncio.sleep(0.001)
        last: dict = {"choices": []}
        if usage:
            last["usage"] = {"prompt_tokens": sum(sizes), "completion_tokens": body.get("max_tokens", 1)}
            if report_cached:
                last["usage"]["prompt_tokens_details"] = {"cached_tokens": hit}
        await resp.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/server_info", server_info)
    app.router.add_post("/v1/chat/completions", chat)
    loop = asyncio.new_event_loop()
    started: dict = {}
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        runner, url = loop.run_until_complete(start_app(app))
        started.update(runner=runner, url=url)
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield started["url"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("engine, says", [
    ({"usage": False}, "no usage.prompt_tokens"),
    ({"caching": False}, "prefix caching is off"),
    ({"caching": False, "report_cached": False}, "prefix caching looks off"),
    ({"context": 512}, "context length is 512 tokens"),
])
def test_an_engine_that_cannot_be_measured_is_refused_in_one_line(capsys, tmp_path, engine, says) -> None:
    out = tmp_path / "p.yaml"
    with fake_engine(**engine) as url:
        code, _, err = run_basin(capsys, "calibrate", "--engine", url, "--out", str(out), "--budget-s", "30")
    assert code == 2, err
    assert says in err and "Traceback" not in err and not out.exists()


#: vLLM 0.32's CPU API server defaults, as its development /server_info dumps its scheduler config.
VLLM_CPU_SCHEDULER = {"max_num_batched_tokens": 2048, "max_num_scheduled_tokens": None, "max_num_seqs": 128,
                      "max_num_active_seqs": None, "enable_chunked_prefill": True, "policy": "priority"}


def test_vllm_declares_its_step_budget_and_running_limit_in_its_development_server_info() -> None:
    from basin.calibrate.client import EngineClient
    from basin.calibrate.engines import declared

    async def read(url: str, kind: str = "vllm"):
        async with EngineClient(url, None, {}) as client:
            return await declared(client, kind)

    with fake_engine(scheduler=VLLM_CPU_SCHEDULER) as url:
        d = asyncio.run(read(url))
        assert asyncio.run(read(url, "generic")).chunk_tokens == 2048  # generic reads every engine's own files
    assert (d.chunk_tokens, d.max_running_requests) == (2048, 128)
    assert "max_num_batched_tokens" in d.sources["chunk_tokens"] and "max_num_seqs" in d.sources["max_running_requests"]
    with fake_engine(scheduler={**VLLM_CPU_SCHEDULER, "max_num_scheduled_tokens": 1536}) as url:
        assert asyncio.run(read(url)).chunk_tokens == 1536  # what the scheduler issues, where it is set
    with fake_engine(scheduler={**VLLM_CPU_SCHEDULER, "enable_chunked_prefill": False}) as url:
        assert asyncio.run(read(url)).chunk_tokens is None  # no chunking: no chunk declared
    with fake_engine() as url:  # without VLLM_SERVER_DEV_MODE there is no /server_info
        d = asyncio.run(read(url))
    assert d.chunk_tokens is None and d.max_running_requests is None


@pytest.mark.parametrize("flag, value, declared, source", [
    ("--chunk-tokens", "4096", "2048", "max_num_batched_tokens"),
    ("--max-running-requests", "256", "128", "max_num_seqs"),
])
def test_figures_that_contradict_the_engine_are_refused_in_one_line(capsys, tmp_path, flag, value, declared,
                                                                   source) -> None:
    out = tmp_path / "p.yaml"
    with fake_engine(scheduler=VLLM_CPU_SCHEDULER) as url:
        code, _, err = run_basin(capsys, "calibrate", "--engine", url, "--engine-kind", "vllm", "--out", str(out),
                                 flag, value)
    assert code == 2 and f"{flag} {value}" in err and declared in err and source in err, err
    assert "Traceback" not in err and not out.exists()


def test_an_unreachable_engine_is_refused_in_one_line(capsys, tmp_path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    code, _, err = run_basin(capsys, "calibrate", "--engine", url, "--out", str(tmp_path / "p.yaml"))
    assert code == 2 and "cannot reach the engine" in err and url in err and "Traceback" not in err


@pytest.mark.parametrize("args, says", [
    (["--engine-kind", "tgi"], "--engine-kind"),
    (["--budget-s", "1"], "--budget-s"),
    (["--max-prompt-tokens", "10"], "--max-prompt-tokens"),
    (["--itl-slo-s", "0"], "--itl-slo-s"),
    (["--topology", "2p4d"], "--topology"),
    (["--chunk-tokens", "0"], "--chunk-tokens"),
    (["--max-running-requests", "0"], "--max-running-requests"),
])
def test_bad_flags_exit_2_naming_them(capsys, tmp_path, args, says) -> None:
    code, _, err = run_basin(capsys, "calibrate", "--engine", "http://127.0.0.1:9", "--out",
                             str(tmp_path / "p.yaml"), *args)
    assert code == 2 and says in err and "Traceback" not in err


# ----------------------------------------------------------------------------- round trip


@contextmanager
def emulator(deployment: str, speed: float, style: str = "vllm") -> Iterator[str]:
    port = _closed_port()
    proc = subprocess.Popen([sys.executable, "-m", "basin", "emulate", "--deployment", deployment, "--speed",
                             str(speed), "--metrics-style", style, "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("basin emulate did not start")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("deployment, flags, shape", [
    ("1C-h100-nvl", ["--chunk-tokens", "8192", "--max-running-requests", "512"], "1C"),
    ("1p1d-h100", ["--topology", "pd"], "1P1D"),
])
def test_calibrating_the_emulator_recovers_the_emulated_hardware(capsys, tmp_path, deployment, flags, shape) -> None:
    """H100 NVL emulated at 20x as one colocated server (the default reading; its step budget and
    running limit given, as for a vLLM that does not declare them) and as GPU-only 1P1D (read as
    PD): every fitted figure within 10% of its profile."""
    out = tmp_path / "emu.yaml"
    with emulator(deployment, 20) as url:
        code, text, err = run_basin(capsys, "calibrate", "--engine", url, "--engine-kind", "vllm", "--out",
                                    str(out), "--budget-s", "180", *flags)
    assert code == 0, err
    assert "wrote" in text and out.is_file()
    truth = load_hardware("h100-nvl")
    got = load_hardware(str(out))
    dep = load_deployment(str(out))
    assert dep.shape == shape
    colocated = shape == "1C"
    pool = truth.prefill.prefix_cache_tokens
    pairs = {
        "prefill tokens/s": (got.prefill.linear_tokens_per_s, truth.prefill.linear_tokens_per_s),
        "prefill attention": (got.prefill.attention_s_per_token_position,
                              truth.prefill.attention_s_per_token_position),
        # Colocated: one step overhead a prefill step; PD: step overhead and KV transfer a call.
        "fixed": (got.prefill.step_overhead_s, truth.prefill.step_overhead_s) if colocated else
        (got.transfer_s, truth.transfer_s + truth.prefill.step_overhead_s),
        "decode base": (got.decode.step_base_s, truth.decode.step_base_s),
        "decode per request": (got.decode.step_per_request_s, truth.decode.step_per_request_s),
        "decode per context token": (got.decode.step_per_context_token_s, truth.decode.step_per_context_token_s),
        "prefix cache": (got.prefill.prefix_cache_tokens, pool),
        # A colocated server's one pool holds running requests too; PD's decode has its own KV.
        "KV": (got.decode.kv_tokens, pool if colocated else truth.decode.kv_tokens),
    }
    off = {k: g / t - 1 for k, (g, t) in pairs.items()}
    assert all(abs(v) <= 0.10 for v in off.values()), off
    data = yaml.safe_load(out.read_text())
    cal = data["calibration"]
    assert data["deployment"]["topology"] == ("colocated" if colocated else "pd")
    assert (got.transfer_s == 0) == colocated and (got.prefill.step_overhead_s == 0) != colocated
    if colocated:
        assert got.prefill.chunk_tokens == 8192 and cal["figures_from"]["chunk_tokens"].startswith("--chunk-tokens")
        assert got.decode.max_running_requests == 512 and "--max-running-requests" in cal["figures_from"][
            "max_running_requests"]
        assert cal["prefill"]["fixed_s_per"].startswith("prefill step of at most 8192")
        # The emulated server's prefill is the fit's formula, steps counted: exactly (without them, 0.3% RMS).
        assert cal["prefill"]["fit"]["rms_relative_residual"] < 1e-3
        assert max(p["prefill_in_decode_s"]["median"] for p in cal["decode_batch"]["points"]) > 0
    else:
        assert cal["figures_from"]["chunk_tokens"].startswith("the longest prompt measured")
        assert all(p["prefill_in_decode_s"]["median"] == 0 for p in cal["decode_batch"]["points"])
    assert cal["clock"] == "engine" and cal["prefill"]["fit"]["relative_residuals"]
    assert all(p["ttft_s"]["n"] >= 1 and "iqr" in p["ttft_s"] for p in cal["prefill"]["points"])
    assert cal["prefix_cache"]["measured_tokens"] and cal["prefix_cache"]["declared_tokens"] == 1089984
    declared_kv = 1090000 if colocated else 1660000  # the pool, or decode KV (basin_emulator_decode_kv_tokens)
    assert cal["kv_capacity"]["measured_tokens"] and cal["kv_capacity"]["declared_tokens"] == declared_kv
    assert run_on_profile(capsys, tmp_path, out, {"name": "terminal-bench", "sessions": 60})["n_completed"] > 0


def run_on_profile(capsys, tmp_path: Path, profile: Path, workload: dict) -> dict:
    """``basin run`` for 10 simulated minutes on a calibrated profile (by path); its summary row."""
    scenario = tmp_path / "on-profile.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "on-calibrated", "deployment": str(profile), "workload": workload,
        "arrivals": {"base_per_min": 2.0}, "duration_min": 10, "measure_end_min": 10}))
    code, text, err = run_basin(capsys, "run", str(scenario), "--out", str(tmp_path / "run"), "--no-plots", "--json")
    assert code == 0, err
    return json.loads(text)[0]
