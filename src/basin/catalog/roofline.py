"""Any model on any GPU: a hardware profile derived from a model's
architecture, a GPU's spec figures and a tensor-parallel degree.

Peak figures alone overstate an engine several times (kernel launches,
MoE GEMMs far from peak, memory the engine keeps for itself), so each cost
term is the peak-rate time divided by the fraction of peak the *reference*
pair achieves: the measured profile of the paper's model on the paper's GPU
(``profiles/gpus/roofline/settings.yaml`` names it). Those fractions are
read from the reference profile at run time, never typed, so recalibrating
the reference moves every derived profile. Where a measured profile of the
pair itself exists (the GPU file's ``calibrated``, tensor parallelism 1), it
is used as is and the roofline is only reported beside it.

A derived profile is named ``MODEL@GPU`` (``MODEL@GPU/tpN`` for ``tp > 1``),
and :func:`basin.catalog.load_hardware` resolves such names, so a deployment
naming one runs in the simulator exactly as a shipped one does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from basin.catalog.gpus import GpuSpec, gpu_names, load_gpu
from basin.catalog.hardware import DecodeProfile, HardwareProfile, PrefillProfile, load_hardware
from basin.catalog.models import ModelSpec, load_model, model_names
from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR
from basin.yamlfile import load_yaml, validation_message

SETTINGS_FILE = PROFILE_DIR / "gpus" / "roofline" / "settings.yaml"
_NAME = re.compile(r"^(?P<model>[^@/]+)@(?P<gpu>[^@/]+)(?:/tp(?P<tp>\d+))?$")


class _Pair(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str
    gpu: str


class RooflineSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    reference: _Pair
    allreduce_latency_s: float = Field(ge=0)
    activation_bytes: int = Field(gt=0)


@lru_cache(maxsize=2)
def load_settings(path: Path = SETTINGS_FILE) -> RooflineSettings:
    try:
        return RooflineSettings.model_validate(load_yaml(path))
    except ValidationError as exc:
        raise BasinInputError(validation_message(path, exc)) from None


def hardware_name(model: str, gpu: str, tp: int = 1) -> str:
    """The name a derived profile goes by: ``MODEL@GPU`` or ``MODEL@GPU/tpN``."""
    return f"{model}@{gpu}" + (f"/tp{tp}" if tp != 1 else "")


def parse_hardware_name(name: str) -> tuple[str, str, int] | None:
    """``(model, gpu, tp)`` of a derived profile's name, None for any other name."""
    m = _NAME.match(name)
    if m is None:
        return None
    tp = int(m.group("tp") or 1)
    if tp < 1:
        raise BasinInputError(f"hardware '{name}': tensor parallelism must be >= 1 (…/tp1, …/tp2, …)")
    return m.group("model"), m.group("gpu"), tp


# --------------------------------------------------------------------- peaks
@dataclass(frozen=True, slots=True)
class Peaks:
    """Times and sizes at the GPU's peak figures for one instance of ``tp`` GPUs."""

    linear_s_per_token: float       # 2 x active params FLOPs at the model's precision
    allreduce_s_per_token: float    # tensor-parallel all-reduce traffic of one prefill token
    attention_s_per_position: float  # 4 x heads x head_dim x attention layers FLOPs in BF16
    weight_read_s: float            # weights every decode step reads (all but routed experts)
    expert_read_s_per_request: float  # routed experts one more request activates
    context_s_per_token: float      # KV bytes of one context token
    host_tokens_per_s: float        # host link over KV bytes per token
    hbm_bytes: float
    kv_bytes_per_token: float
    state_bytes_per_request: float


def peaks(model: ModelSpec, gpu: GpuSpec, tp: int, settings: RooflineSettings) -> Peaks:
    flops = tp * gpu.flops(model.weight_precision)
    bandwidth = tp * gpu.hbm_tb_per_s * 1e12
    kv = model.kv_bytes_per_token(tp)
    ring = 2.0 * (tp - 1) / tp  # bytes a ring all-reduce moves per byte reduced
    allreduce = 2.0 * model.layers * model.hidden_size * settings.activation_bytes * ring \
        / (gpu.interconnect_gb_per_s * 1e9)
    return Peaks(
        linear_s_per_token=2.0 * model.active_params_b * 1e9 / flops,
        allreduce_s_per_token=allreduce,
        attention_s_per_position=4.0 * model.attention_heads * model.head_dim * model.attention_layers
        / (tp * gpu.flops("bf16")),
        weight_read_s=model.always_read_bytes / bandwidth,
        expert_read_s_per_request=model.expert_bytes_per_token / bandwidth,
        context_s_per_token=kv / bandwidth,
        host_tokens_per_s=tp * gpu.host_link_gb_per_s * 1e9 / kv,
        hbm_bytes=tp * gpu.hbm_gb * 1e9,
        kv_bytes_per_token=kv,
        state_bytes_per_request=model.state_bytes_per_request,
    )


@dataclass(frozen=True, slots=True)
class Efficiencies:
    """What the reference pair achieves of its peaks (each the measured
    figure over the peak-rate one), and the engine settings it runs with."""

    reference: str
    compute: float
    attention: float
    bandwidth: float
    decode_overhead_s: float
    host_link: float
    memory_prefill: float
    memory_decode: float
    engine: HardwareProfile


@lru_cache(maxsize=4)
def reference_efficiencies(model_name: str, gpu_name: str) -> Efficiencies:
    """Achieved fractions of peak of the measured profile of ``model`` on ``gpu``."""
    model, gpu = load_model(model_name), load_gpu(gpu_name)
    if model_name not in gpu.calibrated:
        raise BasinInputError(f"{SETTINGS_FILE}: reference {model_name} on {gpu_name} has no measured profile; "
                              f"name one in profiles/gpus/{gpu_name}.yaml 'calibrated'")
    ref = load_hardware(gpu.calibrated[model_name])
    pk = peaks(model, gpu, 1, load_settings())
    pre, dec = ref.prefill, ref.decode
    pool = dec.max_running_requests * pk.state_bytes_per_request

    def used(tokens: int) -> float:
        return (tokens * pk.kv_bytes_per_token + model.weight_bytes + pool) / pk.hbm_bytes

    bandwidth = pk.context_s_per_token / dec.step_per_context_token_s
    return Efficiencies(
        reference=f"{model_name} on {gpu_name} (profiles/hardware/{ref.name}.yaml)",
        compute=pk.linear_s_per_token * pre.linear_tokens_per_s,
        attention=pk.attention_s_per_position / pre.attention_s_per_token_position,
        bandwidth=bandwidth,
        decode_overhead_s=dec.step_base_s - pk.weight_read_s / bandwidth,
        host_link=pre.load_tokens_per_s / pk.host_tokens_per_s,
        memory_prefill=used(pre.prefix_cache_tokens),
        memory_decode=used(dec.kv_tokens),
        engine=ref,
    )


# ------------------------------------------------------------------- profiles
@dataclass(frozen=True, slots=True)
class Figure:
    """One field of a derived profile and where its value came from."""

    field: str
    value: float | int | None
    origin: str


@dataclass(frozen=True)
class DerivedHardware:
    """A profile for ``model`` on ``gpu`` x ``tp`` and how each field was found."""

    profile: HardwareProfile
    model: ModelSpec
    gpu: GpuSpec
    tp: int
    source: Literal["calibrated", "roofline"]
    figures: tuple[Figure, ...]
    #: The roofline's own profile (the same object when ``source`` is roofline).
    roofline: HardwareProfile


def _tokens(kind: str, fraction: float, pk: Peaks, model: ModelSpec, pool: float, gpu: GpuSpec, tp: int) -> int:
    free = fraction * pk.hbm_bytes - model.weight_bytes - pool
    if free < pk.kv_bytes_per_token * 1024:
        raise BasinInputError(
            f"{model.name} on {gpu.name} x tp {tp}: no room for a {kind} KV cache ({model.weight_bytes / 1e9:,.0f} GB "
            f"of weights and {pool / 1e9:,.1f} GB of linear-attention state in {fraction * pk.hbm_bytes / 1e9:,.0f} GB "
            f"usable); raise tp (e.g. tp: {2 * tp}) or pick a GPU with more memory")
    return int(free // pk.kv_bytes_per_token)


def roofline_profile(model: ModelSpec, gpu: GpuSpec, tp: int) -> tuple[HardwareProfile, tuple[Figure, ...]]:
    """The roofline's profile of ``model`` on ``gpu`` x ``tp`` with each field's origin."""
    settings = load_settings()
    eff = reference_efficiencies(settings.reference.model, settings.reference.gpu)
    pk = peaks(model, gpu, tp, settings)
    eng = eff.engine
    pool = eng.decode.max_running_requests * pk.state_bytes_per_request
    ref = eff.reference
    inst = f"{tp} x {gpu.name}" if tp > 1 else gpu.name
    prec = model.weight_precision.upper()

    per_token_compute = pk.linear_s_per_token / eff.compute
    linear = 1.0 / (per_token_compute + pk.allreduce_s_per_token)
    attention = pk.attention_s_per_position / eff.attention
    prefix = _tokens("prefix", eff.memory_prefill, pk, model, pool, gpu, tp)
    kv = _tokens("decode", eff.memory_decode, pk, model, pool, gpu, tp)
    tp_latency = 2.0 * model.layers * settings.allreduce_latency_s if tp > 1 else 0.0
    base = eff.decode_overhead_s + pk.weight_read_s / eff.bandwidth + tp_latency
    per_req = (pk.expert_read_s_per_request / eff.bandwidth + per_token_compute) if model.is_moe \
        else per_token_compute
    sat = (math.ceil(model.experts / model.experts_per_token)
           if model.experts is not None and model.experts_per_token is not None else None)
    per_ctx = pk.context_s_per_token / eff.bandwidth
    load = pk.host_tokens_per_s * eff.host_link

    mem = (f"({{frac:.3f}} x {pk.hbm_bytes / 1e9:,.0f} GB HBM of {inst} - {model.weight_bytes / 1e9:,.1f} GB weights"
           + (f" - {pool / 1e9:,.1f} GB linear-attention state of {eng.decode.max_running_requests} requests"
              if pool else "") + f") / {pk.kv_bytes_per_token:,.0f} B of KV per token; the fraction used as "
           f"on the reference {ref}")
    figs: tuple[Figure, ...] = (
        Figure("prefill.prefix_cache_tokens", prefix, mem.format(frac=eff.memory_prefill)),
        Figure("prefill.linear_tokens_per_s", linear,
               f"2 x {model.active_params_b:g}B active params in {prec} at {tp} x "
               f"{gpu.flops(model.weight_precision) / 1e12:,.0f} dense TFLOP/s, "
               f"at the reference's {eff.compute:.1%} of peak"
               + (f", plus {pk.allreduce_s_per_token * 1e6:.2f} us of all-reduce per token over "
                  f"{gpu.interconnect_gb_per_s:g} GB/s" if tp > 1 else "")),
        Figure("prefill.attention_s_per_token_position", attention,
               f"4 x {model.attention_heads} heads x {model.head_dim} x {model.attention_layers} attention layers "
               f"FLOPs per token-position in BF16, at the reference's {eff.attention:.1%} of peak"),
        Figure("prefill.load_tokens_per_s", load,
               f"{tp} x {gpu.host_link_gb_per_s:g} GB/s host link / {pk.kv_bytes_per_token:,.0f} B per token, "
               f"at the reference's {eff.host_link:.1%}"),
        Figure("decode.kv_tokens", kv, mem.format(frac=eff.memory_decode)),
        Figure("decode.step_base_s", base,
               f"{model.always_read_bytes / 1e9:,.1f} GB of always-read weights over {tp} x "
               f"{gpu.hbm_tb_per_s:g} TB/s at the reference's {eff.bandwidth:.1%} of peak bandwidth, "
               "plus the reference's "
               f"{eff.decode_overhead_s * 1e3:.2f} ms per-step overhead"
               + (f" and 2 x {model.layers} all-reduces of {settings.allreduce_latency_s * 1e6:g} us"
                  if tp > 1 else "")),
        Figure("decode.step_per_request_s", per_req,
               (f"{model.experts_per_token} routed experts ({model.expert_bytes_per_token / 1e9:,.2f} GB) read per "
                "added request at the same bandwidth, plus its compute" if model.is_moe else
                "a request's compute (2 x params FLOPs) at the prefill's achieved rate")),
        Figure("decode.step_per_context_token_s", per_ctx,
               f"{pk.kv_bytes_per_token:,.0f} B of KV per context token over {tp} x {gpu.hbm_tb_per_s:g} TB/s at the "
               f"reference's {eff.bandwidth:.1%}"),
        Figure("decode.expert_saturation_batch", sat,
               f"{model.experts} experts / {model.experts_per_token} per token: by then every expert is read"
               if sat is not None else "dense model: every weight is read each step already"),
        Figure("decode.step_per_request_beyond_s", per_token_compute if model.is_moe else 0.0,
               "a request's compute past expert saturation" if model.is_moe else "no saturation"),
    )
    engine_fields = ("page_tokens", "prefill.chunk_tokens", "prefill.step_overhead_s",
                     "prefill.load_threshold_tokens", "decode.reserve_output_tokens",
                     "decode.max_running_requests", "transfer_s", "itl_slo_s")
    eng_dump = eng.model_dump()

    def _get(dotted: str) -> float | int | None:
        part = eng_dump
        for key in dotted.split("."):
            part = part[key]
        return part  # type: ignore[return-value]

    figs = figs + tuple(Figure(f, _get(f), f"engine setting of the reference {ref}") for f in engine_fields)
    name = hardware_name(model.name, gpu.name, tp)
    profile = HardwareProfile(
        name=name,
        description=f"{model.description or model.name} on {inst} (roofline, reference {ref})",
        page_tokens=eng.page_tokens,
        prefill=PrefillProfile(
            prefix_cache_tokens=prefix, chunk_tokens=eng.prefill.chunk_tokens,
            step_overhead_s=eng.prefill.step_overhead_s, linear_tokens_per_s=linear,
            attention_s_per_token_position=attention, load_tokens_per_s=load,
            load_threshold_tokens=eng.prefill.load_threshold_tokens, state_slots=None),
        decode=DecodeProfile(
            kv_tokens=kv, reserve_output_tokens=eng.decode.reserve_output_tokens, step_base_s=base,
            step_per_request_s=per_req, step_per_context_token_s=per_ctx,
            max_running_requests=eng.decode.max_running_requests, expert_saturation_batch=sat,
            step_per_request_beyond_s=per_token_compute if model.is_moe else 0.0),
        transfer_s=eng.transfer_s,
        itl_slo_s=eng.itl_slo_s,
    )
    return profile, figs


@lru_cache(maxsize=64)
def describe(model_name: str, gpu_name: str, tp: int = 1) -> DerivedHardware:
    """The profile of ``model`` on ``gpu`` x ``tp``: the measured one where it
    exists (tp 1), else the roofline's."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise BasinInputError(f"tp: expected a whole number of GPUs per instance >= 1, got {tp!r}")
    try:
        model = load_model(model_name)
    except BasinInputError as exc:
        raise BasinInputError(f"model: {exc}; the catalogue has {', '.join(model_names())}") from None
    try:
        gpu = load_gpu(gpu_name)
    except BasinInputError as exc:
        raise BasinInputError(f"gpu: {exc}; the catalogue has {', '.join(gpu_names())}") from None
    roof, figs = roofline_profile(model, gpu, tp)
    measured = gpu.calibrated.get(model.name) if tp == 1 else None
    if measured is None:
        return DerivedHardware(roof, model, gpu, tp, "roofline", figs, roof)
    profile = load_hardware(measured)
    origin = f"measured profile profiles/hardware/{measured}.yaml (docs/calibration.md)"
    dump = profile.model_dump()
    measured_figs = []
    for f in figs:
        value: object = dump
        for key in f.field.split("."):
            value = value[key]  # type: ignore[index]
        measured_figs.append(Figure(f.field, value, origin))  # type: ignore[arg-type]
    return DerivedHardware(profile, model, gpu, tp, "calibrated", tuple(measured_figs), roof)


def derived_hardware(name: str) -> HardwareProfile:
    """The profile a ``MODEL@GPU[/tpN]`` name stands for."""
    parsed = parse_hardware_name(name)
    if parsed is None:
        raise BasinInputError(f"hardware '{name}': a derived profile is named MODEL@GPU or MODEL@GPU/tpN "
                              f"(models: {', '.join(model_names())}; gpus: {', '.join(gpu_names())})")
    return describe(*parsed).profile


#: Profile fields compared between the roofline and a measured profile.
COMPARED = ("prefill.prefix_cache_tokens", "prefill.linear_tokens_per_s", "prefill.attention_s_per_token_position",
            "prefill.load_tokens_per_s", "decode.kv_tokens", "decode.step_base_s", "decode.step_per_request_s",
            "decode.step_per_context_token_s", "decode.expert_saturation_batch", "decode.step_per_request_beyond_s")


def compare_to_measured(derived: DerivedHardware) -> list[tuple[str, float, float, float]]:
    """``(field, roofline, measured, roofline / measured)`` for a calibrated pair (empty otherwise)."""
    if derived.source != "calibrated":
        return []
    rows = []
    a, b = derived.roofline.model_dump(), derived.profile.model_dump()
    for f in COMPARED:
        x: object = a
        y: object = b
        for key in f.split("."):
            x, y = x[key], y[key]  # type: ignore[index]
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y:
            rows.append((f, float(x), float(y), float(x) / float(y)))
    return rows
