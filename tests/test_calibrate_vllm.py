"""`basin calibrate` against the real vLLM of `make engine` (CPU build, the
locally written random-weight model), and the profile it writes against fresh
calls to the same engine through scripts/calibrate_check.py.

The engine runs with its KV pool set to 512 blocks of 128 tokens (65,536
tokens), so filling the prefix cache takes seconds rather than minutes.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from tests.support.vllm_server import vllm_server
from tests.test_calibrate import run_on_profile

from basin.catalog import load_deployment, load_hardware

pytestmark = pytest.mark.engine

POOL_TOKENS = 512 * 128
#: Far below the model's 32,768 positions: an uncached prompt of 32K tokens costs about
#: 10 s on this engine, of 16K about 3-5 s, and within a 2-minute budget the cache phase
#: must fill the 65K pool (a fill prompt at a time) and read it back.
MAX_PROMPT_TOKENS = 8000
#: The server's per-step token budget: vLLM 0.32's default for its CPU API server
#: (``engine/arg_utils.py``, ``get_batch_defaults``), which it exports over HTTP only
#: with its development endpoints (VLLM_SERVER_DEV_MODE=1), so calibrate is told.
STEP_BUDGET_TOKENS = 2048
#: Its limit of running requests, the same way (``max_num_seqs``).
MAX_RUNNING_REQUESTS = 128


def _check_module() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "scripts" / "calibrate_check.py"
    spec = importlib.util.spec_from_file_location("calibrate_check", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """One engine and one calibration for the module: (server, profile path, basin calibrate's output)."""
    folder = tmp_path_factory.mktemp("vllm")
    with vllm_server("--num-gpu-blocks-override", "512", log_path=folder / "vllm.log") as server:
        out = folder / "vllm.yaml"
        yield server, out, _calibrate(server.url, out)


def _calibrate(url: str, out: Path) -> tuple[int, str, str]:
    """``basin calibrate`` in its own process (a module fixture cannot capture the in-process CLI's output)."""
    proc = subprocess.run([sys.executable, "-m", "basin", "calibrate", "--engine", url, "--engine-kind", "vllm",
                           "--out", str(out), "--budget-s", "120", "--max-prompt-tokens", str(MAX_PROMPT_TOKENS),
                           "--chunk-tokens", str(STEP_BUDGET_TOKENS), "--max-running-requests",
                           str(MAX_RUNNING_REQUESTS)],
                          capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout, " ".join(proc.stderr.split())


def test_calibrate_vllm_measures_its_pool_and_writes_a_profile_basin_runs(calibrated, capsys, tmp_path) -> None:
    server, out, (code, text, err) = calibrated
    assert code == 0, err
    dep = load_deployment(str(out))
    hw = load_hardware(dep.hardware)
    cal = yaml.safe_load(out.read_text())["calibration"]
    # One colocated server, chunked at the budget it was told: a prefill step's fixed cost, no transfer.
    assert (dep.shape, dep.topology, hw.prefill.chunk_tokens) == ("1C", "colocated", STEP_BUDGET_TOKENS)
    assert cal["figures_from"]["chunk_tokens"].startswith("--chunk-tokens")
    assert hw.decode.max_running_requests == MAX_RUNNING_REQUESTS
    # The server is started without either flag, so its defaults hold.
    assert not any(a.startswith(("--max-num-batched-tokens", "--max-num-seqs")) for a in server.spec["argv"])
    assert hw.transfer_s == 0 and hw.prefill.step_overhead_s > 0
    assert cal["engine"]["declared"]["prefix_cache_tokens"] == POOL_TOKENS
    assert cal["engine"]["declared"]["page_tokens"] == server.block_size_tokens == hw.page_tokens
    assert cal["cached_tokens_from"] == "usage.prompt_tokens_details.cached_tokens"
    assert cal["decode_timed_by"].startswith("vllm:request_decode_time_seconds")
    # Filled and re-read: the pool the engine declares, within one fill prompt.
    measured = cal["prefix_cache"]["measured_tokens"]
    assert abs(measured - POOL_TOKENS) <= cal["prefix_cache"]["fill_prompt_tokens"], measured
    assert hw.prefill.prefix_cache_tokens == measured
    # The KV gauge under load agrees with the same pool.
    assert cal["kv_capacity"]["measured_tokens"] == pytest.approx(POOL_TOKENS, rel=0.10)
    for fit in (cal["prefill"]["fit"], cal["decode_single"]["fit"]):
        assert fit["relative_residuals"] and fit["rms_relative_residual"] < 0.5
    # Batched decode on this CPU pays about four times a single call's cost per context
    # token, which the additive step formula cannot follow: kept, with its residuals.
    assert cal["decode_batch"]["fit"]["relative_residuals"]
    workload = {"name": "terminal-bench", "sessions": 40, "prompt": 0.1, "output": 0.5}
    assert run_on_profile(capsys, tmp_path, out, workload)["n_completed"] > 0


@pytest.mark.realtime
def test_simulated_latencies_on_the_profile_match_fresh_vllm_calls(calibrated) -> None:
    """Fresh single calls (128 tokens up to the longest prompt calibrated) and a batch of 8:
    the simulator on the calibrated profile within 15% of the measured median latency (wall
    clock, so a busy machine moves it: a realtime test)."""
    server, out, (code, _, err) = calibrated
    assert code == 0, err
    rows = _check_module().check(server.url, "vllm", str(out), [128, 1024, 4096, MAX_PROMPT_TOKENS], 8, 512, 64, 3)
    errors = {r["case"]: round(float(r["latency_error"]), 3) for r in rows}
    assert all(abs(e) <= 0.15 for e in errors.values()), errors
