"""Every number the fluid model uses, derived from a deployment profile and a
workload, each kept with its unit and where it came from.

The model must not know the simulator's code (it is checked against the
simulator, not built from it). It reads the same *data*: hardware profiles
and deployments through :mod:`basin.sim.config`'s loaders, and workload
records through :mod:`basin.workload`. Engine costs are computed with the
profile's own cost methods (``PrefillProfile.tokens_cost_s``,
``DecodeProfile.step_s``), so a recalibrated profile reaches the model
without any number being copied.

Averages over calls are exact means over the workload's calls; where the
model needs an average *in time* (the context of a session picked at a
random moment, the size of a request found in decode memory), the mean is
weighted by how long each phase lasts, because that is what a snapshot of the
engine sees (Little's law).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from basin.catalog import Deployment, HardwareProfile, load_deployment, load_hardware
from basin.errors import BasinInputError
from basin.workload.presets import resolve_workload
from basin.workload.records import Workload
from basin.workload.stats import workload_stats
from basin.workload.synthetic import SYNTHETIC_PRESETS
from basin.workload.transforms import scale_workload, truncate_calls

#: Sessions synthesised for a synthetic preset when none is asked for: enough
#: for the means to settle (the scenarios draw from pools of this size).
DEFAULT_SESSIONS = 2000


@dataclass(frozen=True, slots=True)
class Param:
    """One derived parameter as ``basin model analyze`` prints it."""

    key: str
    symbol: str
    value: float
    unit: str
    origin: str

    def to_dict(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "value": self.value, "unit": self.unit, "origin": self.origin}


@dataclass(frozen=True, slots=True)
class WorkloadInput:
    """Which workload the model describes: a preset or file and the transforms
    a scenario would apply (so the model sees the sessions the simulator runs)."""

    name: str = "terminal-bench"
    sessions: int | None = None
    seed: int = 0
    tool_time: float = 1.0
    output: float = 1.0
    prompt: float = 1.0
    max_calls: int | None = None

    def label(self) -> str:
        parts = [self.name]
        for tag, value in (("tools", self.tool_time), ("output", self.output), ("prompt", self.prompt)):
            if value != 1.0:
                parts.append(f"{tag} x{value:g}")
        if self.max_calls is not None:
            parts.append(f"first {self.max_calls} calls")
        return ", ".join(parts)


def load_workload(spec: WorkloadInput) -> Workload:
    """The sessions ``spec`` stands for, transformed as a scenario would be."""
    sessions = spec.sessions
    if sessions is None:
        sessions = DEFAULT_SESSIONS if spec.name in SYNTHETIC_PRESETS else None
    w = resolve_workload(spec.name, seed=spec.seed, n_sessions=sessions)
    if (spec.tool_time, spec.output, spec.prompt) != (1.0, 1.0, 1.0):
        w = scale_workload(w, tool_time=spec.tool_time, output=spec.output, prompt=spec.prompt)
    if spec.max_calls is not None:
        w = truncate_calls(w, spec.max_calls)
    return w


@dataclass(frozen=True, slots=True)
class WorkloadMeans:
    """The workload's averages the model is built on (see the module docstring
    for which are call means and which are time-weighted)."""

    calls_per_session: float
    calls_per_session_var: float
    tool_gap_s: float
    unloaded_call_s: float
    prompt_tokens: float
    new_tokens: float
    output_tokens: float
    mean_context_tokens: float
    decode_steps: float
    decode_context_tokens: float
    decode_kv_per_request_tokens: float
    recompute_s_per_call: float
    prompt_p50_tokens: float
    tool_gap_p50_s: float | None


def workload_means(workload: Workload, hardware: HardwareProfile) -> WorkloadMeans:
    """Means of ``workload`` with call costs on ``hardware``.

    The unloaded call latency follows the simulator's unloaded reference
    (CALIBRATION.md: "new-suffix prefill, batch-one decode with the engine's
    calibrated costs"): per call, one prefill step's overhead, the new
    suffix's compute after its reused prefix, the PD transfer, and decode at
    batch one, whose step grows by one context token per step.
    """
    pre, dec = hardware.prefill, hardware.decode
    sessions = workload.sessions
    prompt = np.array([c.prompt_tokens for s in sessions for c in s.calls], dtype=float)
    new = np.array([c.new_tokens for s in sessions for c in s.calls], dtype=float)
    out = np.array([c.output_tokens for s in sessions for c in s.calls], dtype=float)
    gap = np.array([c.tool_gap_s for s in sessions for c in s.calls], dtype=float)
    reused = prompt - new

    steps = np.maximum(out - 1.0, 0.0)
    first_step = dec.step_s(1, prompt + 1.0)
    per_token = dec.step_s(1, 1) - dec.step_s(1, 0)  # growth of a batch-one step per context token
    decode_s = steps * first_step + per_token * steps * (steps - 1.0) / 2.0
    frontend_s = prompt * pre.frontend_s_per_prompt_token
    prefill_s = pre.step_overhead_s + pre.tokens_cost_s(new, reused) + hardware.transfer_s + frontend_s
    call_s = prefill_s + decode_s

    # A session spends call_s in a call (context: its prompt) and then its gap
    # (context: prompt plus output); a random moment lands in a phase with
    # probability proportional to its length.
    time_weight = call_s + gap
    ctx_share = (call_s * prompt + gap * (prompt + out)) / np.maximum(time_weight.sum(), 1e-300)

    # A request occupies decode memory for about its decode steps, so the
    # requests found there are weighted by their steps. Its reservation is the
    # prompt plus ``r`` output tokens until it has generated more than ``r``,
    # then grows a token a step: over its decode it holds ``P + r`` on
    # average when ``o <= r``, else ``P + (o^2 + r^2) / (2 o)``.
    w_dec = np.maximum(steps, 1.0)
    r = float(dec.reserve_output_tokens)
    held = np.where(out <= r, r, (out ** 2 + r ** 2) / (2.0 * np.maximum(out, 1.0)))
    decode_ctx = float(np.sum(w_dec * (prompt + out / 2.0)) / w_dec.sum())
    kv_req = float(np.sum(w_dec * (prompt + held)) / w_dec.sum())

    chunks = np.ceil(prompt / pre.chunk_tokens)
    recompute_s = chunks * pre.step_overhead_s + pre.tokens_cost_s(prompt, 0) + frontend_s

    stats = workload_stats(workload)
    per_session = np.array([s.n_calls for s in sessions], dtype=float)
    return WorkloadMeans(
        calls_per_session=prompt.size / len(sessions),
        calls_per_session_var=float(per_session.var()),
        tool_gap_s=float(gap.sum() / prompt.size),
        unloaded_call_s=float(call_s.mean()),
        prompt_tokens=float(prompt.mean()),
        new_tokens=float(new.mean()),
        output_tokens=float(out.mean()),
        mean_context_tokens=float(ctx_share.sum()),
        decode_steps=float(steps.mean()),
        decode_context_tokens=decode_ctx,
        decode_kv_per_request_tokens=kv_req,
        recompute_s_per_call=float(recompute_s.mean()),
        prompt_p50_tokens=stats.prompt_tokens_p50,
        tool_gap_p50_s=stats.tool_gap_s_p50,
    )


@dataclass(frozen=True)
class FluidParams:
    """The fluid model's parameters. Rates are per second (calls) unless a
    name says otherwise; token counts are tokens. ``provenance`` holds every
    one with its unit and origin, in print order."""

    deployment: str
    hardware: str
    workload: str
    calls_per_session: float          # K
    tool_gap_s: float                 # g (tool time per call)
    unloaded_call_s: float            # L0
    prompt_tokens: float              # P
    new_tokens: float                 # n_new
    mean_context_tokens: float        # c_bar
    cache_tokens: float               # C
    prefill_tokens_per_s: float       # mu_p (all prefill instances)
    decode_instances: int
    decode_kv_tokens: float           # D_KV (all decode instances)
    decode_kv_per_request_tokens: float
    max_batch_per_instance: float     # B_max
    decode_steps: float               # m (tokens decoded after the first)
    decode_step_base_s: float         # s0
    decode_step_per_request_s: float  # s1 (one more running request at the mean context)
    fraction_in_service: float        # f
    knee_ratio: float                 # x_k
    host_ratio: float
    progress_stages: int = 1          # M (dynamics only)
    #: Colocated servers: prefill and decode share compute, and the running
    #: requests' KV and the prefix cache share one pool (``cache_tokens``).
    colocated: bool = False
    provenance: tuple[Param, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in ("calls_per_session", "prompt_tokens", "mean_context_tokens", "cache_tokens",
                     "prefill_tokens_per_s", "decode_kv_tokens", "max_batch_per_instance",
                     "decode_step_base_s", "knee_ratio"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise BasinInputError(f"fluid model parameter '{name}' must be a finite number > 0, got {value!r}")
        for name in ("tool_gap_s", "unloaded_call_s", "new_tokens", "decode_steps", "decode_step_per_request_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise BasinInputError(f"fluid model parameter '{name}' must be a finite number >= 0, got {value!r}")

    def decode_call_s(self, batch: float | np.ndarray) -> float | np.ndarray:
        """Decode time of a mean call sharing each step with ``batch - 1`` others."""
        return self.decode_steps * (self.decode_step_base_s + self.decode_step_per_request_s * batch)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {p.key: p.to_dict() for p in self.provenance}


def derive_params(deployment: Deployment, hardware: HardwareProfile, workload: Workload,
                  knee_ratio: float, curve_label: str, workload_label: str | None = None) -> FluidParams:
    """Every model parameter of ``deployment`` serving ``workload``.

    ``knee_ratio`` and ``curve_label`` come from the hit curve in use (its
    knee is the ``x_k`` of the paper's Eq. 2).
    """
    m = workload_means(workload, hardware)
    pre, dec = hardware.prefill, hardware.decode
    n_p, n_d = deployment.prefill_instances, deployment.decode_instances
    gpu_cache = float(n_p * pre.prefix_cache_tokens)
    cache = gpu_cache * max(1.0, deployment.host_ratio)
    mu_p = n_p * m.prompt_tokens / m.recompute_s_per_call
    colocated = deployment.topology == "colocated"
    # A colocated server's running requests hold KV in the pool that is also its cache.
    kv_per_instance = pre.prefix_cache_tokens if colocated else dec.kv_tokens
    kv_total = float(n_d * kv_per_instance)
    b_max = min(kv_per_instance / m.decode_kv_per_request_tokens, float(dec.max_running_requests))
    s0 = dec.step_s(0, 0)
    s1 = dec.step_s(1, m.decode_context_tokens) - s0
    # Fraction of an active session's life spent in a call when decode memory
    # is full: each call then decodes in a batch of B_max.
    loaded_call_s = m.unloaded_call_s + m.decode_steps * s1 * (b_max - 1.0)
    f = loaded_call_s / (loaded_call_s + m.tool_gap_s)
    # Erlang shape with the spread of calls per session (at least 1 stage).
    stages = max(1, int(round(m.calls_per_session ** 2 / m.calls_per_session_var))) \
        if m.calls_per_session_var > 0 else 1

    wl = workload_label or workload.name
    tier = ("GPU-only" if deployment.host_ratio <= 0 else
            f"host tier {deployment.host_ratio:g}x GPU, inclusive: C = max(C_G, C_H)")
    if colocated:
        tier = "colocated: one pool per server, shared with the running requests' KV"
    prov = (
        Param("calls_per_session", "K", m.calls_per_session, "calls", f"mean calls per session of {wl}"),
        Param("tool_gap_s", "g", m.tool_gap_s, "s",
              f"tool time per call: all tool gaps / all calls of {wl} (median gap {m.tool_gap_p50_s or 0:.2f} s)"),
        Param("unloaded_call_s", "L0", m.unloaded_call_s, "s",
              f"mean unloaded call on {hardware.name}: step overhead + PrefillProfile.tokens_cost_s(new, reused) "
              "+ front end (prompt x frontend_s_per_prompt_token) + transfer + batch-one decode "
              "(DecodeProfile.step_s), as the simulator's unloaded reference"),
        Param("prompt_tokens", "P", m.prompt_tokens, "tokens",
              f"mean prompt per call of {wl} (median {m.prompt_p50_tokens:,.0f})"),
        Param("new_tokens", "n_new", m.new_tokens, "tokens", f"mean new suffix per call of {wl}"),
        Param("mean_context_tokens", "c_bar", m.mean_context_tokens, "tokens",
              "mean context of an active session at a random moment (calls and tool gaps weighted by duration)"),
        Param("cache_tokens", "C", cache, "tokens",
              f"{n_p} prefill x {pre.prefix_cache_tokens:,} prefix-cache tokens ({hardware.name}), {tier}"),
        Param("knee_ratio", "x_k", knee_ratio, "W/C", f"knee of the hit curve: {curve_label}"),
        Param("prefill_tokens_per_s", "mu_p", mu_p, "tokens/s",
              f"saturated uncached prefill of {n_p} instance(s): mean prompt recomputed from position 0 "
              "(PrefillProfile.tokens_cost_s plus a step overhead per chunk and the front end's read)"),
        Param("decode_kv_tokens", "D_KV", kv_total, "tokens",
              f"{n_d} server(s) x {kv_per_instance:,} tokens: the pool that is also the cache" if colocated
              else f"{n_d} decode x {dec.kv_tokens:,} KV tokens"),
        Param("decode_kv_per_request_tokens", "kv_req", m.decode_kv_per_request_tokens, "tokens",
              f"decode memory a request holds on average while decoding: prompt + reserve "
              f"{dec.reserve_output_tokens}, growing past it with long outputs; weighted by decode steps"),
        Param("max_batch_per_instance", "B_max", b_max, "requests",
              "decode KV per instance / kv_req (capped by max_running_requests)"),
        Param("decode_steps", "m", m.decode_steps, "steps", f"mean output tokens - 1 per call of {wl}"),
        Param("decode_step_base_s", "s0", s0, "s", "DecodeProfile.step_s(0, 0)"),
        Param("decode_step_per_request_s", "s1", s1, "s",
              "DecodeProfile.step_s(1, ctx) - s0 at the decoding requests' mean context "
              f"{m.decode_context_tokens:,.0f}"),
        Param("fraction_in_service", "f", f, "",
              "share of an active session's time spent in a call with decode memory full: "
              "L/(L+g), L = L0 + m s1 (B_max - 1)"),
        Param("progress_stages", "M", float(stages), "stages",
              f"stages of session progress in the ODE: round(K^2 / Var K) of {wl}'s calls per session "
              f"(Var K {m.calls_per_session_var:,.0f}); departures lag a surge's arrivals by a lifetime"),
    )
    return FluidParams(
        deployment=deployment.name, hardware=hardware.name, workload=wl,
        calls_per_session=m.calls_per_session, tool_gap_s=m.tool_gap_s, unloaded_call_s=m.unloaded_call_s,
        prompt_tokens=m.prompt_tokens, new_tokens=m.new_tokens, mean_context_tokens=m.mean_context_tokens,
        cache_tokens=cache, prefill_tokens_per_s=mu_p, decode_instances=n_d, decode_kv_tokens=kv_total,
        decode_kv_per_request_tokens=m.decode_kv_per_request_tokens, max_batch_per_instance=b_max,
        decode_steps=m.decode_steps, decode_step_base_s=s0, decode_step_per_request_s=s1,
        fraction_in_service=f, knee_ratio=knee_ratio, host_ratio=deployment.host_ratio, progress_stages=stages,
        colocated=colocated, provenance=prov,
    )


def resolve_deployment(name: str, host_ratio: float | None = None) -> tuple[Deployment, HardwareProfile]:
    """A deployment (file, path or ``xPyD-<hardware>`` shape) and its hardware,
    with the host tier overridden as a scenario's ``host_ratio`` would."""
    dep = load_deployment(name)
    if host_ratio is not None:
        if not (isinstance(host_ratio, (int, float)) and math.isfinite(host_ratio) and host_ratio >= 0):
            raise BasinInputError(
                f"host_ratio: expected a number >= 0 (host tier as a multiple of the GPU cache; 0: GPU-only), "
                f"got {host_ratio!r}")
        dep = dep.model_copy(update={"host_ratio": float(host_ratio)})
    return dep, load_hardware(dep.hardware)
