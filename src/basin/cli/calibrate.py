"""``basin calibrate``: a running engine measured over HTTP, written as a profile (docs/calibrate.md)."""

from __future__ import annotations

from typing import Optional

import typer


def calibrate(
    engine: str = typer.Option(..., "--engine", help="Base URL of the running OpenAI-compatible engine "
                               "(e.g. http://127.0.0.1:8000)."),
    engine_kind: str = typer.Option("generic", "--engine-kind", help="vllm, sglang, llamacpp or generic: which "
                                    "server's own figures and metrics to read beside the measurements."),
    out: str = typer.Option(..., "--out", help="PROFILE.yaml to write, or a bare NAME written to the user "
                            "profile folder (then found by that name)."),
    budget_s: float = typer.Option(600.0, "--budget-s", help="Wall-clock seconds the measurements may take."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name sent in each call (default: the "
                                        "first of the engine's /v1/models)."),
    max_prompt_tokens: int = typer.Option(32768, "--max-prompt-tokens", help="Longest prompt sent (kept below "
                                          "the engine's context length)."),
    itl_slo_s: float = typer.Option(0.05, "--itl-slo-s", help="Inter-token latency target written to the "
                                    "profile (a service target, not measured)."),
    seed: int = typer.Option(0, "--seed", help="Seeds the random prompt text."),
    topology: str = typer.Option("colocated", "--topology", help="How the profile places the engine: colocated "
                                 "(one server whose prefill and decode share each step and one KV pool: a single "
                                 "vLLM, llama.cpp or SGLang server) or pd (one prefill and one decode instance, for "
                                 "one side of a PD pair)."),
    chunk_tokens: Optional[int] = typer.Option(None, "--chunk-tokens", help="The engine's declared per-step token "
                                               "budget (prefill chunk), e.g. vLLM's --max-num-batched-tokens (2048 "
                                               "on its CPU API server), which vLLM declares over HTTP only with "
                                               "VLLM_SERVER_DEV_MODE=1. A statement, not a measurement (default: "
                                               "the declared one, else the longest prompt measured)."),
    max_running_requests: Optional[int] = typer.Option(None, "--max-running-requests", help="The engine's "
                                                       "declared limit of running requests, e.g. vLLM's "
                                                       "--max-num-seqs (128 on its CPU API server), where the "
                                                       "engine does not declare it over HTTP (default: the declared "
                                                       "one, else the largest batch measured, or 256)."),
) -> None:
    """Measure a running engine's prefill, decode and cache capacities, and write a profile.

    Example:

        basin calibrate --engine http://127.0.0.1:8000 --engine-kind vllm --out my-vllm --budget-s 600

    then: basin emulate --deployment my-vllm, basin profile my-vllm, basin vulnerable my-vllm

    The profile's deployment is one colocated server (--topology colocated,
    the default); --topology pd writes one prefill and one decode instance.
    """
    import asyncio
    import math

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from basin.calibrate import CalibrationSettings, build_profile, output_path, write_profile
    from basin.calibrate import calibrate as run_calibration
    from basin.calibrate.engines import KINDS
    from basin.errors import BasinInputError

    if engine_kind not in KINDS:
        raise BasinInputError(f"--engine-kind {engine_kind!r}: use one of {', '.join(KINDS)}")
    if not engine.startswith(("http://", "https://")):
        raise BasinInputError(f"--engine {engine!r}: give the engine's URL, e.g. http://127.0.0.1:8000")
    if not math.isfinite(budget_s) or budget_s < 10:
        raise BasinInputError(f"--budget-s {budget_s:g}: give at least 10 seconds")
    if max_prompt_tokens < 256:
        raise BasinInputError(f"--max-prompt-tokens {max_prompt_tokens}: give at least 256")
    if not math.isfinite(itl_slo_s) or itl_slo_s <= 0:
        raise BasinInputError(f"--itl-slo-s {itl_slo_s:g}: give a positive number of seconds")
    if topology not in ("colocated", "pd"):
        raise BasinInputError(f"--topology {topology!r}: use colocated (a single engine) or pd (one side of a PD pair)")
    if max_running_requests is not None and max_running_requests < 1:
        raise BasinInputError(f"--max-running-requests {max_running_requests}: give the engine's limit (at least 1; "
                              "vLLM's --max-num-seqs)")
    if chunk_tokens is not None and chunk_tokens < 16:
        raise BasinInputError(f"--chunk-tokens {chunk_tokens}: give the engine's per-step token budget (at least 16; "
                              "vLLM's --max-num-batched-tokens)")
    name, path = output_path(out)
    settings = CalibrationSettings(url=engine, kind=engine_kind, model=model, budget_s=budget_s, seed=seed,
                                   max_prompt_tokens=max_prompt_tokens, topology=topology, chunk_tokens=chunk_tokens,
                                   max_running_requests=max_running_requests)
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.fields[phase]:<8}"), BarColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(phase: str, fraction: float, note: str) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(note, total=1.0, phase=phase)
                for other, task in tasks.items():
                    if other != phase:
                        bar.update(task, completed=1.0)
            bar.update(tasks[phase], completed=min(1.0, fraction), description=note)

        measured = asyncio.run(run_calibration(settings, progress))
        for task in tasks.values():
            bar.update(task, completed=1.0)
    profile = build_profile(name, measured, itl_slo_s)
    write_profile(profile, path)
    hw = profile.hardware
    typer.echo(f"wrote {path} in {measured.elapsed_s:.0f} s ({measured.clock} clock), "
               f"deployment {'one colocated server (1C)' if topology == 'colocated' else '1P1D'}")
    pre = hw.prefill
    fixed = f"fixed {hw.transfer_s * 1e3:.1f} ms a call" if topology == "pd" else \
        f"fixed {pre.step_overhead_s * 1e3:.1f} ms a {measured.fixed_per()}"
    typer.echo(f"  prefill  {pre.linear_tokens_per_s:,.0f} tokens/s, + {pre.attention_s_per_token_position:.3g}"
               f" s per token-position, {fixed}; chunk {pre.chunk_tokens:,} tokens "
               f"({profile.calibration['figures_from']['chunk_tokens']})")
    typer.echo(f"  decode   step {hw.decode.step_base_s * 1e3:.2f} ms + {hw.decode.step_per_request_s * 1e3:.3f} ms a "
               f"request + {hw.decode.step_per_context_token_s:.3g} s a context token")
    typer.echo(f"  capacity prefix cache {hw.prefill.prefix_cache_tokens:,} tokens, KV {hw.decode.kv_tokens:,} tokens, "
               f"{hw.decode.max_running_requests} running requests")
    shown = str(path) if out.endswith((".yaml", ".yml")) else name  # a bare name is found in the user folder
    typer.echo(f"use it as: basin emulate --deployment {shown}  |  basin profile {shown}  |  a scenario's "
               f"deployment: {shown}")
