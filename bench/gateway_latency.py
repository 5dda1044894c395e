"""Latency the gateway adds, beside calling the engine directly and beside LiteLLM.

Open-loop Poisson arrivals (fixed seed) at increasing call rates, each call a
streamed chat completion (16 chunks, no delay) from the fake upstream
(``tests.support.fake_upstream``), sent three ways in the same run:

  direct   straight to the fake upstream
  gateway  through ``basin gateway --engine openai --policy hicache``
  litellm  through the LiteLLM proxy (``num_retries: 0``), when installed

Every server runs in its own process and every path's load generator in its
own worker process, one measurement at a time (the machine has 2 cores, so
concurrent paths would measure each other), each started once the servers are
idle again and, for up to --calm-timeout seconds, once other tenants of the
machine are quiet; the cores they used anyway are recorded with each run, as
is each server's CPU time per call. Per call the generator records the time to
the first body byte and to the last byte, from the moment the call is sent;
each (rate, path) is measured ``--repeats`` times and the medians are
reported. Added latency = path percentile minus direct percentile at the same
rate. A path that saturates at one rate (errors or a median above
1 s) is not offered the higher ones. Target: the gateway adds under 1 ms at
p50 and under 5 ms at p99 at 500 calls/s.

    .venv/bin/python -m bench.gateway_latency [--rates 10,100,250,500] [--duration 10] [--repeats 3]

Writes results/bench/gateway_latency.json and results/bench/gateway_latency.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

OUT_DIR = Path("results/bench")
#: Where ``python -m tests.support.fake_upstream`` (the fake engine) resolves.
REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_RATE = 500.0
TARGET_ADDED_P50_MS = 1.0
TARGET_ADDED_P99_MS = 5.0
#: ``gateway`` runs with its state store (``--store``), ``gateway_nostore`` without one: the pair
#: measured in the same run gives the store's cost through HTTP.
PATHS = ("direct", "gateway", "gateway_nostore", "litellm")
MODEL = "fake-model"
# Calls are spread over this many concurrent agent sessions; each session
# makes SESSION_CALLS calls (the last one carries the end marker) and is then
# replaced by a new one, so the gateway sees arrivals, ends and a bounded table.
SESSIONS = 64
SESSION_CALLS = 8
# A path is saturated at a rate when more calls than this fail, or its median
# takes longer than this: higher rates would only measure its backlog.
SATURATED_ERROR_FRAC = 0.01
SATURATED_P50_MS = 1000.0


# ------------------------------------------------------------------ load side


@dataclass(frozen=True)
class LoadSpec:
    """One measurement: what the worker process sends, and where."""

    path: str
    url: str
    headers: dict[str, str]
    rate: float
    duration_s: float
    seed: int
    prompt_chars: int
    tokens: int
    call_timeout_s: float
    warmup_calls: int


@dataclass
class LoadResult:
    """Raw per-call timings of one measurement (seconds)."""

    ttfb: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    offered: int = 0
    wall_s: float = 0.0


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Arrival offsets (s) of an open-loop Poisson process: the same for every path."""
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def session_headers(i: int) -> dict[str, str]:
    """Session identity of call i (see SESSIONS); warm-up calls (i < 0) share one."""
    if i < 0:
        return {"X-Session-Id": "bench-warmup"}
    slot, turn = i % SESSIONS, (i // SESSIONS) % SESSION_CALLS
    generation = i // (SESSIONS * SESSION_CALLS)
    headers = {"X-Session-Id": f"bench-{generation}-{slot}"}
    if turn == SESSION_CALLS - 1:
        headers["X-Session-End"] = "true"
    return headers


def request_body(spec: LoadSpec) -> bytes:
    """A streamed chat call with a system prompt of about prompt_chars characters."""
    system = ("You are a careful coding agent. " * (spec.prompt_chars // 32 + 1))[: spec.prompt_chars]
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Run the next step."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": spec.tokens,
    }
    return json.dumps(body).encode()


def _worker_init() -> None:
    """Give the load generator an edge over the servers it measures (2 cores,
    three busy processes) and enough file descriptors for a saturated path."""
    try:
        os.nice(-5)
    except OSError:
        pass  # not root: run at normal priority
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C


def run_load(spec: LoadSpec) -> LoadResult:
    """Entry point in the worker process."""
    return asyncio.run(_load(spec))


async def _load(spec: LoadSpec) -> LoadResult:
    import aiohttp

    body = request_body(spec)
    url = spec.url + "/v1/chat/completions"
    res = LoadResult()
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=4000, force_close=False)
    timeout = aiohttp.ClientTimeout(total=spec.call_timeout_s)
    base_headers = {"Content-Type": "application/json", **spec.headers}

    async def call(i: int, record: bool) -> None:
        headers = {**base_headers, **session_headers(i)}
        start = time.perf_counter()
        first = 0.0
        tail = b""
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    await resp.read()
                    _count(res, f"HTTP {resp.status}", record)
                    return
                async for chunk in resp.content.iter_any():
                    if not first:
                        first = time.perf_counter()
                    tail = (tail + chunk)[-32:]
            end = time.perf_counter()
        except TimeoutError:
            _count(res, "timeout", record)
            return
        except aiohttp.ClientError as exc:
            _count(res, type(exc).__name__, record)
            return
        if not tail.endswith(b"data: [DONE]\n\n"):
            _count(res, "incomplete stream", record)
            return
        if record:
            res.ttfb.append(first - start)
            res.total.append(end - start)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for i in range(spec.warmup_calls):  # open connections, let lazy servers initialise
            await call(-1 - i, record=False)
        arrivals = poisson_arrivals(spec.rate, spec.duration_s, spec.seed)
        res.offered = len(arrivals)
        tasks: list[asyncio.Task[None]] = []
        t0 = loop.time() + 0.05
        wall0 = time.perf_counter()
        for i, at in enumerate(arrivals):
            delay = t0 + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            res.lag.append(max(0.0, loop.time() - (t0 + at)))
            tasks.append(asyncio.create_task(call(i, record=True)))
        await asyncio.gather(*tasks)
        res.wall_s = time.perf_counter() - wall0
    return res


def _count(res: LoadResult, kind: str, record: bool) -> None:
    if record:
        res.errors[kind] = res.errors.get(kind, 0) + 1


# ---------------------------------------------------------------- server side


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    """Poll a health URL until it answers 200; fail with the server's log tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"server behind {url} did not become ready (exit code {proc.poll()}):\n{tail}")


@contextmanager
def server(name: str, cmd: list[str], health_url: str, logdir: Path, timeout_s: float,
           env: dict[str, str] | None = None, cwd: Path | None = None) -> Iterator[int]:
    """A server subprocess (in its own process group, whose id it yields) for
    the duration of the block, ended through that group."""
    log = logdir / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    try:
        wait_ready(health_url, proc, timeout_s, log)
        yield proc.pid
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def group_cpu_ticks(pgids: set[int]) -> dict[int, int]:
    """CPU time (clock ticks) used so far by the processes of each process group."""
    ticks = dict.fromkeys(pgids, 0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        pgrp = int(fields[2])  # field 5 of stat
        if pgrp in ticks:
            ticks[pgrp] += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def busy_ticks() -> int:
    """CPU time (clock ticks) the whole machine has spent busy so far."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # minus idle and iowait


@dataclass
class CpuWindow:
    """CPU used per process group, and by everything else, over a time window."""

    pgids: set[int]
    start_ticks: dict[int, int] = field(default_factory=dict)
    start_busy: int = 0
    start_s: float = 0.0

    def __post_init__(self) -> None:
        self.start_ticks, self.start_busy, self.start_s = group_cpu_ticks(self.pgids), busy_ticks(), time.monotonic()

    def cores(self) -> tuple[dict[int, float], float]:
        """(cores used by each group, cores used by processes outside them) since the start."""
        hz = os.sysconf("SC_CLK_TCK")
        elapsed = max(1e-6, time.monotonic() - self.start_s)
        ticks = group_cpu_ticks(self.pgids)
        mine = {g: (ticks[g] - self.start_ticks[g]) / hz / elapsed for g in self.pgids}
        others = (busy_ticks() - self.start_busy) / hz / elapsed - sum(mine.values())
        return mine, max(0.0, others)


def wait_quiet(servers: set[int], everyone: set[int], calm_timeout_s: float, window_s: float = 0.5) -> None:
    """Start a measurement on a quiet machine: wait until the servers are idle
    (a saturated proxy keeps working on abandoned calls; up to 2 minutes), then
    up to calm_timeout_s for other tenants of this shared machine to use under
    a quarter of a core (the run records what they used anyway)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120.0:
        win = CpuWindow(servers)
        time.sleep(window_s)
        if sum(win.cores()[0].values()) < 0.05:
            break
    t0 = time.monotonic()
    while time.monotonic() - t0 < calm_timeout_s:
        win = CpuWindow(everyone)
        time.sleep(window_s)
        if win.cores()[1] < 0.25:
            break


def venv_tool(name: str) -> str | None:
    """A console script next to this interpreter, else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def gateway_command(upstream: str, port: int, store: str | None = None, logdir: Path | None = None
                    ) -> list[str] | None:
    """The gateway's command line, or None when ``basin gateway`` is not there yet. ``store``: the
    gateway keeps its state there (``state_store``: a SQLite file or a Redis URL)."""
    basin = venv_tool("basin")
    if basin is None:
        return None
    probe = subprocess.run([basin, "gateway", "--help"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        return None
    command = [basin, "gateway", "--upstream", upstream, "--engine", "openai", "--policy", "hicache",
               "--listen", f"127.0.0.1:{port}"]
    if store is not None and logdir is not None:
        logdir.mkdir(parents=True, exist_ok=True)
        config = logdir / "gateway.yaml"
        config.write_text(json.dumps({"state_store": store}))  # JSON is YAML
        command += ["--config", str(config)]
    return command


def litellm_config(upstream: str, master_key: str, path: Path) -> None:
    """Map the bench model to the fake upstream; no retries (they re-prefill)."""
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: not-used\n"
        "litellm_settings:\n"
        "  num_retries: 0\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
    )


# ------------------------------------------------------------------ analysis


def percentiles_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    arr = np.asarray(values) * 1000.0
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99))}


def summarize_run(spec: LoadSpec, res: LoadResult, repeat: int) -> dict[str, Any]:
    n_err = sum(res.errors.values())
    return {
        "rate": spec.rate,
        "path": spec.path,
        "repeat": repeat,
        "offered": res.offered,
        "ok": len(res.total),
        "errors": dict(res.errors),
        "error_frac": n_err / res.offered if res.offered else 0.0,
        "achieved_rate": len(res.total) / res.wall_s if res.wall_s else 0.0,
        "wall_s": res.wall_s,
        "ttfb_ms": percentiles_ms(res.ttfb),
        "total_ms": percentiles_ms(res.total),
        "generator_lag_ms": percentiles_ms(res.lag),
    }


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: list[dict[str, Any]], rates: list[float], paths: list[str]) -> list[dict[str, Any]]:
    """Medians over repeats per (rate, path), then added latency vs direct."""
    rows: list[dict[str, Any]] = []
    for rate in rates:
        direct: dict[str, Any] | None = None
        for path in paths:
            rs = [r for r in runs if r["rate"] == rate and r["path"] == path]
            if not rs:
                continue
            row: dict[str, Any] = {
                "rate": rate,
                "path": path,
                "repeats": len(rs),
                "ok": _median([r["ok"] for r in rs]),
                "error_frac": _median([r["error_frac"] for r in rs]),
                "generator_lag_p99_ms": _median([r["generator_lag_ms"]["p99"] for r in rs]),
                "others_cores": _median([r.get("others_cores") for r in rs]),
                "server_cpu_ms_per_call": _median([r.get("server_cpu_ms_per_call") for r in rs]),
                "skipped": False,
            }
            for metric in ("ttfb_ms", "total_ms"):
                for q in ("p50", "p99"):
                    row[f"{metric[:-3]}_{q}_ms"] = _median([r[metric][q] for r in rs])
            if path == "direct":
                direct = row
            for q in ("p50", "p99"):
                for metric in ("total", "ttfb"):
                    mine, base = row[f"{metric}_{q}_ms"], direct[f"{metric}_{q}_ms"] if direct else None
                    ok = mine is not None and base is not None
                    row[f"added_{metric}_{q}_ms"] = mine - base if ok else None
                    row[f"ratio_{metric}_{q}"] = mine / base if ok and base else None
            row["saturated"] = saturated(row)
            rows.append(row)
    return rows


def skipped_row(rate: float, path: str) -> dict[str, Any]:
    """A row for a path not offered this rate because it saturated below it."""
    row: dict[str, Any] = {"rate": rate, "path": path, "repeats": 0, "ok": None, "error_frac": None,
                           "generator_lag_p99_ms": None, "others_cores": None, "server_cpu_ms_per_call": None,
                           "skipped": True, "saturated": True}
    for metric in ("ttfb", "total"):
        for q in ("p50", "p99"):
            row[f"{metric}_{q}_ms"] = row[f"added_{metric}_{q}_ms"] = row[f"ratio_{metric}_{q}"] = None
    return row


def saturated(row: dict[str, Any]) -> bool:
    p50 = row["total_p50_ms"]
    return row["error_frac"] > SATURATED_ERROR_FRAC or p50 is None or p50 > SATURATED_P50_MS


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the gateway met its target at 500 calls/s (time to last byte)."""
    at = [r for r in rows if r["path"] == "gateway" and r["rate"] == TARGET_RATE]
    out: dict[str, Any] = {
        "rate": TARGET_RATE,
        "added_p50_ms_max": TARGET_ADDED_P50_MS,
        "added_p99_ms_max": TARGET_ADDED_P99_MS,
        "measured": bool(at),
        "met": None,
    }
    if at and at[0]["skipped"]:
        out.update(met=False, saturated_below=True)
    elif at:
        row = at[0]
        p50, p99 = row["added_total_p50_ms"], row["added_total_p99_ms"]
        out.update(added_p50_ms=p50, added_p99_ms=p99, error_frac=row["error_frac"])
        out["met"] = (p50 is not None and p99 is not None and p50 < TARGET_ADDED_P50_MS
                      and p99 < TARGET_ADDED_P99_MS and row["error_frac"] == 0)
    return out


# ------------------------------------------------------------------- output


def _fmt(x: float | None, digits: int = 2) -> str:
    """Fixed decimals for small numbers, fewer for large ones (columns stay narrow)."""
    if x is None:
        return "-"
    if abs(x) >= 1000:
        digits = 0
    elif abs(x) >= 100:
        digits = min(digits, 1)
    return f"{x:.{digits}f}"


def print_table(rows: list[dict[str, Any]], meta: dict[str, Any], target: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Latency added by the gateway (ms; medians of {meta['repeats']} runs of "
                        f"{meta['duration_s']:g} s; {meta['tokens']} streamed chunks, "
                        f"{meta['prompt_chars']}-char prompt)")
    for col in ("rate/s", "path", "ok", "err %", "TTFB p50", "TTFB p99", "total p50", "total p99",
                "added p50", "added p99", "x p50", "x p99", "CPU ms/call", "send lag p99", "others' cores"):
        table.add_column(col, justify="left" if col == "path" else "right", no_wrap=col == "path")
    last_rate = None
    for r in rows:
        if last_rate is not None and r["rate"] != last_rate:
            table.add_section()
        last_rate = r["rate"]
        if r["skipped"]:
            table.add_row(f"{r['rate']:g}", r["path"], *["-"] * 10, "", "", "", style="dim")
            continue
        direct = r["path"] == "direct"
        table.add_row(
            f"{r['rate']:g}", r["path"] + (" (saturated)" if r["saturated"] else ""), f"{r['ok']:.0f}",
            _fmt(100 * r["error_frac"], 1),
            _fmt(r["ttfb_p50_ms"]), _fmt(r["ttfb_p99_ms"]), _fmt(r["total_p50_ms"]), _fmt(r["total_p99_ms"]),
            "" if direct else _fmt(r["added_total_p50_ms"]), "" if direct else _fmt(r["added_total_p99_ms"]),
            "" if direct else _fmt(r["ratio_total_p50"]), "" if direct else _fmt(r["ratio_total_p99"]),
            _fmt(r["server_cpu_ms_per_call"]), _fmt(r["generator_lag_p99_ms"]), _fmt(r["others_cores"]),
        )
    console = Console(width=max(150, Console().width))
    console.print(table)
    for note in meta["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    head = (f"target: gateway adds < {TARGET_ADDED_P50_MS:g} ms p50 and < {TARGET_ADDED_P99_MS:g} ms p99 "
            f"(time to last byte) at {TARGET_RATE:g} calls/s")
    if target.get("saturated_below"):
        console.print(f"{head}: [red]NOT MET[/] (the gateway saturated below {TARGET_RATE:g} calls/s)")
    elif not target["measured"]:
        console.print(f"{head}: [yellow]not measured[/] (no gateway run at {TARGET_RATE:g} calls/s)")
    else:
        status = "[green]MET[/]" if target["met"] else "[red]NOT MET[/]"
        console.print(f"{head}: {status} (added p50 {_fmt(target['added_p50_ms'])} ms, "
                      f"p99 {_fmt(target['added_p99_ms'])} ms, errors {100 * target['error_frac']:.1f} %)")


def plot(rows: list[dict[str, Any]], out_png: Path) -> Path:
    """Left: each path's latency; right: what each proxy adds, against the target."""
    from basin.plotting import new_figure, save_figure

    fig = new_figure(10.0, 4.0)
    ax_abs, ax_add = fig.subplots(1, 2)
    colors = {"direct": "tab:gray", "gateway": "tab:blue", "gateway_nostore": "tab:cyan", "litellm": "tab:orange"}
    added: list[float] = []
    for path in PATHS:
        rs = [r for r in rows if r["path"] == path and r["total_p50_ms"] is not None]
        if not rs:
            continue
        x = [r["rate"] for r in rs]
        ax_abs.plot(x, [r["total_p50_ms"] for r in rs], "o-", color=colors[path], label=f"{path} p50")
        ax_abs.plot(x, [r["total_p99_ms"] for r in rs], "s--", color=colors[path], label=f"{path} p99")
        for r in rs:
            if r["saturated"]:
                ax_abs.annotate("saturated", (r["rate"], r["total_p50_ms"]), fontsize=7,
                                textcoords="offset points", xytext=(4, -10))
        if path != "direct":
            p50 = [r["added_total_p50_ms"] for r in rs]
            p99 = [r["added_total_p99_ms"] for r in rs]
            added += p50 + p99
            ax_add.plot(x, p50, "o-", color=colors[path], label=f"{path} p50")
            ax_add.plot(x, p99, "s--", color=colors[path], label=f"{path} p99")
    rates = sorted({r["rate"] for r in rows})
    for ax in (ax_abs, ax_add):
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        ax.set_xlabel("calls/s (Poisson arrivals)")
    ax_abs.set_yscale("log")
    ax_abs.set_ylabel("time to last byte (ms)")
    ax_abs.set_title("latency per path (medians of repeats)")
    ax_abs.legend(fontsize=7)
    ax_add.axhline(TARGET_ADDED_P50_MS, color="tab:green", lw=0.8, ls=":", label="target p50 (1 ms)")
    ax_add.axhline(TARGET_ADDED_P99_MS, color="tab:red", lw=0.8, ls=":", label="target p99 (5 ms)")
    ax_add.axhline(0.0, color="black", lw=0.5)
    ax_add.set_yscale("symlog", linthresh=1.0)
    ax_add.set_ylim(bottom=min([-0.5] + [1.5 * a for a in added if a is not None]))
    ax_add.set_ylabel("added vs direct (ms)")
    ax_add.set_title("latency the proxy adds")
    ax_add.legend(fontsize=7)
    return save_figure(fig, out_png)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------- main


@dataclass(frozen=True)
class Target:
    """Where one path's calls go, and the process group serving them."""

    url: str
    headers: dict[str, str]
    pgid: int


def _store_spec(store: str, logdir: Path) -> str | None:
    if store == "none":
        return None
    return str(logdir / "gateway-state.db") if store == "sqlite" else store


def start_servers(stack: ExitStack, logdir: Path, wanted: list[str], tokens: int,
                  notes: list[str], store: str = "sqlite") -> dict[str, Target]:
    """The fake upstream, then each wanted proxy in front of it (skipped with
    a note when it is not installed); all stopped when the stack closes."""
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    pgid = stack.enter_context(server(
        "fake_upstream",
        [sys.executable, "-m", "tests.support.fake_upstream", "--port", str(up_port),
         "--tokens", str(tokens), "--engine", "llamacpp"],
        upstream + "/health", logdir, 30.0, cwd=REPO_ROOT))
    targets = {"direct": Target(upstream, {}, pgid)}
    for path, spec in (("gateway", _store_spec(store, logdir)), ("gateway_nostore", None)):
        if path not in wanted:
            continue
        port = free_port()
        cmd = gateway_command(upstream, port, spec, logdir / path)
        if cmd is None:
            notes.append(f"{path} skipped: `basin gateway --help` fails (the gateway CLI is not installed yet)")
        else:
            url = f"http://127.0.0.1:{port}"
            pgid = stack.enter_context(server(path, cmd, url + "/healthz", logdir, 60.0))
            targets[path] = Target(url, {}, pgid)
    if "litellm" in wanted:
        litellm = venv_tool("litellm")
        if litellm is None:
            notes.append("litellm skipped: not installed (pip install 'litellm[proxy]==1.110.2')")
        else:
            port = free_port()
            key = "sk-bench-" + secrets.token_hex(16)  # LiteLLM refuses to start without a master key
            cfg = logdir / "litellm.yaml"
            litellm_config(upstream, key, cfg)
            env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
            url = f"http://127.0.0.1:{port}"
            pgid = stack.enter_context(server(
                "litellm", [litellm, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                            "--num_workers", "1"],
                url + "/health/liveliness", logdir, 180.0, env=env))
            targets["litellm"] = Target(url, {"Authorization": f"Bearer {key}"}, pgid)
    return targets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10,100,250,500", help="comma-separated calls/s")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS), help="subset of " + ",".join(PATHS))
    parser.add_argument("--tokens", type=int, default=16, help="streamed chunks per response")
    parser.add_argument("--prompt-chars", type=int, default=4000, help="size of the prompt sent")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--call-timeout", type=float, default=30.0)
    parser.add_argument("--warmup-calls", type=int, default=50)
    parser.add_argument("--calm-timeout", type=float, default=20.0,
                        help="seconds to wait, before each measurement, for other processes to go quiet")
    parser.add_argument("--store", default="sqlite",
                        help="the gateway's state store: sqlite (a file in the run's temporary folder), "
                             "none, or a redis:// URL")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    wanted = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = set(wanted) - set(PATHS)
    if unknown or "direct" not in wanted:
        parser.error(f"--paths: choose from {', '.join(PATHS)}, 'direct' included (got {args.paths})")

    notes: list[str] = []
    load_at_start = os.getloadavg()[0]
    if load_at_start > 0.5:
        notes.append(f"the machine was busy before the run (load average {load_at_start:.2f}); "
                     "see the others' cores column")
    with tempfile.TemporaryDirectory(prefix="basin-bench-") as tmp, ExitStack() as stack:
        targets = start_servers(stack, Path(tmp), wanted, args.tokens, notes, args.store)
        notes.append(f"gateway state store: {args.store}")
        paths = [p for p in PATHS if p in targets]
        ctx = multiprocessing.get_context("spawn")
        pools = {p: stack.enter_context(ProcessPoolExecutor(1, mp_context=ctx, initializer=_worker_init))
                 for p in paths}
        servers = {t.pgid for t in targets.values()}
        everyone = servers | {os.getpgid(0)}  # servers, this process and its load workers
        runs: list[dict[str, Any]] = []
        skipped: list[tuple[float, str]] = []
        live = list(paths)
        for rate in rates:
            for rep in range(args.repeats):
                # Rotate the order so that no path always runs first after a pause.
                order = live[rep % len(live):] + live[: rep % len(live)]
                for path in order:
                    wait_quiet(servers, everyone, args.calm_timeout)
                    spec = LoadSpec(path=path, url=targets[path].url, headers=targets[path].headers, rate=rate,
                                    duration_s=args.duration, seed=args.seed + rep, prompt_chars=args.prompt_chars,
                                    tokens=args.tokens, call_timeout_s=args.call_timeout,
                                    warmup_calls=args.warmup_calls)
                    win = CpuWindow(everyone)
                    res = pools[path].submit(run_load, spec).result()
                    mine, others = win.cores()
                    run = summarize_run(spec, res, rep)
                    run["others_cores"] = others
                    # CPU the path's proxy (direct: the upstream) spent per call, warm-up included.
                    elapsed = time.monotonic() - win.start_s
                    calls = res.offered + spec.warmup_calls
                    run["server_cpu_ms_per_call"] = 1000.0 * mine[targets[path].pgid] * elapsed / calls
                    runs.append(run)
                    print(f"[{len(runs)}] {rate:g}/s {path:8s} rep {rep}: ok {run['ok']} "
                          f"err {sum(res.errors.values())} total p50 {_fmt(run['total_ms']['p50'])} ms "
                          f"p99 {_fmt(run['total_ms']['p99'])} ms; others used {others:.2f} cores", flush=True)
            for row in summarize(runs, [rate], live):
                if row["path"] != "direct" and row["saturated"]:
                    live.remove(row["path"])
                    notes.append(f"{row['path']} saturated at {rate:g} calls/s: not offered higher rates")
                    skipped.extend((r, row["path"]) for r in rates if r > rate)

    rows = summarize(runs, rates, paths)
    for rate, path in skipped:
        rows.append(skipped_row(rate, path))
    rows.sort(key=lambda r: (r["rate"], PATHS.index(r["path"])))
    target = verdict(rows)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "rates": rates,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "seed": args.seed,
        "tokens": args.tokens,
        "prompt_chars": args.prompt_chars,
        "sessions": SESSIONS,
        "session_calls": SESSION_CALLS,
        "paths": paths,
        "cpus": os.cpu_count(),
        "loadavg_at_start": load_at_start,
        "python": platform.python_version(),
        "aiohttp": _version("aiohttp"),
        "litellm": _version("litellm"),
        "notes": notes,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    out_json = args.out / "gateway_latency.json"
    out_json.write_text(json.dumps({"meta": meta, "target": target, "summary": rows, "runs": runs}, indent=1))
    out_png = plot(rows, args.out / "gateway_latency.png")
    print_table(rows, meta, target)
    print(f"wrote {out_json} and {out_png}")


if __name__ == "__main__":
    main()
