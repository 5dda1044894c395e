"""The gateway's own Prometheus metrics.

Gauges are read from the gate when Prometheus scrapes (a collector), so the
request path only pays for the two histograms it observes itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from basin.gateway.gate import UNKNOWN_CAPACITY_TOKENS, Gate

_LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_WAIT_BUCKETS_S = (0.1, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
#: The policy's signals, one gauge each with its unit in its name (signal
#: field -> metric, help).
_SIGNALS = {
    "hit_rate": "basin_gateway_signal_hit_ratio",
    "prefill_queue_requests": "basin_gateway_signal_prefill_queue_requests",
    "prefill_backlog_tokens": "basin_gateway_signal_prefill_backlog_tokens",
    "decode_wait_requests": "basin_gateway_signal_decode_wait_requests",
    "decode_used_fraction": "basin_gateway_signal_decode_used_ratio",
    "arrival_rate_per_min": "basin_gateway_signal_arrival_rate_per_minute",
    "gpu_cache_tokens": "basin_gateway_signal_gpu_cache_tokens",
    "mean_context_tokens": "basin_gateway_signal_mean_context_tokens",
    "stale_s": "basin_gateway_signal_staleness_seconds",
}
#: Signals only a lending engine reports (exported with ``lending_url`` set).
_LENDING_SIGNALS = {
    "lent_cache_tokens": "basin_gateway_signal_lent_cache_tokens",
    "decode_kv_tokens": "basin_gateway_signal_decode_kv_tokens",
}


class _GateCollector(Collector):
    def __init__(self, gate: Gate, scrape_failures: Callable[[], int]):
        self.gate = gate
        self.scrape_failures = scrape_failures

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gate = self.gate
        sessions = GaugeMetricFamily("basin_gateway_sessions", "Sessions by state", labels=["state"])
        for state, count in gate.session_counts().items():
            sessions.add_metric([state], count)
        sessions.add_metric(["paused"], gate.paused_count())
        yield sessions
        outcomes = CounterMetricFamily("basin_gateway_session_outcomes", "Session decisions and endings",
                                       labels=["outcome"])
        for name, count in gate.counts.items():
            outcomes.add_metric([name], count)
        yield outcomes
        yield GaugeMetricFamily("basin_gateway_working_set_tokens", "Sum of admitted sessions' contexts",
                                value=gate.driver.working_set_tokens)
        policy_state = getattr(gate.policy, "state", None)
        budget = getattr(policy_state, "budget", math.nan)
        yield GaugeMetricFamily("basin_gateway_budget_tokens", "Admission budget (NaN: no admission)",
                                value=budget if math.isfinite(budget) else math.nan)
        yield GaugeMetricFamily("basin_gateway_admission_active", "Admission by working set engaged",
                                value=float(bool(getattr(policy_state, "admit", False))))
        yield GaugeMetricFamily("basin_gateway_ordering_active", "Session priority sent to the engine",
                                value=float(gate.ordered))
        yield GaugeMetricFamily("basin_gateway_draining", "New sessions refused", value=float(gate.draining))
        yield GaugeMetricFamily("basin_gateway_scrape_failures", "Consecutive failed engine scrapes",
                                value=float(self.scrape_failures()))
        yield GaugeMetricFamily("basin_gateway_control_failures", "Control steps failed in a row (0 after a success)",
                                value=float(gate.control_failures))
        yield CounterMetricFamily("basin_gateway_control_errors", "Exceptions raised by the policy, in all",
                                  value=float(gate.control_errors))
        lender = gate.lender
        if lender is not None:
            confirmed = math.nan if lender.confirmed is None else float(lender.confirmed[0])
            yield GaugeMetricFamily("basin_gateway_lending_on", "Decode-memory lending as the engine last "
                                    "confirmed it (1 on, 0 off, NaN not yet confirmed)", value=confirmed)
            yield CounterMetricFamily("basin_gateway_lending_switch_failures", "Failed posts of the lending "
                                      "switch to lending_url, in all", value=float(lender.failures))
        # Absent before the first control tick; an unknown capacity is NaN, not a huge cache.
        if gate.last_signals is not None:
            signals = {**_SIGNALS, **(_LENDING_SIGNALS if lender is not None else {})}
            for name, metric in signals.items():
                value = float(getattr(gate.last_signals, name))
                if name == "gpu_cache_tokens" and value >= UNKNOWN_CAPACITY_TOKENS:
                    value = math.nan
                yield GaugeMetricFamily(metric, f"The policy's {name} signal at the last control tick", value=value)


class Telemetry:
    """The registry the gateway serves at ``/metrics``."""

    def __init__(self, gate: Gate, scrape_failures: Callable[[], int] = lambda: 0):
        self.registry = CollectorRegistry()
        self.registry.register(_GateCollector(gate, scrape_failures))
        self.added_latency = Histogram(
            "basin_gateway_added_latency_seconds",
            "Time the gateway spends on a call before forwarding it (parking excluded)",
            buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.park_wait = Histogram("basin_gateway_park_wait_seconds", "Time a held call waited",
                                   buckets=_WAIT_BUCKETS_S, registry=self.registry)
        self.calls = Counter("basin_gateway_calls", "Calls by outcome", ["outcome"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
