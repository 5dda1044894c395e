"""Assembles and runs the gateway: the policy, the engine adapter and its
metrics poller, the control loop, the proxy routes, its own /metrics and the
admin API, and the orderly stop on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import math
import resource
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from basin.errors import BasinInputError
from basin.gateway.adapters import make_adapter
from basin.gateway.adapters.llamacpp import LlamaCppAdapter
from basin.gateway.config import GatewayConfig
from basin.gateway.connections import ConnectionGuard, GuardedRunner, refuse_over_limit
from basin.gateway.exposition import MonitorCollector
from basin.gateway.gate import Gate, lending_hint, unprovided
from basin.gateway.lending import LendingSwitch
from basin.gateway.monitor import MonitorSettings, build_monitor, find_smallest_surge
from basin.gateway.netio import EveryFewSeconds
from basin.gateway.persist import Journal, read_meta, restore, resumed_clock_s
from basin.gateway.proxy import GATED_PATHS, PASSTHROUGH_PATHS, Proxy, error_response
from basin.gateway.record import RecordFile, TrafficRecorder
from basin.gateway.scrape import EngineMetrics
from basin.gateway.store import StateStore, open_store
from basin.gateway.telemetry import Telemetry
from basin.policy.base import Policy
from basin.policy.registry import policy_class, policy_names
from basin.systems import RunContext, build_options
from basin.systems import build_policy as build_system_policy
from basin.workload.records import Session

log = logging.getLogger("basin.gateway")
#: Monitor observations per window, besides those the control steps hand it.
MONITOR_SAMPLES = 30
#: How late a control step may be before /healthz says unhealthy (an event loop busy
#: with a burst of calls delays a step by milliseconds; a stuck loop, for ever).
LOOP_GRACE_S = 5.0

#: Gateway defaults of policies whose full form needs the engine's help:
#: BASIN runs without decode-memory lending, which only an engine can do
#: (unless the engine takes the switch, ``lending_url``: then its own default).
GATEWAY_DEFAULTS: dict[str, dict[str, object]] = {
    name: {"lending": False} for name in ("basin", "basin-paper", "basin-prior")}


def build_policy(config: GatewayConfig) -> Policy:
    """The configured policy as a gateway can run it. A policy that needs an
    engine mechanism a gateway cannot provide is refused, naming it; one that
    merely prefers such a mechanism runs without it (the start-up log says so).
    With ``lending_url`` the gateway provides lending, so no default turns it off."""
    defaults = {} if config.lending_url is not None else GATEWAY_DEFAULTS.get(config.policy, {})
    params: dict[str, object] = {**defaults, **config.policy_params}
    options = build_options(config.policy)
    if "predictor" in options:
        params["predictor"] = config.predictor
    if "profile" in options and config.profile:
        params["profile"] = config.profile
    policy = build_system_policy(config.policy, params, RunContext())
    missing = unprovided(policy.needs, config)
    if missing:
        raise BasinInputError(
            f"policy '{config.policy}' needs {', '.join(missing)} inside the engine, which a gateway in front of "
            f"an unmodified engine cannot provide{lending_hint(policy.needs, config)}; use one of "
            f"{', '.join(gateway_policies())}")
    return policy


def gateway_policies() -> list[str]:
    """The policies a gateway can run, with its defaults."""
    names = []
    for name in policy_names():
        cls = policy_class(name)
        if not cls(cls.Params.from_mapping(GATEWAY_DEFAULTS.get(name, {}))).needs.required():
            names.append(name)
    return names


class GatewayServer:
    """One gateway: ``await start()`` binds it, ``await stop()`` releases everything."""

    def __init__(self, config: GatewayConfig, policy: Policy | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        #: Every time the gateway hands out (to the policy, its tables, the monitor) is seconds
        #: since the gateway started, not since the machine booted: a policy's arrival window
        #: and priorities then mean the same after a restart.
        self._raw_clock = clock
        self._origin_s = clock()
        self.policy = policy if policy is not None else build_policy(config)
        self.adapter = make_adapter(config.engine, low_priority_first=config.low_priority_first)
        self.client: aiohttp.ClientSession | None = None
        self.poller: EngineMetrics | None = None
        self.gate: Gate | None = None
        self.record_file: RecordFile | None = None
        self.proxy: Proxy | None = None
        self.telemetry: Telemetry | None = None
        self.warnings: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._woken = asyncio.Event()
        self._step_now = False
        self.guard = ConnectionGuard(config.max_connections, config.client_idle_timeout_s)
        self.url = ""
        #: state_store: where sessions and the policy's state outlive the process, and its writer.
        self.store: StateStore | None = None
        self.journal: Journal | None = None
        self.store_errors = 0
        self.restored_sessions = 0
        self._store_task: asyncio.Task[None] | None = None
        self._store_stop = asyncio.Event()
        self._log_store = EveryFewSeconds(log, logging.ERROR)
        self._stored_meta: dict[str, Any] | None = None

    async def start(self) -> str:
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    def clock(self) -> float:
        """Seconds since the gateway started."""
        return self._raw_clock() - self._origin_s

    async def _start(self) -> str:
        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=cfg.upstream_timeout_s)
        self.client = aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0))
        self.poller = EngineMetrics.build(cfg.engine, self.client, cfg.effective_metrics_urls,
                                          cfg.decode_metrics_urls, cfg.scrape_interval_s, self.clock,
                                          cfg.max_metrics_bytes)
        self.warnings = list(await self.adapter.check_features(self.client, cfg.upstream))
        self.gate = Gate(self.policy, cfg, self.poller, cfg.cache_tokens)
        self.gate.slots = self._slots_from_engine()
        self.gate.wake = self._woken.set
        if cfg.state_store is not None:
            await self._open_store(cfg.state_store, cfg.state_replica)
        if cfg.lending_url is not None:
            self.gate.lender = LendingSwitch(cfg.lending_url, self.client)
        if cfg.record is not None:
            self._record_to(cfg)
        if cfg.monitor_deployment is not None:
            self.gate.monitor = build_monitor(
                cfg.monitor_deployment, cfg.monitor_workload, cfg.monitor_host_ratio, cfg.monitor_curve,
                MonitorSettings(window_s=cfg.monitor_window_s, time_scale=cfg.monitor_time_scale,
                                surge_min=cfg.monitor_surge_min))
        self.telemetry = Telemetry(self.gate, lambda: self.poller.failures if self.poller else 0)
        gate, monitor = self.gate, self.gate.monitor
        if monitor is not None:
            self.telemetry.registry.register(MonitorCollector(monitor, lambda: gate.monitor_errors))
        refused = self.telemetry.calls.labels("too_many_connections")
        self.guard.on_refused = refused.inc
        self.proxy = Proxy(cfg, self.gate, self.adapter, self.telemetry, self.client, self.clock)
        if self._stored_meta is not None:  # credential digests stay comparable across the restart
            self.proxy._binding_key = bytes.fromhex(self._stored_meta["binding_key"])
        self._log_startup(self.gate.known_capacity_tokens())
        app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[refuse_over_limit])
        for path in GATED_PATHS:
            app.router.add_post(path, self.proxy.completions)
        for path in PASSTHROUGH_PATHS:
            app.router.add_get(path, self.proxy.passthrough)
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/admin/state", self._admin(self._state))
        app.router.add_post("/admin/drain", self._admin(self._drain))
        app.router.add_post("/admin/undrain", self._admin(self._undrain))
        app.router.add_post("/admin/params", self._admin(self._params))
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        # auto_decompress off: the proxy inflates bodies itself, with a ceiling (basin.gateway.body).
        self._runner = GuardedRunner(app, self.guard, handler_cancellation=True, access_log=None,
                                     keepalive_timeout=cfg.client_idle_timeout_s, auto_decompress=False,
                                     lingering_time=1.0,  # after a refused body: 1 s to read the answer
                                     shutdown_timeout=2.0)  # shutdown() has drained by then
        await self._runner.setup()
        site = web.TCPSite(self._runner, cfg.listen_host, cfg.listen_port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{cfg.listen_host}:{port}"
        await self.poller.scrape_once()
        self._tasks = [asyncio.create_task(self.poller.run()), asyncio.create_task(self._control_loop())]
        if self.gate.monitor is not None:
            self._tasks += [asyncio.create_task(self._surge_loop()), asyncio.create_task(self._monitor_loop())]
        if self.gate.known_capacity_tokens() is None and isinstance(self.adapter, LlamaCppAdapter):
            self._tasks.append(asyncio.create_task(self._watch_capacity(self.adapter)))
        if self.store is not None:
            self.journal = Journal(self.gate)
            self._store_task = asyncio.create_task(self._store_loop())
        return self.url

    async def _open_store(self, spec: str, replica: str) -> None:
        """Open the state store and put back what it keeps; the gateway's clock continues the stored one."""
        assert self.gate is not None
        self.store = await asyncio.to_thread(open_store, spec, replica)
        stored = await asyncio.to_thread(self.store.load)
        if stored is None:
            log.info("state store %s is empty: starting afresh", self.store.where)
            return
        meta = read_meta(stored, self.store.where, self.policy.name)
        self._origin_s = self._raw_clock() - resumed_clock_s(meta, time.time())
        self.restored_sessions = restore(self.gate, stored, meta, self.clock())
        self._stored_meta = meta
        log.info("restored %d session(s) (%d parked) and the policy's state from %s", self.restored_sessions,
                 len(self.gate.driver.parked), self.store.where)

    async def _store_loop(self) -> None:
        """Writes the changes to the state store every ``state_flush_s``, in a worker thread; a last
        write when the gateway stops. A failed write is logged, counted and retried with the next."""
        while not self._store_stop.is_set():
            try:
                async with asyncio.timeout(self.config.state_flush_s):
                    await self._store_stop.wait()
            except TimeoutError:
                pass
            await self._flush()

    async def _flush(self) -> None:
        assert self.store is not None and self.journal is not None and self.proxy is not None
        batch = self.journal.capture(self.clock(), time.time(), self.proxy._binding_key)
        try:
            await asyncio.to_thread(self.store.write, batch)
        except Exception as exc:
            self.journal.retry(batch)
            self.store_errors += 1
            self._log_store("cannot write to the state store %s (retried with the next write): %s: %s",
                            self.store.where, type(exc).__name__, exc)

    def _record_to(self, cfg: GatewayConfig) -> None:
        """``--record``: ended sessions go to the file; a failed write is logged, never a failed call."""
        assert self.gate is not None and cfg.record is not None
        self.record_file = RecordFile(cfg.record, cfg.record_max_bytes, cfg.record_keep)
        self.gate.recorder = TrafficRecorder(origin_s=self.clock())
        file = self.record_file

        def write(session: Session, start_s: float) -> None:
            try:
                file.write(session, start_s)
            except (OSError, ValueError) as exc:
                log.error("cannot record session %s to %s: %s", session.session_id, file.path, exc)
        self.gate.on_recorded = write
        log.info("recording sessions to %s (task text hashed, no content)", file.path)

    def _close_record(self) -> None:
        """Sessions still open are written as far as they got, so a stop loses none."""
        if self.record_file is None:
            return
        if self.gate is not None and self.gate.recorder is not None and self.gate.on_recorded is not None:
            for session, start_s in self.gate.recorder.drain():
                self.gate.on_recorded(session, start_s)
        self.record_file.close()
        self.record_file = None

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._store_task is not None:
            self._store_stop.set()
            await self._store_task
            self._store_task = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.proxy is not None:
            self.proxy.workers.close()
        if self.gate is not None and self.gate.lender is not None:
            await self.gate.lender.stop()
        if self.client is not None:
            await self.client.close()
        self._close_record()

    async def shutdown(self) -> None:
        """The orderly stop: refuse new sessions and connections, answer parked
        calls with a retryable 503, give calls in flight up to
        ``shutdown_timeout_s`` to finish, then cut the rest with an answer that
        says so (a 503, or an error event on a stream) and release everything."""
        cfg = self.config
        if self.gate is not None and self.proxy is not None and self._runner is not None:
            self.gate.draining = True
            self.proxy.stopping = True
            if self.store is not None:  # kept parked, in their order, for the restart
                shed = self.gate.turn_away_parked("shutting-down")
            else:
                shed = self.gate.shed_parked("shutting-down", self.clock())
            log.info("shutting down: new sessions refused, %d parked call(s) answered with 503; %d call(s) in "
                     "flight get up to %g s to finish", shed, len(self.proxy.active), cfg.shutdown_timeout_s)
            for site in list(self._runner.sites):
                await site.stop()  # no new connections
            await asyncio.sleep(0)
            if self._runner.server is not None:
                self._runner.server.pre_shutdown()  # idle keep-alive connections close, busy ones after their call
            active = set(self.proxy.active)
            if active:
                _, late = await asyncio.wait(active, timeout=cfg.shutdown_timeout_s)
                if late:
                    log.warning("cutting %d call(s) still in flight after %g s (shutdown_timeout_s)", len(late),
                                cfg.shutdown_timeout_s)
                    for task in late:
                        task.cancel()
                    await asyncio.wait(late, timeout=2.0)
        await self.stop()
        log.info("stopped")

    def _slots_from_engine(self) -> tuple[int, int] | None:
        props = getattr(self.adapter, "props", None) or {}
        slots, n_ctx = props.get("total_slots"), props.get("n_ctx")
        if isinstance(slots, int) and isinstance(n_ctx, int) and slots > 0 and n_ctx > 0:
            return slots, n_ctx
        return None

    async def _watch_capacity(self, adapter: LlamaCppAdapter) -> None:
        """An engine started after the gateway: read its capacity until it is known."""
        assert self.gate is not None and self.client is not None
        while self.gate.known_capacity_tokens() is None:
            await asyncio.sleep(self.config.scrape_interval_s)
            await adapter.read_props(self.client, self.config.upstream)
            self.gate.slots = self._slots_from_engine()
            if self.gate.slots is not None:
                slots, n_ctx = self.gate.slots
                log.info("the engine now reports its capacity: %d slots of %d tokens; admission can engage",
                         slots, n_ctx)

    def _log_startup(self, capacity: int | None) -> None:
        cfg = self.config
        log.info("basin gateway: policy %s in front of %s (%s); engine metrics %s",
                 self.policy.name, cfg.upstream, cfg.engine,
                 ", ".join(cfg.effective_metrics_urls + cfg.decode_metrics_urls) or "none")
        if cfg.lending_url is not None:
            log.info("decode-memory lending switched through %s (policy %s lends: %s)", cfg.lending_url,
                     self.policy.name, "yes" if self.policy.needs.decode_memory_lending else "no")
        preferred = self.policy.needs.preferred()
        if preferred:
            log.info("policy %s runs without what only the engine can do: %s", self.policy.name,
                     ", ".join(preferred))
        if capacity is None and not self.adapter.reports_cache_capacity:
            self.warnings.append("the prefix-cache capacity is unknown: admission by working set cannot engage; "
                                 "set cache_tokens (--cache-tokens) to what the engine's cache holds")
        if not _loopback(cfg.listen_host) and cfg.session_binding is None:
            self.warnings.append(
                f"listening on {cfg.listen_host}, beyond this machine, with sessions bound to no credential: "
                "anyone who can reach the port can use or end any session whose id they know; set "
                "session_binding (e.g. Authorization) and keep the port behind your own network controls")
        if not _loopback(cfg.listen_host) and cfg.admin_token is None:
            self.warnings.append(f"listening on {cfg.listen_host} with the admin API off; set admin_token "
                                 "(BASIN_ADMIN_TOKEN) to manage the gateway remotely")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = cfg.max_connections + 128  # the upstream's connections, scrapes, workers
        if soft != resource.RLIM_INFINITY and soft < need:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard) if hard != resource.RLIM_INFINITY
                                                            else need, hard))
            except (ValueError, OSError):
                pass
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if soft < need:
                self.warnings.append(f"the open-file limit ({soft}) is below max_connections + 128 ({need}): "
                                     "raise it (ulimit -n) or lower max_connections, or new calls fail "
                                     "before the gateway can answer them")
        for warning in self.warnings:
            log.warning("%s", warning)

    async def _control_loop(self) -> None:
        """Control steps at the policy's cadence (a step that raises is retried, Gate.control_step),
        and between them, whenever woken by a change that may release a parked session (a call or
        a session ended), the policy's between-steps update; a parameter change steps at once.
        It never sleeps past the next step the policy asked for."""
        gate = self.gate
        assert gate is not None
        due = self.clock()
        while True:
            now = self.clock()
            if self._step_now or now >= due:
                self._step_now = False
                due = now + gate.control_step(now)
            else:
                gate.refresh(now)
            self._woken.clear()
            try:
                async with asyncio.timeout(max(due - self.clock(), 0.0)):
                    await self._woken.wait()
            except TimeoutError:
                pass

    async def _monitor_loop(self) -> None:
        """Observations between control steps: a policy may tick every 30 s, too seldom for rates over
        the monitor's window (and far too seldom in front of an accelerated emulator)."""
        assert self.gate is not None and self.gate.monitor is not None
        every_s = max(self.gate.monitor.settings.window_s / self.gate.monitor.settings.time_scale / MONITOR_SAMPLES,
                      0.05)
        while True:
            await asyncio.sleep(every_s)
            self.gate.observe(self.clock())

    async def _surge_loop(self) -> None:
        """The monitor's smallest trapping surge, searched in a worker thread (it takes about a second of
        CPU) every ``monitor_surge_interval_s``, so control steps and calls never wait for it."""
        assert self.gate is not None and self.gate.monitor is not None
        gate, monitor = self.gate, self.gate.monitor
        while True:
            job, found = monitor.surge_job(), None
            if job is not None:
                at = self.clock()
                try:
                    found = await asyncio.to_thread(find_smallest_surge, *job)
                except Exception as exc:
                    gate.monitor_errors += 1
                    log.error("the monitor's surge search failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
                else:
                    monitor.surge_found(found, at)
            # No estimate yet, or no stable population to push from: look again soon.
            await asyncio.sleep(self.config.monitor_surge_interval_s if found is not None
                                else min(self.config.monitor_surge_interval_s, 1.0))

    def request_tick(self) -> None:
        """Run the control step now (admin changes, tests)."""
        self._step_now = True
        self._woken.set()

    # ------------------------------------------------------------ endpoints
    async def _health(self, request: web.Request) -> web.Response:
        """Unauthenticated, so it names nothing an outsider could use: no upstream, no exception."""
        assert self.gate is not None
        if self.gate.control_failed:
            return web.json_response({"status": "unhealthy", "policy": self.policy.name,
                                      "reason": f"the control step failed {self.gate.control_failures} times "
                                      "in a row; parked sessions are shed; the log has the cause"}, status=503)
        late = self.gate.overdue_s(self.clock())
        if late > LOOP_GRACE_S:
            return web.json_response({"status": "unhealthy", "policy": self.policy.name,
                                      "reason": f"the control loop has not stepped for {late:.1f} s past the step "
                                      "the policy asked for; parked sessions wait for it"}, status=503)
        return web.json_response({"status": "ok", "policy": self.policy.name})

    async def _metrics(self, request: web.Request) -> web.Response:
        assert self.telemetry is not None
        return web.Response(body=self.telemetry.render(), content_type="text/plain", charset="utf-8")

    async def _unknown(self, request: web.Request) -> web.Response:
        served = ", ".join(f"POST {p}" for p in GATED_PATHS) + ", " + ", ".join(f"GET {p}" for p in PASSTHROUGH_PATHS)
        return error_response(404, "unknown_path", f"{request.method} {request.path} is not served here; "
                              f"the gateway serves {served}, GET /healthz, GET /metrics and /admin/*")

    def _admin(self, handler: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            token = self.config.admin_token
            if token is None:
                return error_response(403, "admin_disabled", "the admin API is off; set admin_token in the "
                                      "gateway config (or BASIN_ADMIN_TOKEN) to enable it")
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode()):
                return error_response(401, "unauthorized", "send the admin token as 'Authorization: Bearer TOKEN'")
            return await handler(request)
        return guarded

    async def _state(self, request: web.Request) -> web.Response:
        assert self.gate is not None and self.poller is not None
        state = self.gate.state()
        now = self.clock()
        stale = self.poller.stale_s(now)
        state["engine"] = {
            "name": self.config.engine,
            "metrics_urls": list(self.config.effective_metrics_urls),
            "decode_metrics_urls": list(self.config.decode_metrics_urls),
            "scrape_age_s": stale if math.isfinite(stale) else None,
            "scrape_failures": self.poller.failures,
            "last_error": self.poller.last_error,
            "last_call_error": self.proxy.last_upstream_error if self.proxy else None,
            "snapshot": self.poller.latest.as_dict() if self.poller.latest else None,
            "lending": self.gate.lender.state() if self.gate.lender is not None else None,
            "warnings": self.warnings,
        }
        state["store"] = None if self.store is None else {
            "where": self.store.where, "write_errors": self.store_errors, "restored_sessions": self.restored_sessions}
        return web.json_response(state)

    async def _drain(self, request: web.Request) -> web.Response:
        assert self.gate is not None
        self.gate.draining = True
        return web.json_response({"draining": True})

    async def _undrain(self, request: web.Request) -> web.Response:
        assert self.gate is not None
        self.gate.draining = False
        return web.json_response({"draining": False})

    async def _params(self, request: web.Request) -> web.Response:
        assert self.gate is not None
        try:
            updates = await request.json()
        except (ValueError, UnicodeDecodeError):
            return error_response(400, "invalid_json", "send a JSON object of parameter names and values")
        if not isinstance(updates, dict) or not updates:
            return error_response(400, "invalid_json", "send a non-empty JSON object of parameter names and values")
        try:
            params = self.gate.set_params(updates)
        except ValueError as exc:
            return error_response(400, "invalid_parameter", str(exc))
        log.info("policy parameters changed by the admin API: %s", json.dumps(updates))
        self.request_tick()
        return web.json_response({"params": params})


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def run_until_signalled(server: GatewayServer, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
    """Serve until SIGTERM or SIGINT, then stop in order (:meth:`GatewayServer.shutdown`)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig.name)
        if len(received) == 1:
            log.info("%s received: draining (calls in flight get up to %g s)", sig.name,
                     server.config.shutdown_timeout_s)
            stop.set()
        else:
            log.warning("%s received again: the drain is already under way (SIGKILL ends it at once)", sig.name)

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await stop.wait()
        await server.shutdown()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await server.stop()


async def serve_forever(config: GatewayConfig, policy: Policy | None = None) -> None:
    """Run until SIGTERM or SIGINT (the CLI's entry)."""
    server = GatewayServer(config, policy)
    url = await server.start()
    log.info("listening on %s", url)
    await run_until_signalled(server)
