"""Reading an engine's ``/metrics`` text (Prometheus exposition) by name.

Only the series an adapter asks for are parsed: a vLLM or SGLang scrape is
mostly histograms the gateway never reads, so the wanted lines are picked out
by one regular expression (C speed) before the pure-Python parser sees them. Lookups go by wire name with
aliases in order of preference (engines rename their metrics), counters are
turned into per-series deltas against the previous scrape, and a text that
yields nothing is explained (empty, not exposition, or another engine's).

It also writes the vulnerability monitor's gauges (:class:`MonitorCollector`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from basin.gateway.monitor import STATES, VulnerabilityMonitor

#: The samples of one wire name: (labels, value) per label set.
Series = list[tuple[dict[str, str], float]]


class MetricsError(ValueError):
    """A /metrics text that cannot be turned into a snapshot."""


def counter_names(base: str) -> tuple[str, str]:
    """Wire names of a counter: prometheus_client appends ``_total``, hand-written exporters may not."""
    return (base + "_total", base)


_SELECTORS: dict[frozenset[str], re.Pattern[str]] = {}


def _selector(wanted: frozenset[str]) -> re.Pattern[str]:
    pattern = _SELECTORS.get(wanted)
    if pattern is None:
        # Longest names first, so "x_total" is tried before "x".
        names = "|".join(re.escape(n) for n in sorted(wanted, key=len, reverse=True))
        pattern = _SELECTORS[wanted] = re.compile(
            rf"^[ \t]*(?:#[ \t]*(?:HELP|TYPE)[ \t]+)?(?:{names})(?=[{{ \t\r]|$).*$", re.MULTILINE)
    return pattern


def select_lines(text: str, wanted: frozenset[str]) -> list[str]:
    """Keep only the sample, HELP and TYPE lines of the wanted names."""
    if not wanted:
        return []
    return [m.group(0).strip() for m in _selector(wanted).finditer(text)]


def index_series(engine: str, text: str, wanted: frozenset[str]) -> dict[str, Series]:
    """Finite samples of the wanted names, by wire sample name (empty if none is present).

    Raises :class:`MetricsError` when a line of a wanted series is malformed.
    """
    kept = select_lines(text, wanted)
    index: dict[str, Series] = {}
    if not kept:
        return index
    try:
        for family in text_string_to_metric_families("\n".join(kept) + "\n"):
            for sample in family.samples:
                if sample.name in wanted:
                    value = float(sample.value)
                    if math.isfinite(value):
                        index.setdefault(sample.name, []).append((dict(sample.labels), value))
    except Exception as exc:  # the parser raises bare ValueError/IndexError on bad lines
        why = str(exc) or type(exc).__name__
        raise MetricsError(f"{engine}: malformed /metrics line among the expected series: {why}") from exc
    return index


def diagnose(engine: str, text: str, expected: Iterable[str], hint: str) -> MetricsError:
    """Explain why a text gave no expected series: not exposition at all, or the wrong metrics."""
    names = ", ".join(expected)
    stripped = text.strip()
    if not stripped:
        return MetricsError(f"{engine}: the /metrics response is empty; expected {names}. {hint}".strip())
    head = "\n".join(stripped.splitlines()[:200]) + "\n"
    try:
        families = [f.name for f in text_string_to_metric_families(head)]
    except Exception as exc:
        return MetricsError(
            f"{engine}: the /metrics response is not Prometheus text exposition "
            f"({str(exc) or type(exc).__name__}); it begins {stripped[:80]!r}"
        )
    if not families:
        return MetricsError(
            f"{engine}: the /metrics response holds no metrics; expected {names}. {hint}".strip()
        )
    # Namespaced names (vllm:..., sglang:...) say which engine this really is; runtime ones do not.
    sample = ", ".join(sorted(families, key=lambda n: ":" not in n)[:5])
    return MetricsError(
        f"{engine}: none of the expected series ({names}) in /metrics "
        f"(it has other metrics, e.g. {sample}): wrong engine or metrics URL? {hint}".strip()
    )


class Deltas:
    """Per-series counter deltas against the previous scrape.

    Keyed per label set, so one DP rank restarting does not corrupt the
    others. A counter that went down is a restart: its new value is the delta.
    A series never seen before counts from zero (first scrape: cumulative).
    """

    def __init__(self, previous: Mapping[tuple, float]) -> None:
        self.previous = previous
        self.current: dict[tuple, float] = {}

    def __call__(self, key: tuple, value: float) -> float:
        self.current[key] = value
        before = self.previous.get(key)
        if before is None or value < before:
            return value
        return value - before


class Reader:
    """Lookups over one scrape that remember which wire names they used."""

    def __init__(self, index: Mapping[str, Series]) -> None:
        self.index = index
        self.found: list[str] = []

    def series(self, *names: str) -> tuple[str, Series] | None:
        """The first of ``names`` present (aliases in order of preference)."""
        for name in names:
            rows = self.index.get(name)
            if rows:
                if name not in self.found:
                    self.found.append(name)
                return name, rows
        return None

    def total(self, *names: str) -> float | None:
        """Sum over label sets (DP ranks, engines) of the first name present."""
        hit = self.series(*names)
        return None if hit is None else sum(v for _, v in hit[1])

    def mean(self, *names: str) -> float | None:
        """Mean over label sets: fractions (KV usage, hit-rate gauges) do not add up across ranks."""
        hit = self.series(*names)
        return None if hit is None else sum(v for _, v in hit[1]) / len(hit[1])

    def counter_delta(self, key: str, deltas: Deltas, *bases: str) -> float | None:
        """Sum of per-series deltas of the first counter present, trying ``x_total`` then ``x`` per alias."""
        names = [n for base in bases for n in counter_names(base)]
        hit = self.series(*names)
        if hit is None:
            return None
        return sum(deltas((key, tuple(sorted(labels.items()))), v) for labels, v in hit[1])


# ---------------------------------------------------------------- the monitor's gauges
class MonitorCollector(Collector):
    """The vulnerability monitor's latest estimate as ``basin_gateway_monitor_*``
    gauges, read when Prometheus scrapes (docs/gateway.md, "The vulnerability
    monitor"). Unknown values are NaN, never a made-up number."""

    def __init__(self, monitor: VulnerabilityMonitor, errors: Callable[[], int] = lambda: 0):
        self.monitor = monitor
        self.errors = errors

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        est, surge = self.monitor.last, self.monitor.surge
        nan = math.nan
        state = GaugeMetricFamily("basin_gateway_monitor_state", "1 for the monitor's current state "
                                  "(near-tipping, past-tipping and overloaded are warnings)", labels=["state"])
        for name in STATES:
            state.add_metric([name], float(est is not None and est.state == name))
        yield state
        yield GaugeMetricFamily("basin_gateway_monitor_warning", "1 while the state is a warning",
                                value=float(est is not None and est.warning))
        for metric, text, value in (
                ("population_sessions", "Admitted sessions, mean over the window (the model's N)",
                 est.population if est else nan),
                ("tipping_sessions", "Unstable equilibrium N_u at the observed rate: past it the population "
                 "keeps growing (NaN: none)", est.n_unstable if est else nan),
                ("stable_sessions", "Stable equilibrium N_s at the observed rate (NaN: none)",
                 est.n_stable if est else nan),
                ("tipping_margin_sessions", "N_u minus the population: sessions to spare before the trap",
                 est.tipping_margin_sessions if est else nan),
                ("mean_context_tokens", "Fitted mean context of an active session (c_bar)",
                 est.mean_context_tokens if est else nan),
                ("tool_gap_seconds", "Fitted tool time per call (g), engine seconds",
                 est.tool_gap_s if est else nan),
                ("smallest_surge_factor", "Smallest arrival-rate factor whose surge traps from N_s "
                 "(NaN: none up to 50x, or not searched yet)", surge.factor if surge and surge.factor else nan),
                ("smallest_surge_sessions", "Sessions that smallest surge brings beyond the base rate",
                 surge.extra_sessions if surge and surge.extra_sessions is not None else nan),
                ("smallest_surge_minutes", "Length of the surge searched for",
                 self.monitor.settings.surge_min)):
            yield GaugeMetricFamily(f"basin_gateway_monitor_{metric}", text, value=float(value))
        band = GaugeMetricFamily("basin_gateway_monitor_band_per_min", "Vulnerable band of arrival rates: "
                                 "low D_low, high D(N*)", labels=["edge"])
        band.add_metric(["low"], est.d_low_per_min if est else nan)
        band.add_metric(["high"], est.d_star_per_min if est else nan)
        yield band
        rate = GaugeMetricFamily("basin_gateway_monitor_rate_per_min", "Observed sessions per engine minute",
                                 labels=["kind"])
        rate.add_metric(["arrival"], est.arrival_rate_per_min if est else nan)
        rate.add_metric(["departure"], est.departure_rate_per_min if est else nan)
        yield rate
        hit = GaugeMetricFamily("basin_gateway_monitor_hit_rate", "Hit rate observed, and the model's curve at "
                                "the observed working set", labels=["source"])
        hit.add_metric(["observed"], est.hit_rate if est else nan)
        hit.add_metric(["model"], est.model_hit_rate if est else nan)
        yield hit
        yield CounterMetricFamily("basin_gateway_monitor_errors", "Monitor steps that raised, in all",
                                  value=float(self.errors()))
