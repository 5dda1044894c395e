"""``basin replay``: replay agent sessions against a real endpoint, from a
workload at a steady rate or from a scenario, judged like a simulated run."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from basin.cli import eventloop

if TYPE_CHECKING:
    from basin.experiments.scenario import Scenario
    from basin.gateway.replay import ReplayLog, ReplaySettings, Termination
    from basin.workload.arrivals import SessionArrival

_err = Console(stderr=True)


def replay(
    workload: Optional[str] = typer.Argument(None, help="Workload preset or file (see `basin workload list`); "
                                             "omit with --scenario."),
    target: str = typer.Option(..., "--target", help="OpenAI-compatible base URL: the gateway or an engine."),
    scenario: Optional[str] = typer.Option(None, "--scenario", help="Take the deployment, workload, arrivals "
                                           "(base rate, surge, rate changes), terminations and duration from "
                                           "a scenario, and write the simulator's tables and summary."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a scenario field, e.g. "
                                             "--set duration_min=40 (with --scenario)."),
    speed: float = typer.Option(1.0, "--speed", help="Scenario seconds per wall second; give the emulator's "
                                "--speed (with --scenario)."),
    system: str = typer.Option("replay", "--system", help="Name of the run in its tables and summary, e.g. "
                               "the gateway's policy."),
    rate: float = typer.Option(2.0, "--rate", help="Session arrivals per minute (Poisson, wall clock)."),
    duration_s: float = typer.Option(600.0, "--duration-s", help="Seconds over which sessions arrive."),
    sessions: Optional[int] = typer.Option(None, "--sessions", help="Stop after this many arrivals."),
    token_scale: float = typer.Option(1.0, "--token-scale", help="Multiply prompt and output tokens (e.g. 0.02 "
                                      "for a small local engine)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Multiply tool gaps."),
    model: str = typer.Option("default", "--model", help="Model name sent in each call."),
    chars_per_token: Optional[float] = typer.Option(None, "--chars-per-token", help="Characters of filler text "
                                                    "per token the target counts (default: measured with two "
                                                    "probe calls before the run)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the arrivals, the session draw and the text "
                                       "(default 0, or the scenario's)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for the tables and summary (default "
                                       "results/replay, or results/replay/SCENARIO/SYSTEM)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
) -> None:
    """Replay agent sessions (closed loop, with tool gaps) against an endpoint and record every call.

    Examples:

        basin replay terminal-bench --target http://127.0.0.1:8400 --rate 6 --sessions 20 --token-scale 0.02

        basin replay --scenario surge-1p3d --speed 30 --target http://127.0.0.1:8400 --system hicache
    """
    from basin.cli.outputs import check_out_dir
    from basin.errors import BasinInputError

    check_out_dir(out)
    if chars_per_token is not None and not (math.isfinite(chars_per_token) and chars_per_token > 0):
        raise BasinInputError(f"--chars-per-token: expected a number > 0, got {chars_per_token:g} (or leave it "
                              "out to measure it on the target)")
    if scenario is not None:
        if workload is not None:
            raise BasinInputError(f"give a workload or --scenario, not both (the scenario names its workload; "
                                  f"change it with --set workload.name={workload})")
        for flag, value, default in (("--rate", rate, 2.0), ("--duration-s", duration_s, 600.0),
                                     ("--sessions", sessions, None), ("--token-scale", token_scale, 1.0),
                                     ("--time-scale", time_scale, 1.0)):
            if value != default:
                raise BasinInputError(f"{flag}: a scenario sets its own arrivals and sizes; change them with "
                                      "--set (e.g. --set arrivals.base_per_min=6 or --set duration_min=30)")
        _scenario_replay(scenario, list(set_ or []), target, speed, system, model, seed, out, as_json,
                         chars_per_token)
        return
    if workload is None:
        raise BasinInputError("give a workload (e.g. terminal-bench) or --scenario NAME")
    if set_:
        raise BasinInputError("--set changes a scenario's fields: give --scenario NAME with it")
    if speed != 1.0:
        raise BasinInputError("--speed compresses a scenario's time: give --scenario NAME with it "
                              "(with a workload, use --time-scale for tool gaps)")
    _workload_replay(workload, target, rate, duration_s, sessions, token_scale, time_scale, model,
                     0 if seed is None else seed, out or Path("results/replay"), as_json, chars_per_token)


def _workload_replay(workload: str, target: str, rate: float, duration_s: float, sessions: int | None,
                     token_scale: float, time_scale: float, model: str, seed: int, out: Path,
                     as_json: bool, chars_per_token: float | None = None) -> None:
    from basin.errors import BasinInputError
    from basin.gateway.replay import ReplayLog, ReplaySettings, check_target, schedule_sessions, write_calls
    from basin.jsonvalues import json_values

    if sessions is not None and sessions <= 0:
        raise BasinInputError(f"--sessions: expected a whole number > 0, got {sessions}")
    cfg = ReplaySettings(target=target, model=model, rate_per_min=rate, duration_s=duration_s, seed=seed,
                         token_scale=token_scale, time_scale=time_scale)
    arrivals = schedule_sessions(workload, cfg, sessions)
    if not arrivals:
        raise BasinInputError(f"no session arrives in {duration_s:g} s at {rate:g}/min; raise --rate or --duration-s")
    eventloop.run(check_target(target))
    cfg, _ = _text_density(cfg, chars_per_token)
    log = ReplayLog()
    try:
        _, summary = _run(arrivals, cfg, log, None, (), as_json)
    except KeyboardInterrupt:
        log.interrupted = True
        write_calls(log.calls, out / "calls.parquet")
        _err.print(f"interrupted: {len(log.calls)} calls kept in {out / 'calls.parquet'}")
        sys.exit(130)
    calls_path = write_calls(log.calls, out / "calls.parquet")
    plain = json_values(asdict(summary))
    errors = dict(log.errors)
    (out / "summary.json").write_text(json.dumps({**plain, "workload": workload, "target": target,
                                                  "chars_per_token": cfg.chars_per_token, "errors": errors},
                                                 indent=2))
    if as_json:
        print(json.dumps({**plain, "errors": errors}))
        return
    table = Table(title=f"replay of {workload} against {target}")
    for name in ("sessions", "completed", "shed", "failed", "calls", "TTFT p50", "TTFT p90", "hit rate",
                 "completed/h"):
        table.add_column(name, justify="right")
    table.add_row(str(summary.sessions), str(summary.completed), str(summary.shed), str(summary.failed),
                  str(summary.calls), _f(summary.ttft_p50_s, 3, "s"), _f(summary.ttft_p90_s, 3, "s"),
                  _f(summary.hit_rate, 2), _f(summary.completed_per_h, 1))
    Console().print(table)
    _print_errors(log)
    Console().print(f"calls in {calls_path}")


def _run(arrivals: list[SessionArrival], cfg: ReplaySettings, log: ReplayLog, reference: Any,
         terminations: tuple[Termination, ...], quiet: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from basin.gateway.replay import replay as run_replay

    with Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_err, disable=quiet) as bar:
        job = bar.add_task("sessions", total=len(arrivals))
        return eventloop.run(run_replay(arrivals, cfg, lambda n: bar.update(job, completed=n), log=log,
                                      reference=reference, terminations=terminations))


def scenario_plan(sc: Scenario) -> tuple[list[SessionArrival], tuple[Termination, ...]]:
    """A scenario's arrivals and terminations, drawn as ``basin run`` draws them
    (same streams, same seed), so the replay sends the simulated run's sessions.
    A policy switch is the gateway's business and is refused here."""
    from basin.errors import BasinInputError
    from basin.experiments.plan import base_rate_per_min, deployment_for, schedule_for
    from basin.experiments.runner import build_workload
    from basin.gateway.replay import Termination
    from basin.workload.arrivals import draw_arrivals

    for i, iv in enumerate(sc.interventions):
        if iv.switch_policy is not None:
            raise BasinInputError(
                f"scenario '{sc.name}': field 'interventions[{i}].switch_policy': a client cannot switch the "
                "policy, the gateway runs it; drop the intervention (e.g. --set interventions=[]) and change "
                "the gateway's parameters through its admin API (POST /admin/params) instead")
    dep = deployment_for(sc)
    workload = build_workload(sc.workload, sc.seed)
    burst = sc.arrivals.burst_workload
    arrivals = draw_arrivals(workload, schedule_for(sc, base_rate_per_min(sc, dep)), sc.duration_min * 60.0,
                             seed=sc.seed, warm_sessions=sc.arrivals.warm_sessions,
                             burst_workload=build_workload(burst, sc.seed + 1) if burst is not None else None)
    stops = tuple(Termination(iv.at_min * 60.0, iv.terminate_tag) for iv in sc.interventions
                  if iv.terminate_tag is not None)
    return arrivals, stops


def _text_density(cfg: ReplaySettings, given: float | None) -> tuple[ReplaySettings, str]:
    """The settings with the filler text's characters per token: given, or measured on the target."""
    from dataclasses import replace

    from basin.gateway.replay import measure_chars_per_token

    if given is not None:
        return replace(cfg, chars_per_token=given), f"chars_per_token {given:g} (--chars-per-token)"
    measured = eventloop.run(measure_chars_per_token(cfg))
    _err.print(f"the target counts {measured:.2f} characters of filler text a token (two probe calls)",
               highlight=False)
    return replace(cfg, chars_per_token=measured), f"chars_per_token {measured:.3f} (measured: two probe calls)"


def _scenario_replay(name: str, overrides: list[str], target: str, speed: float, system: str, model: str,
                     seed: int | None, out: Path | None, as_json: bool, chars_per_token: float | None = None) -> None:
    from basin.catalog import cache_capacity, load_hardware
    from basin.errors import BasinInputError
    from basin.experiments.plan import deployment_for
    from basin.experiments.scenario import load_scenario
    from basin.gateway.replay import ReplayLog, ReplaySettings, check_target
    from basin.workload.reference import unloaded_reference_s

    if not (math.isfinite(speed) and speed > 0):
        raise BasinInputError(f"--speed: expected a number > 0, got {speed:g}")
    if seed is not None:
        overrides = [*overrides, f"seed={seed}"]
    sc = load_scenario(name, overrides)
    dep = deployment_for(sc)
    hardware = load_hardware(dep.hardware)
    arrivals, stops = scenario_plan(sc)
    duration_s = sc.duration_min * 60.0
    cfg = ReplaySettings(target=target, model=model, seed=sc.seed, speed=speed, stop_after_s=duration_s,
                         duration_s=duration_s, itl_slo_s=hardware.itl_slo_s)
    eventloop.run(check_target(target))
    cfg, density = _text_density(cfg, chars_per_token)
    out_dir = (out or Path("results/replay") / sc.name) / system
    capacity = float(cache_capacity(dep, hardware).gpu_tokens)
    _err.print(f"replaying {len(arrivals)} sessions of {sc.name} against {target} at {speed:g}x: "
               f"{duration_s / speed / 60:.1f} min of wall time", highlight=False)
    log = ReplayLog()
    try:
        _run(arrivals, cfg, log, lambda calls: unloaded_reference_s(calls, hardware), stops, as_json)
    except KeyboardInterrupt:
        log.interrupted = True
    finally:
        summary = _write_scenario_run(out_dir, log, sc, system, target, speed, capacity, hardware.itl_slo_s,
                                      density)
    _report(summary, log, out_dir, as_json)
    if log.interrupted:
        sys.exit(130)


def _write_scenario_run(out_dir: Path, log: ReplayLog, sc: Scenario, system: str, target: str, speed: float,
                        capacity: float, itl_slo_s: float, text_density: str = "") -> Any:
    """Write what was measured, however the run ended: the three tables, the
    summary over the time it lasted, and replay.json (target, speed, errors)."""
    from basin.experiments.plan import command_line
    from basin.experiments.scenario import scenario_dict
    from basin.gateway.replay import run_tables
    from basin.metrics.io import write_run
    from basin.metrics.summary import summarize_run

    full = sc.duration_min * 60.0
    lasted = min(log.elapsed_s, full)
    calls, sessions, timeseries = run_tables(log, lasted, capacity)
    summary = None
    if lasted >= 60.0:
        trigger = sc.trigger_min
        summary = summarize_run(calls, sessions, timeseries, system=system,
                                trigger_s=trigger * 60.0 if trigger is not None else None, duration_s=lasted,
                                measure_end_s=min(sc.measure_end_min * 60.0, lasted), itl_slo_s=itl_slo_s,
                                degradation_rule=sc.judge.degradation_rule(), label_rule=sc.judge.label_rule())
    write_run(out_dir, calls, sessions, timeseries, summary)
    meta = {"scenario": scenario_dict(sc), "system": system, "target": target, "speed": speed,
            "command": command_line(), "complete": not log.interrupted and lasted >= full - 1e-6,
            "interrupted": log.interrupted, "lasted_s": lasted, "errors": dict(log.errors), "notes": log.notes,
            "text_density": text_density,
            "sessions_arrived": len(log.sessions), "calls": len(log.calls)}
    (out_dir / "replay.json").write_text(json.dumps(meta, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return summary


def _report(summary: Any, log: ReplayLog, out_dir: Path, as_json: bool) -> None:
    if log.interrupted:
        _err.print(f"[yellow]interrupted[/] after {log.elapsed_s / 60:.1f} scenario minutes: the tables hold what "
                   f"was measured ({len(log.sessions)} sessions, {len(log.calls)} calls)", highlight=False)
    for note in log.notes:
        _err.print(f"[yellow]warning:[/] {note}", highlight=False)
    if as_json:
        row = summary.to_dict() if summary is not None else {}
        row.pop("windows", None)
        print(json.dumps({**row, "errors": dict(log.errors), "interrupted": log.interrupted}))
        return
    if summary is None:
        _err.print(f"no summary: the run lasted less than a minute; tables in {out_dir}")
        _print_errors(log)
        return
    from basin.cli.run import L_LATE_NOTE

    f = _f

    table = Table(title=f"replay {summary.system}", caption=L_LATE_NOTE, caption_justify="left")
    for col in ("system", "goodput/h", "completed", "shed", "state", "why", "hit pre", "hit end", "TTFT end",
                "active end", "L_late"):
        table.add_column(col, justify="left" if col in ("system", "state", "why") else "right")
    s = summary
    table.add_row(s.system, f(s.goodput_per_h, 1), _pct(s.completed_fraction), _pct(s.shed_fraction),
                  s.state.value, s.state_reason, f(s.hit_rate_pre, 2), f(s.hit_rate_final, 2),
                  f(s.ttft_p50_final_s, 2, "s"), f(s.active_sessions_final, 0), f(s.l_late_s, 1, "s"))
    Console(width=max(Console().width, 140)).print(table)
    _print_errors(log)
    _err.print(f"tables, summary.json and replay.json in {out_dir}")


def _print_errors(log: ReplayLog) -> None:
    if log.errors:
        parts = ", ".join(f"{kind} x{n}" for kind, n in log.errors.most_common())
        _err.print(f"[red]failed calls:[/] {parts}", highlight=False)


def _f(x: float, digits: int, unit: str = "") -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.{digits}f}{unit}"


def _pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f}%"
