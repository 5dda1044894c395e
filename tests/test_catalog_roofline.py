"""The model and GPU catalogue and the roofline that turns them into a
hardware profile the simulator runs like a shipped one."""

from __future__ import annotations

import pytest
from tests.cli_helpers import run_basin

from basin.catalog import load_deployment, load_hardware
from basin.catalog.gpus import gpu_names, load_gpu
from basin.catalog.models import load_model, model_names
from basin.catalog.roofline import (
    compare_to_measured,
    describe,
    hardware_name,
    parse_hardware_name,
    reference_efficiencies,
)
from basin.errors import BasinInputError


def test_the_catalogue_ships_the_common_models_and_gpus():
    assert {"qwen3.6-35b-a3b", "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-32b", "deepseek-v3"} <= set(model_names())
    assert {"h100-nvl", "h100-sxm", "h200", "b200", "mi300x"} <= set(gpu_names())
    for name in model_names():
        load_model(name)
    for name in gpu_names():
        load_gpu(name)


def test_kv_bytes_follow_the_architecture():
    # The paper's model: 10 full-attention layers x 2 x 2 KV heads x 256 x FP8 = 10 KB (docs/calibration.md).
    assert load_model("qwen3.6-35b-a3b").kv_bytes_per_token() == 10 * 2 * 2 * 256
    llama = load_model("llama-3.1-8b")
    assert llama.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2
    assert llama.kv_bytes_per_token(tp=16) == 2 * llama.kv_bytes_per_token(tp=8)  # 8 KV heads replicated past tp 8
    assert load_model("deepseek-v3").kv_bytes_per_token() == 61 * 576 * 2  # the latent, not per-head K and V
    assert load_model("qwen3.6-35b-a3b").state_bytes_per_request == 30 * 32 * 128 * 128 * 4


def test_a_measured_pair_uses_its_measured_profile_and_reports_the_roofline():
    d = describe("qwen3.6-35b-a3b", "h200")
    assert d.source == "calibrated" and d.profile == load_hardware("h200")
    rows = {f: ratio for f, _, _, ratio in compare_to_measured(d)}
    assert 0.3 < rows["prefill.linear_tokens_per_s"] < 3 and 0.3 < rows["decode.kv_tokens"] < 3


def test_the_reference_pair_is_reproduced_where_its_fractions_were_read():
    d = describe("qwen3.6-35b-a3b", "h100-nvl")
    rows = {f: ratio for f, _, _, ratio in compare_to_measured(d)}
    for f in ("prefill.prefix_cache_tokens", "prefill.linear_tokens_per_s", "decode.kv_tokens",
              "decode.step_base_s", "decode.step_per_context_token_s"):
        assert rows[f] == pytest.approx(1.0, rel=1e-6), f
    eff = reference_efficiencies("qwen3.6-35b-a3b", "h100-nvl")
    assert 0 < eff.compute < 1 and 0 < eff.bandwidth < 1 and 0 < eff.memory_decode < 1


def test_roofline_scales_with_the_hardware():
    sxm, b200 = describe("llama-3.1-8b", "h100-sxm").profile, describe("llama-3.1-8b", "b200").profile
    assert b200.decode.step_per_context_token_s < sxm.decode.step_per_context_token_s
    assert b200.decode.kv_tokens > sxm.decode.kv_tokens
    assert b200.prefill.linear_tokens_per_s > sxm.prefill.linear_tokens_per_s
    tp1, tp2 = describe("qwen2.5-32b", "h100-sxm", 1).profile, describe("qwen2.5-32b", "h100-sxm", 2).profile
    assert tp2.decode.kv_tokens > 2 * tp1.decode.kv_tokens  # the weights are paid once
    assert describe("llama-3.1-8b", "h100-sxm").profile.decode.expert_saturation_batch is None
    assert describe("deepseek-v3", "h200", 8).profile.decode.expert_saturation_batch == 32


def test_names_round_trip_and_resolve_like_shipped_profiles():
    assert parse_hardware_name(hardware_name("llama-3.1-70b", "h200", 2)) == ("llama-3.1-70b", "h200", 2)
    assert parse_hardware_name("h100-nvl") is None
    assert load_hardware("llama-3.1-70b@h200/tp2").name == "llama-3.1-70b@h200/tp2"
    dep = load_deployment("2P4D-llama-3.1-8b@h100-sxm")
    assert dep.hardware == "llama-3.1-8b@h100-sxm" and dep.prefill_instances == 2


def test_a_described_deployment_file_runs_like_a_shipped_one():
    dep = load_deployment("qwen36-h100-2p4d")
    assert dep.hardware == "qwen3.6-35b-a3b@h100-nvl" and dep.host_ratio == 4.0
    assert load_hardware(dep.hardware) == load_hardware("h100-nvl")  # measured costs, bit for bit
    assert load_deployment("llama70b-h200-1p3d").hardware == "llama-3.1-70b@h200/tp2"


def test_bad_descriptions_name_the_field_and_the_fix(tmp_path):
    with pytest.raises(BasinInputError, match=r"model: unknown model 'llama-9'.*the catalogue has"):
        describe("llama-9", "h100-sxm")
    with pytest.raises(BasinInputError, match=r"gpu: unknown gpu 'h100': did you mean h100-nvl or h100-sxm"):
        describe("llama-3.1-8b", "h100")
    with pytest.raises(BasinInputError, match=r"no room for a prefix KV cache.*raise tp \(e.g. tp: 2\)"):
        describe("llama-3.1-70b", "h200", 1)
    bad = tmp_path / "d.yaml"
    bad.write_text("name: x\nmodel: llama-3.1-8b\ngpu: h100-sxm\ntp: 0\nprefill_instances: 1\n"
                   "decode_instances: 1\nhost_ratio: 0\n")
    with pytest.raises(BasinInputError, match="tp"):
        load_deployment(str(bad))
    model = tmp_path / "m.yaml"
    model.write_text("name: m\nlayers: 4\nhidden_size: 64\nattention_heads: 2\nkv_heads: 2\nhead_dim: 32\n"
                     "params_b: 1\nactive_params_b: 2\n")
    with pytest.raises(BasinInputError, match="active_params_b"):
        load_model(str(model))


def test_deployment_show_prints_each_figure_with_its_origin(capsys):
    code, out, _ = run_basin(capsys, "deployment", "show", "llama70b-h200-1p3d")
    assert code == 0 and "roofline" in out and "decode.kv_tokens" in out and "of peak" in out
    code, out, _ = run_basin(capsys, "deployment", "show", "qwen36-h100-2p4d")
    assert code == 0 and "measured profile profiles/hardware/h100-nvl.yaml" in out and "roofline / measured" in out
    code, out, _ = run_basin(capsys, "deployment", "show", "1p3d-h200", "--json")
    assert code == 0 and '"source": "measured"' in out
    code, _, err = run_basin(capsys, "deployment", "show", "2P2D-llama-3.1-70b@h100-sxm")
    assert code == 2 and "raise tp" in err
