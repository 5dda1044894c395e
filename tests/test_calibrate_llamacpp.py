"""`basin calibrate` against the real llama.cpp server of the gateway's tests
(two slots, no host-RAM prompt cache), then `basin run` on the profile it wrote."""

from __future__ import annotations

import pytest
import yaml
from tests.cli_helpers import run_basin
from tests.gateway.llama_server import llama_server
from tests.test_calibrate import run_on_profile

from basin.catalog import cache_capacity, load_deployment, load_hardware

pytestmark = pytest.mark.engine


def test_calibrate_llamacpp_writes_a_profile_that_basin_run_runs(capsys, tmp_path) -> None:
    out = tmp_path / "llama.yaml"
    with llama_server(slots=2, context_tokens=4096, log_path=tmp_path / "server.log") as url:
        code, text, err = run_basin(capsys, "calibrate", "--engine", url, "--engine-kind", "llamacpp", "--out",
                                    str(out), "--budget-s", "120", "--max-prompt-tokens", "512")
    assert code == 0, err
    dep = load_deployment(str(out))
    hw = load_hardware(dep.hardware)
    cal = yaml.safe_load(out.read_text())["calibration"]
    assert cal["engine"]["kind"] == "llamacpp" and cal["engine"]["declared"]["max_running_requests"] == 2
    # Two slots keep two prompts: filling with ~512-token prompts finds about two of them.
    fill = cal["prefix_cache"]["fill_prompt_tokens"]
    assert 1.5 * fill <= cal["prefix_cache"]["measured_tokens"] <= 2.5 * fill
    assert hw.prefill.prefix_cache_tokens == cal["prefix_cache"]["measured_tokens"]
    assert hw.decode.kv_tokens == 4096 and hw.decode.max_running_requests == 2
    assert 10 < hw.prefill.linear_tokens_per_s < 1e6 and cal["prefill"]["fit"]["relative_residuals"]
    assert cache_capacity(dep, hw).effective_tokens == hw.prefill.prefix_cache_tokens
    # The simulator runs on it: agent sessions shrunk to what two 2,048-token slots hold.
    workload = {"name": "terminal-bench", "sessions": 40, "prompt": 0.003, "output": 0.1}
    assert run_on_profile(capsys, tmp_path, out, workload)["n_completed"] > 0
