"""Engine adapters: what the gateway sends to, and reads from, each serving engine.

The gateway keeps one internal priority scale and one set of signals; every
engine spells them differently. An adapter maps the scale onto the engine's
request field, puts session-affinity hints where the engine's router reads
them, turns a scrape of the engine's ``/metrics`` into an
:class:`EngineSnapshot`, and checks at start-up that the engine has the
features the gateway relies on (engines silently ignore a priority field when
the server flag is off, so the flag is verified, not trusted).

Metrics are read by name, never by position, with fallbacks for the names
engines have renamed (see docs for the table). The :class:`MetricsPoller`
scrapes off the request path; a failing or stale scrape shows up in its state
and never raises into the gateway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from dataclasses import asdict, dataclass
from typing import Callable, ClassVar, Iterable, Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from basin.errors import BasinInputError, where
from basin.jsonvalues import json_values

log = logging.getLogger("basin.gateway.engines")

ENGINES = ("sglang", "vllm", "llamacpp", "openai")

#: How long a start-up feature probe may take per request.
PROBE_TIMEOUT_S = 5.0

_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class MetricsError(ValueError):
    """A /metrics text that cannot be turned into a snapshot."""


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What one scrape of the engine's /metrics says."""

    at_s: float
    hit_rate: float
    queue_requests: int
    running_requests: int
    kv_used_fraction: float
    decode_wait_requests: int
    cache_capacity_tokens: int | None
    found: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready view (NaN becomes None) for the gateway's state endpoint."""
        return json_values(asdict(self))


# --------------------------------------------------------------------------
# Reading a /metrics text by name

_Series = list[tuple[dict[str, str], float]]
_NAME_END = re.compile(r"[{\s]")


def _counter_names(base: str) -> tuple[str, str]:
    """Wire names of a counter: prometheus_client appends ``_total``, hand-written exporters may not."""
    return (base + "_total", base)


def _select_lines(text: str, wanted: frozenset[str]) -> list[str]:
    """Keep only the sample, HELP and TYPE lines of the wanted names.

    A vLLM or SGLang scrape is mostly histograms the gateway never reads;
    dropping them before the (pure-Python) parser keeps a scrape from stalling
    the event loop that also proxies requests.
    """
    kept: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in wanted:
                kept.append(line)
            continue
        m = _NAME_END.search(line)
        name = line[: m.start()] if m else line
        if name in wanted:
            kept.append(line)
    return kept


def _index(engine: str, text: str, wanted: frozenset[str]) -> dict[str, _Series]:
    """Samples of the wanted names, by wire sample name (empty if none is present)."""
    kept = _select_lines(text, wanted)
    index: dict[str, _Series] = {}
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


def _diagnose(engine: str, text: str, expected: Iterable[str], hint: str) -> MetricsError:
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


class _Deltas:
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


class _Reader:
    """Lookups over one scrape that remember which wire names they used."""

    def __init__(self, index: Mapping[str, _Series]) -> None:
        self.index = index
        self.found: list[str] = []

    def series(self, *names: str) -> tuple[str, _Series] | None:
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

    def counter_delta(self, key: str, deltas: _Deltas, *bases: str) -> float | None:
        """Sum of per-series deltas of the first counter present, trying ``x_total`` then ``x`` per alias."""
        names = [n for base in bases for n in _counter_names(base)]
        hit = self.series(*names)
        if hit is None:
            return None
        return sum(deltas((key, tuple(sorted(labels.items()))), v) for labels, v in hit[1])


def _count(x: float | None) -> int:
    return 0 if x is None else max(0, int(round(x)))


def _fraction(x: float | None) -> float:
    return math.nan if x is None else x


def _ratio(num: float | None, den: float | None) -> float:
    """A hit rate in [0, 1]; NaN when unknown or when no tokens arrived since the last scrape."""
    if num is None or den is None or den <= 0:
        return math.nan
    return min(1.0, max(0.0, num / den))


# --------------------------------------------------------------------------
# HTTP helpers for the start-up probes


def _server_root(base_url: str) -> str:
    """Engine root from the configured upstream: tolerate a trailing slash or ``/v1``."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root


def _describe(exc: BaseException, timeout_s: float) -> str:
    """One-line cause for logs and the state endpoint (a bare TimeoutError has no message)."""
    if isinstance(exc, asyncio.TimeoutError):
        return f"timed out after {timeout_s:g} s"
    if isinstance(exc, MetricsError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _get(session: aiohttp.ClientSession, url: str, timeout_s: float) -> tuple[int, str]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(url, timeout=timeout, allow_redirects=False) as resp:
        return resp.status, await resp.text(errors="replace")


async def _get_or_warn(session: aiohttp.ClientSession, url: str, engine: str,
                       warnings: list[str]) -> tuple[int, str] | None:
    """GET ``url`` at start-up; a network error becomes a warning (and None)."""
    try:
        return await _get(session, url, PROBE_TIMEOUT_S)
    except _NETWORK_ERRORS as exc:
        why = _describe(exc, PROBE_TIMEOUT_S)
        warnings.append(f"{engine}: cannot read {url} ({why}); engine signals unknown.")
        return None


async def _get_json(session: aiohttp.ClientSession, url: str) -> tuple[dict | None, str | None]:
    """(JSON object, None) or (None, why not); never raises on network errors."""
    try:
        status, body = await _get(session, url, PROBE_TIMEOUT_S)
    except _NETWORK_ERRORS as exc:
        return None, f"GET {url}: {_describe(exc, PROBE_TIMEOUT_S)}"
    if status != 200:
        return None, f"GET {url}: HTTP {status}"
    try:
        data = json.loads(body)
    except ValueError:
        return None, f"GET {url}: the answer is not JSON"
    if not isinstance(data, dict):
        return None, f"GET {url}: the answer is not a JSON object"
    return data, None


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    return None


def _check_rank(rank: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"priority rank must be an int >= 0 (lower = more urgent), got {rank!r}")


# --------------------------------------------------------------------------
# Adapters


class EngineAdapter:
    """One engine's spelling of priority, affinity and signals.

    Subclasses declare the series they read (``gauges``/``counters``, with
    aliases) and build the snapshot in :meth:`_snapshot`. The adapter keeps
    the previous scrape's counters, so one adapter serves one metrics source.
    """

    name: ClassVar[str] = "base"
    priority_field_supported: ClassVar[bool] = False
    #: Plain names of gauges and counter bases read (for lookups and error messages).
    gauges: ClassVar[tuple[str, ...]] = ()
    counters: ClassVar[tuple[str, ...]] = ()
    #: What to tell the operator when the metrics are missing.
    metrics_hint: ClassVar[str] = ""

    def __init__(self) -> None:
        self._previous: dict[tuple, float] = {}
        self._wanted = frozenset(
            list(self.gauges) + [n for base in self.counters for n in _counter_names(base)]
        )
        #: None until a probe or an engine answer says otherwise;
        #: False = the engine ignores or rejects the field, so it is no longer sent.
        self.priority_enabled: bool | None = None
        self.priority_disabled_reason: str | None = None

    # -- requests ----------------------------------------------------------

    def priority_fields(self, rank: int) -> dict[str, object]:
        """Body fields carrying the session's priority (``rank``: lower = more urgent)."""
        _check_rank(rank)
        return {}

    def affinity_headers(self, session_id: str) -> dict[str, str]:
        """Headers a router in front of the engine reads to keep a session on one worker."""
        return {}

    def affinity_body(self, session_id: str) -> dict[str, object]:
        """Body fields the engine or its tooling reads as the session's identity."""
        return {}

    def disable_priority(self, reason: str) -> None:
        """Stop sending the priority field (the engine rejected it or has the feature off)."""
        if self.priority_enabled is not False:
            log.warning("%s: priority field dropped from now on: %s", self.name, reason)
        self.priority_enabled = False
        self.priority_disabled_reason = reason

    # -- metrics -----------------------------------------------------------

    @property
    def expected_series(self) -> tuple[str, ...]:
        """Names this adapter looks for, as an operator would grep for them."""
        return self.gauges + tuple(base + "_total" for base in self.counters)

    def parse_metrics(self, text: str, at_s: float) -> EngineSnapshot:
        """Turn one /metrics text into a snapshot; hit rates are over the tokens since the previous call.

        Raises :class:`MetricsError` for text that is not exposition or lacks
        every expected series; the counter state is then left untouched.
        """
        index = _index(self.name, text, self._wanted)
        if not index:
            raise _diagnose(self.name, text, self.expected_series, self.metrics_hint)
        reader = _Reader(index)
        deltas = _Deltas(self._previous)
        snapshot = self._snapshot(reader, deltas, at_s)
        self._previous = deltas.current
        return snapshot

    def _snapshot(self, r: _Reader, deltas: _Deltas, at_s: float) -> EngineSnapshot:
        raise MetricsError(f"{self.name}: no /metrics mapping for this engine")

    def _probe_index(self, text: str) -> dict[str, _Series]:
        """Index a probe's /metrics text without touching the counter state."""
        try:
            return _index(self.name, text, self._wanted)
        except MetricsError:
            return {}

    # -- start-up ----------------------------------------------------------

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        """Warnings about engine features the gateway relies on but the engine lacks; never raises."""
        return []


class SGLangAdapter(EngineAdapter):
    """SGLang (incl. PD disaggregation): higher ``priority`` first unless the server flips it."""

    name = "sglang"
    priority_field_supported = True
    gauges = (
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:max_total_num_tokens",
        "sglang:num_decode_prealloc_queue_reqs",
        "sglang:num_decode_transfer_queue_reqs",
    )
    counters = ("sglang:cached_tokens", "sglang:prompt_tokens")
    metrics_hint = "SGLang serves /metrics only when started with --enable-metrics."

    def __init__(self, low_priority_first: bool | None = None) -> None:
        super().__init__()
        self._configured_low_first = low_priority_first
        #: True when the server runs --schedule-low-priority-values-first (lower value = served first).
        self.low_priority_first: bool = bool(low_priority_first)

    def priority_fields(self, rank: int) -> dict[str, object]:
        _check_rank(rank)
        if self.priority_enabled is False:
            return {}
        return {"priority": rank if self.low_priority_first else -rank}

    def affinity_headers(self, session_id: str) -> dict[str, str]:
        # The SGLang router forwards only an allow-list of headers; this one is on it.
        return {"X-SMG-Routing-Key": session_id}

    def _snapshot(self, r: _Reader, deltas: _Deltas, at_s: float) -> EngineSnapshot:
        cached = r.counter_delta("cached", deltas, "sglang:cached_tokens")
        prompt = r.counter_delta("prompt", deltas, "sglang:prompt_tokens")
        if cached is not None and prompt is not None:
            hit_rate = _ratio(cached, prompt)
        else:
            hit_rate = _fraction(r.mean("sglang:cache_hit_rate"))
        prealloc = r.total("sglang:num_decode_prealloc_queue_reqs")
        transfer = r.total("sglang:num_decode_transfer_queue_reqs")
        capacity = r.total("sglang:max_total_num_tokens")
        return EngineSnapshot(
            at_s=at_s,
            hit_rate=hit_rate,
            queue_requests=_count(r.total("sglang:num_queue_reqs")),
            running_requests=_count(r.total("sglang:num_running_reqs")),
            kv_used_fraction=_fraction(r.mean("sglang:token_usage")),
            decode_wait_requests=_count(prealloc) + _count(transfer),
            cache_capacity_tokens=None if capacity is None else _count(capacity),
            found=tuple(r.found),
        )

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        root = _server_root(base_url)
        info: dict | None = None
        failures: list[str] = []
        for path in ("/get_server_info", "/server_info"):
            info, why = await _get_json(session, root + path)
            if info is not None:
                break
            failures.append(str(why))
        direction = "lower first" if self.low_priority_first else "higher first"
        if info is None:
            return [
                f"sglang: cannot verify priority scheduling ({'; '.join(failures)}); sending priorities "
                f"{direction} on trust. Start SGLang with --enable-priority-scheduling"
                + (" --schedule-low-priority-values-first" if self.low_priority_first else "")
                + " or session priorities are ignored."
            ]

        def flag(key: str) -> bool | None:
            if key in info:
                return _as_bool(info[key])
            nested = info.get("server_args")
            return _as_bool(nested.get(key)) if isinstance(nested, dict) and key in nested else None

        warnings: list[str] = []
        enabled = flag("enable_priority_scheduling")
        if enabled is None:
            warnings.append(
                "sglang: the server info has no enable_priority_scheduling: this SGLang build may predate "
                "priority scheduling, and the priority field is then ignored."
            )
        elif not enabled:
            self.priority_enabled = False
            self.priority_disabled_reason = "SGLang runs without --enable-priority-scheduling"
            warnings.append(
                "sglang: priority scheduling is OFF, so the engine ignores session priorities and the "
                "gateway stops sending them: start SGLang with --enable-priority-scheduling."
            )
        else:
            self.priority_enabled = True
        low_first = flag("schedule_low_priority_values_first")
        if low_first is not None:
            if self._configured_low_first is not None and low_first != self._configured_low_first:
                warnings.append(
                    f"sglang: configured low_priority_first={self._configured_low_first} but the server "
                    f"reports schedule_low_priority_values_first={low_first}; following the server."
                )
            self.low_priority_first = low_first
        elif enabled:
            warnings.append(
                "sglang: the server info has no schedule_low_priority_values_first; assuming priorities "
                f"are served {direction}."
            )
        return warnings


class VLLMAdapter(EngineAdapter):
    """vLLM V1: lower ``priority`` first under ``--scheduling-policy priority``."""

    name = "vllm"
    priority_field_supported = True
    gauges = (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:cache_config_info",
    )
    counters = (
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits",
        "vllm:gpu_prefix_cache_queries",
    )
    metrics_hint = "vLLM serves /metrics on its API port."

    def priority_fields(self, rank: int) -> dict[str, object]:
        _check_rank(rank)
        if self.priority_enabled is False:
            return {}
        return {"priority": rank}

    def affinity_body(self, session_id: str) -> dict[str, object]:
        return {"session_id": session_id}

    def _hits_queries(self, r: _Reader, deltas: _Deltas) -> tuple[float | None, float | None]:
        """Current counter names first, then the deprecated ``gpu_`` pair (never mixed)."""
        for hits_name, queries_name in (
            ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
            ("vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"),
        ):
            if any(n in r.index for n in _counter_names(queries_name)):
                return (
                    r.counter_delta("hits", deltas, hits_name),
                    r.counter_delta("queries", deltas, queries_name),
                )
        return None, None

    @staticmethod
    def _capacity(r: _Reader) -> int | None:
        """KV tokens across engines: num_gpu_blocks x block_size per ``engine`` label of cache_config_info."""
        hit = r.series("vllm:cache_config_info")
        if hit is None:
            return None
        per_engine: dict[str, int] = {}
        for labels, _ in hit[1]:
            try:
                tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                continue  # num_gpu_blocks is "None" until the profiler has run
            per_engine[labels.get("engine", "")] = tokens
        return sum(per_engine.values()) if per_engine else None

    def _snapshot(self, r: _Reader, deltas: _Deltas, at_s: float) -> EngineSnapshot:
        hits, queries = self._hits_queries(r, deltas)
        return EngineSnapshot(
            at_s=at_s,
            hit_rate=_ratio(hits, queries),
            queue_requests=_count(r.total("vllm:num_requests_waiting")),
            running_requests=_count(r.total("vllm:num_requests_running")),
            kv_used_fraction=_fraction(r.mean("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
            decode_wait_requests=0,
            cache_capacity_tokens=self._capacity(r),
            found=tuple(r.found),
        )

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        warnings = [
            "vllm: vLLM exposes no endpoint that shows its scheduling policy, so the gateway cannot "
            "verify it: the `priority` field it sends only orders requests under "
            "`vllm serve --scheduling-policy priority` (the default fcfs policy rejects non-zero "
            "priorities); if the engine rejects the field, the gateway drops it and logs why."
        ]
        url = _server_root(base_url) + "/metrics"
        got = await _get_or_warn(session, url, "vllm", warnings)
        if got is None:
            return warnings
        status, text = got
        if status != 200:
            warnings.append(f"vllm: {url} answered HTTP {status}; engine signals unknown.")
            return warnings
        index = self._probe_index(text)
        names = _counter_names("vllm:prefix_cache_queries") + _counter_names("vllm:gpu_prefix_cache_queries")
        if not any(n in index for n in names):
            warnings.append(
                f"vllm: {url} has no vllm:prefix_cache_queries: prefix caching may be off "
                "(--enable-prefix-caching) or this is not vLLM; the engine hit rate will be unknown."
            )
        return warnings


class LlamaCppAdapter(EngineAdapter):
    """llama.cpp ``llama-server``: no per-request priority; slots instead of a paged KV pool."""

    name = "llamacpp"
    priority_field_supported = False
    gauges = ("llamacpp:requests_deferred", "llamacpp:requests_processing", "llamacpp:kv_cache_usage_ratio")
    counters = ("llamacpp:prompt_tokens", "llamacpp:prompt_tokens_cached")
    metrics_hint = "llama-server serves /metrics only when started with --metrics."

    def __init__(self) -> None:
        super().__init__()
        #: From GET /props at start-up: ``total_slots`` and per-slot ``n_ctx`` when reported.
        self.props: dict[str, int] = {}

    def _snapshot(self, r: _Reader, deltas: _Deltas, at_s: float) -> EngineSnapshot:
        # llama.cpp's prompt counter excludes the tokens it reused, so the denominator adds them back.
        cached = r.counter_delta("cached", deltas, "llamacpp:prompt_tokens_cached")
        computed = r.counter_delta("prompt", deltas, "llamacpp:prompt_tokens")
        total = None if cached is None or computed is None else cached + computed
        return EngineSnapshot(
            at_s=at_s,
            hit_rate=_ratio(cached, total),
            queue_requests=_count(r.total("llamacpp:requests_deferred")),
            running_requests=_count(r.total("llamacpp:requests_processing")),
            kv_used_fraction=_fraction(r.mean("llamacpp:kv_cache_usage_ratio")),  # gone in current builds
            decode_wait_requests=0,
            cache_capacity_tokens=None,
            found=tuple(r.found),
        )

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        root = _server_root(base_url)
        warnings = [
            "llamacpp: llama.cpp has no per-request priority: session priorities order only the gateway's "
            "parked queue; once forwarded, calls wait for a free slot in FIFO order."
        ]
        props, why = await _get_json(session, root + "/props")
        if props is None:
            warnings.append(f"llamacpp: cannot read the server properties ({why}); slot count unknown.")
        else:
            found: dict[str, int] = {}
            slots = props.get("total_slots")
            if isinstance(slots, int) and not isinstance(slots, bool):
                found["total_slots"] = slots
            settings = props.get("default_generation_settings")
            n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else props.get("n_ctx")
            if isinstance(n_ctx, int) and not isinstance(n_ctx, bool):
                found["n_ctx"] = n_ctx
            self.props = found
        url = root + "/metrics"
        got = await _get_or_warn(session, url, "llamacpp", warnings)
        if got is None:
            return warnings
        status, text = got
        if status == 501:
            warnings.append("llamacpp: /metrics answered 501: start llama-server with --metrics.")
        elif status != 200:
            warnings.append(f"llamacpp: {url} answered HTTP {status}; engine signals unknown.")
        elif not any(n in self._probe_index(text) for n in _counter_names("llamacpp:prompt_tokens_cached")):
            warnings.append(
                "llamacpp: /metrics has no llamacpp:prompt_tokens_cached_total (older llama-server "
                "build): the engine hit rate is unknown; only the responses' cached-token counts remain."
            )
        return warnings


class OpenAIAdapter(EngineAdapter):
    """A generic OpenAI-compatible upstream: no metrics, no priority, no affinity hints."""

    name = "openai"
    priority_field_supported = False
    metrics_hint = "A generic OpenAI-compatible upstream has no known metrics: leave the metrics URL unset."

    def parse_metrics(self, text: str, at_s: float) -> EngineSnapshot:
        raise MetricsError(f"openai: no /metrics mapping for a generic upstream. {self.metrics_hint}")

    async def check_features(self, session: aiohttp.ClientSession, base_url: str) -> list[str]:
        return [
            "openai: generic OpenAI-compatible upstream: no engine metrics and no priority field are "
            "available; admission runs on the gateway's own accounting only."
        ]


_ADAPTERS: dict[str, type[EngineAdapter]] = {
    "sglang": SGLangAdapter,
    "vllm": VLLMAdapter,
    "llamacpp": LlamaCppAdapter,
    "openai": OpenAIAdapter,
}


def make_adapter(engine: str, *, low_priority_first: bool | None = None) -> EngineAdapter:
    """The adapter for ``engine``; ``low_priority_first`` only applies to SGLang (its direction flag)."""
    key = engine.strip().lower() if isinstance(engine, str) else None
    if key not in _ADAPTERS:
        raise BasinInputError(
            f"{where(field='engine')}: unknown engine {engine!r}; expected one of {', '.join(ENGINES)}"
        )
    if key == "sglang":
        return SGLangAdapter(low_priority_first=low_priority_first)
    return _ADAPTERS[key]()


# --------------------------------------------------------------------------
# Polling


class MetricsPoller:
    """Polls /metrics off the request path; a failing or stale scrape is visible, never fatal."""

    def __init__(
        self,
        adapter: EngineAdapter,
        session: aiohttp.ClientSession,
        metrics_url: str | None,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0 or not timeout_s > 0:
            raise ValueError(f"interval_s and timeout_s must be > 0, got {interval_s!r} and {timeout_s!r}")
        self.adapter = adapter
        self.session = session
        self.metrics_url = metrics_url
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.clock = clock
        self.latest: EngineSnapshot | None = None
        self.failures = 0
        self.last_error: str | None = None
        self.scrapes = 0

    def stale_s(self, now_s: float) -> float:
        """Age of the latest good snapshot; infinite before the first one."""
        if self.latest is None:
            return math.inf
        return max(0.0, now_s - self.latest.at_s)

    async def scrape_once(self) -> EngineSnapshot | None:
        """One scrape; on failure keep the previous snapshot and record why (never raises)."""
        if self.metrics_url is None:
            return None
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self.session.get(self.metrics_url, timeout=timeout, allow_redirects=False) as resp:
                text = await resp.text(errors="replace")
                if resp.status != 200:
                    raise MetricsError(f"HTTP {resp.status}: {text.strip()[:200]!r}")
            snapshot = self.adapter.parse_metrics(text, self.clock())
        except Exception as exc:  # CancelledError is not an Exception: cancelling still stops us
            self.failures += 1
            self.last_error = (
                f"scrape of {self.metrics_url} {_describe(exc, self.timeout_s)}"
                if isinstance(exc, asyncio.TimeoutError)
                else f"scrape of {self.metrics_url} failed: {_describe(exc, self.timeout_s)}"
            )
            if self.failures == 1:
                log.warning("%s (engine signals go stale until a scrape succeeds)", self.last_error)
            return None
        if self.failures:
            log.warning("scrape of %s recovered after %d failures", self.metrics_url, self.failures)
        self.latest = snapshot
        self.failures = 0
        self.last_error = None
        self.scrapes += 1
        return snapshot

    async def run(self) -> None:
        """Scrape every ``interval_s`` until cancelled; returns at once when there is no metrics URL."""
        if self.metrics_url is None:
            return
        while True:
            started = self.clock()
            await self.scrape_once()
            elapsed = self.clock() - started
            await asyncio.sleep(min(self.interval_s, max(0.0, self.interval_s - elapsed)))
