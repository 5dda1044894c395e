"""From measurements to a calibrated profile the catalogue reads by name.

Which measurement sets each figure of the hardware profile:

| figure | from |
| --- | --- |
| ``prefill.linear_tokens_per_s``, ``attention_s_per_token_position`` | the prefill fit |
| ``prefill.step_overhead_s`` | colocated: the prefill fit's fixed cost per prefill step; PD: 0 |
| ``prefill.frontend_s_per_prompt_token`` | the prefill fit's cost of every prompt token, cached or not |
| ``transfer_s`` | colocated: 0 (no transfer); PD: the prefill fit's fixed cost per call |
| ``prefill.prefix_cache_tokens`` | filling and re-reading; else the declared pool; else the lower bound reached |
| ``prefill.chunk_tokens`` | the engine's declared budget, or ``--chunk-tokens``; else the longest prompt measured |
| ``decode.step_*`` | single calls (context term), then batches of short and longer prompts |
| ``decode.kv_tokens`` | the KV gauge under load; else declared; else the prefix cache (one shared pool) |
| ``decode.max_running_requests`` | declared; else the largest batch measured |
| ``page_tokens`` | declared; else the largest common divisor of the cached counts seen |

No host tier is measured (``host_ratio`` 0), so the reload rate is set to the
prefill rate (a reload costs what recomputing does) and never charged.

The deployment is one colocated server (``topology: colocated``: a single
vLLM, llama.cpp or SGLang server, whose prefill and decode share each step
and one KV pool), or, measured as one side of a PD pair, one prefill and one
decode instance (``topology: pd``).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path
from typing import Any

import yaml

from basin.calibrate.measure import BATCH_SIZES, Measured
from basin.catalog.calibrated import CalibratedProfile, CalibratedShape, user_profile_dir
from basin.catalog.hardware import DecodeProfile, HardwareProfile, PrefillProfile
from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR


def _pick(*options: tuple[int | None, str]) -> tuple[int, str]:
    for value, source in options:
        if value is not None and value > 0:
            return int(value), source
    raise ValueError("no option")


def build_profile(name: str, m: Measured, itl_slo_s: float) -> CalibratedProfile:
    """The calibrated profile ``name`` of measurements ``m``."""
    pf, cf = m.prefill_fit, m.context_fit
    assert pf is not None and cf is not None
    d = m.declared
    linear = 1.0 / pf["s_per_token"]
    per_context = cf["per_context_token_s"]
    if m.batch_fit is not None:
        base, per_request = m.batch_fit["base_s"], m.batch_fit["per_request_s"]
    else:
        base, per_request = cf["one_request_s"], 0.0
    if base <= 0:
        base = max(cf["one_request_s"] - per_request, 1e-6)
    prefix = m.prefix
    measured_cache = prefix.get("measured_tokens")
    try:
        cache, cache_from = _pick((measured_cache, "measured: filled and re-read"),
                                  (d.prefix_cache_tokens, f"declared: {d.sources.get('prefix_cache_tokens')}"),
                                  (prefix.get("measured_at_least_tokens"), "measured lower bound (budget)"))
    except ValueError:
        raise BasinInputError(f"--engine {m.settings.url}: the prefix cache was not measured (no fill fitted in "
                              f"--budget-s {m.settings.budget_s:g}) and the engine declares no size; give a "
                              "longer budget") from None
    kv, kv_from = _pick((m.kv.get("measured_tokens"), "measured: KV gauge under load"),
                        (d.kv_tokens, f"declared: {d.sources.get('kv_tokens')}"),
                        (cache, "the prefix cache's (one pool for running requests and cache)"))
    largest_batch = max((r["calls"] for r in m.batch_rows), default=1)
    running, running_from = _pick((d.max_running_requests, f"declared: {d.sources.get('max_running_requests')}"),
                                  (largest_batch if largest_batch < BATCH_SIZES[-1] else None,
                                   "the largest batch measured"),
                                  (256, "no limit seen up to the largest batch measured; vLLM's default"))
    chunk, chunk_from = _pick((m.chunk_tokens, m.chunk_from),
                              (m.max_prompt_tokens, "the longest prompt measured (the engine declares no per-step "
                                                    "token budget and --chunk-tokens was not given)"))
    colocated = m.settings.topology == "colocated"
    # The fixed cost: per prefill step on a colocated server (where the
    # simulator charges it), per call in a PD transfer (where it does).
    overhead_s, transfer_s = (pf["fixed_s"], 0.0) if colocated else (0.0, pf["fixed_s"])
    pages = [p for p in m.observed_pages if p > 0]
    page, page_from = _pick((d.page_tokens, f"declared: {d.sources.get('page_tokens')}"),
                            (reduce(math.gcd, pages) if pages else None, "common divisor of the cached counts"),
                            (1, "no cached count seen"))
    hardware = HardwareProfile(
        name=name,
        description=f"calibrated from {m.settings.kind} engine {d.model or ''} at {m.settings.url}".replace("  ", " "),
        page_tokens=page,
        prefill=PrefillProfile(prefix_cache_tokens=cache, chunk_tokens=chunk, step_overhead_s=overhead_s,
                               linear_tokens_per_s=linear,
                               attention_s_per_token_position=pf["attention_s_per_token_position"],
                               frontend_s_per_prompt_token=pf["s_per_prompt_token"],
                               load_tokens_per_s=linear, load_threshold_tokens=0),
        decode=DecodeProfile(kv_tokens=kv, reserve_output_tokens=0, step_base_s=base,
                             step_per_request_s=per_request, step_per_context_token_s=per_context,
                             max_running_requests=running),
        transfer_s=transfer_s,
        itl_slo_s=itl_slo_s,
    )
    calibration = m.record()
    calibration["written_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    calibration["figures_from"] = {"prefix_cache_tokens": cache_from, "kv_tokens": kv_from,
                                   "max_running_requests": running_from, "chunk_tokens": chunk_from,
                                   "page_tokens": page_from,
                                   "step_overhead_s": f"the prefill fit's fixed cost per {m.fixed_per()}"
                                   if colocated else "0: the fixed cost is charged once a call, in transfer_s",
                                   "transfer_s": "0: a colocated server transfers nothing" if colocated
                                   else "the prefill fit's fixed cost per call",
                                   "topology": f"--topology {m.settings.topology}",
                                   "itl_slo_s": "--itl-slo-s (a service target, not a measurement)"}
    shape = CalibratedShape(topology="colocated" if colocated else "pd")
    return CalibratedProfile(name=name, hardware=hardware, deployment=shape, calibration=_plain(calibration))


def _plain(value: Any) -> Any:
    """Plain YAML data: tuples as lists, numpy scalars as Python numbers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        return value.item()
    return value


def write_profile(profile: CalibratedProfile, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = profile.model_dump(mode="json")
    header = (f"# basin calibrate: {profile.name}. Read by name or path wherever a deployment or hardware\n"
              "# profile is taken (docs/calibrate.md); `calibration` keeps every measurement and fit.\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
    return path


def output_path(out: str) -> tuple[str, Path]:
    """``(name, path)`` of ``--out``: a .yaml path, or a bare name written to the user profile folder."""
    given = Path(out)
    if given.suffix in (".yaml", ".yml"):
        return given.stem, given
    if given.name != out or not out or not all(ch.isalnum() or ch in "-_." for ch in out):
        raise BasinInputError(f"--out {out!r}: give a file ending in .yaml, or a bare name (letters, digits, -_.) "
                              "to write to the user profile folder")
    shipped = {p.stem for p in (PROFILE_DIR / "hardware").glob("*.yaml")} | {
        p.stem for p in (PROFILE_DIR / "deployments").glob("*.yaml")}
    if out in shipped:
        raise BasinInputError(f"--out {out}: a shipped profile has that name and would be found first; pick another")
    return out, user_profile_dir() / f"{out}.yaml"
