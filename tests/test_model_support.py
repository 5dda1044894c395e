"""Builders shared by the fluid-model tests: a model from hand-set
parameters (no workload synthesis, so tests stay fast) and a fabricated ramp
timeseries for the simulator-verdict logic."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from basin.model.hitcurve import HitCurve, PaperHitCurve
from basin.model.params import FluidParams
from basin.model.throughput import FluidModel

#: Roughly the calibrated H100 1P1D serving terminal-bench (docs/fluid-model.md).
H100_LIKE = FluidParams(
    deployment="test-1p1d", hardware="test", workload="test",
    calls_per_session=33.0, tool_gap_s=11.6, unloaded_call_s=2.2, prompt_tokens=36000.0, new_tokens=1100.0,
    mean_context_tokens=37800.0, cache_tokens=1.09e6, prefill_tokens_per_s=27500.0, decode_instances=1,
    decode_kv_tokens=1.66e6, decode_kv_per_request_tokens=45000.0, max_batch_per_instance=36.9,
    decode_steps=387.0, decode_step_base_s=0.005, decode_step_per_request_s=0.00065,
    fraction_in_service=0.49, knee_ratio=1.9, host_ratio=0.0,
)


def make_model(curve: HitCurve | None = None, sharpness: float = 8.0, **changes: float) -> FluidModel:
    params = replace(H100_LIKE, **changes) if changes else H100_LIKE
    return FluidModel(params, curve or PaperHitCurve(), sharpness)


def ramp_timeseries(minutes: int, *, hit: np.ndarray, decoding: np.ndarray, queue: np.ndarray | None = None,
                    calls_per_min: float = 200.0) -> dict[str, np.ndarray]:
    """Per-minute columns of a ramp with the given hit rate and decoding share."""
    prompt = np.full(minutes, 1e6)
    cap = np.full(minutes, 1.66e6)
    return {
        "minute": np.arange(minutes),
        "arrivals": np.full(minutes, 5.0),
        "calls_completed": np.full(minutes, calls_per_min),
        "sessions_completed": np.full(minutes, calls_per_min / 33),
        "prompt_tokens": prompt,
        "cached_tokens": prompt * hit,
        "loaded_tokens": np.zeros(minutes),
        "uncached_tokens": prompt * (1 - hit),
        "active_sessions": np.linspace(10, 100, minutes),
        "working_set_tokens": np.linspace(1e5, 4e6, minutes),
        "cache_capacity_tokens": np.full(minutes, 1.09e6),
        "host_capacity_tokens": np.zeros(minutes),
        "decode_kv_decoding_tokens": cap * decoding,
        "decode_kv_reserved_idle_tokens": np.zeros(minutes),
        "decode_kv_capacity_tokens": cap,
        "decode_wait_len": np.zeros(minutes),
        "decode_running": np.full(minutes, 20.0),
        "prefill_queue_len": np.zeros(minutes) if queue is None else queue,
        "ttft_p50_s": np.full(minutes, 0.1),
    }
