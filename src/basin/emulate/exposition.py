"""The emulated engine's ``/metrics``, under SGLang's or vLLM's real names.

Exactly the series the gateway's SGLang and vLLM adapters read, written with
prometheus_client (counters get their ``_total``), labelled as the engines
label them. SGLang in PD runs one server per instance, so the emulator
offers three views: ``prefill`` and ``decode`` are what each role's servers
would export (one series per instance, ``engine_type`` and ``dp_rank``
labels), and ``all``, the deployment as one server: the prefix-cache series
of the prefill instances with the decode-memory series of the decode ones
(so the capacity a scraper sums is the prefix cache, not decode KV). vLLM
has no PD view: one engine (``engine="0"``) whose KV cache is the prefix
cache and whose KV usage is decode memory's.

Besides the engines' names, two ``basin_emulator_*`` gauges carry what only
this engine has, decode memory lent as prefix cache and the decode KV it is
lent from (the gateway's lending switch reads them; docs/emulate.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from basin.emulate.calls import MetricsStyle
from basin.emulate.engine import EmulatedEngine

View = Literal["all", "prefill", "decode"]
VIEWS: tuple[str, ...] = ("all", "prefill", "decode")

_SGLANG_LABELS = ["model_name", "engine_type", "dp_rank", "tp_rank"]
#: The emulator's own series; no SGLang or vLLM build exports them.
LENT_CACHE_TOKENS = "basin_emulator_lent_cache_tokens"
DECODE_KV_TOKENS = "basin_emulator_decode_kv_tokens"
_LENT_HELP = ("Decode KV memory lent to the prefill side as prefix cache, in tokens (BASIN's engine change, "
              "switched by POST /emulator/lending; real SGLang and vLLM have no such metric).")
_DECODE_KV_HELP = ("Decode KV capacity in tokens, the memory lending draws from (basin emulate only; real "
                   "SGLang and vLLM have no such metric).")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class _EngineCollector(Collector):
    def __init__(self, engine: EmulatedEngine, style: MetricsStyle, view: View, model: str):
        self.engine, self.style, self.view, self.model = engine, style, view, model

    def collect(self) -> Iterator[Metric]:
        if self.style == "sglang":
            yield from self._sglang()
        else:
            yield from self._vllm()

    # ------------------------------------------------------------------ SGLang
    def _sglang(self) -> Iterator[Metric]:
        eng, view, model = self.engine, self.view, self.model
        pre = eng.prefill_figures() if view in ("all", "prefill") else []
        dec = eng.decode_figures() if view in ("all", "decode") else []

        def family(kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str,
                   doc: str) -> GaugeMetricFamily | CounterMetricFamily:
            return kind(name, doc, labels=_SGLANG_LABELS)

        def p_labels(i: int) -> list[str]:
            return [model, "prefill", str(i), "0"]

        def d_labels(i: int) -> list[str]:
            return [model, "decode", str(i), "0"]

        queue = family(GaugeMetricFamily, "sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        running = family(GaugeMetricFamily, "sglang:num_running_reqs", "The number of running requests.")
        usage = family(GaugeMetricFamily, "sglang:token_usage", "The token usage.")
        hit = family(GaugeMetricFamily, "sglang:cache_hit_rate", "The prefix cache hit rate.")
        total = family(GaugeMetricFamily, "sglang:max_total_num_tokens",
                       "Maximum total number of tokens in the KV pool.")
        for f in pre:
            queue.add_metric(p_labels(f.index), f.queue_requests)
            running.add_metric(p_labels(f.index), f.running_requests)
            if view == "prefill":
                usage.add_metric(p_labels(f.index), f.pool_used_fraction)
            hit.add_metric(p_labels(f.index), f.recent_hit_rate)
            total.add_metric(p_labels(f.index), f.pool_tokens)
        prealloc = family(GaugeMetricFamily, "sglang:num_decode_prealloc_queue_reqs",
                          "The number of requests in the decode prealloc queue.")
        transfer = family(GaugeMetricFamily, "sglang:num_decode_transfer_queue_reqs",
                          "The number of requests in the decode transfer queue.")
        lent = family(GaugeMetricFamily, LENT_CACHE_TOKENS, _LENT_HELP)
        kv = family(GaugeMetricFamily, DECODE_KV_TOKENS, _DECODE_KV_HELP)
        for g in dec:
            if view == "decode":
                queue.add_metric(d_labels(g.index), g.joining_requests)
                total.add_metric(d_labels(g.index), g.kv_tokens)
            running.add_metric(d_labels(g.index), g.running_requests)
            usage.add_metric(d_labels(g.index), g.kv_used_fraction)
            prealloc.add_metric(d_labels(g.index), g.memory_wait_requests)
            transfer.add_metric(d_labels(g.index), g.transfer_requests)
            lent.add_metric(d_labels(g.index), g.lent_tokens)
            kv.add_metric(d_labels(g.index), g.kv_tokens)
        yield from (queue, running, usage, hit, total)
        if dec:
            yield from (prealloc, transfer, lent, kv)
        if pre:
            prompt = CounterMetricFamily("sglang:prompt_tokens", "Number of prefill tokens processed.",
                                         labels=["model_name"])
            prompt.add_metric([model], sum(f.prompt_tokens_total for f in pre))
            cached = CounterMetricFamily("sglang:cached_tokens", "Number of cached prompt tokens.",
                                         labels=["model_name"])
            cached.add_metric([model], sum(f.cached_tokens_total for f in pre))
            yield from (prompt, cached)
        if dec:
            gen = CounterMetricFamily("sglang:generation_tokens", "Number of generation tokens processed.",
                                      labels=["model_name"])
            gen.add_metric([model], eng.generation_tokens_total)
            yield gen

    # -------------------------------------------------------------------- vLLM
    def _vllm(self) -> Iterator[Metric]:
        eng, model = self.engine, self.model
        pre, dec = eng.prefill_figures(), eng.decode_figures()
        labels = ["engine", "model_name"]
        ours = ["0", model]
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                    labels=labels)
        waiting.add_metric(ours, sum(f.queue_requests for f in pre)
                           + sum(g.memory_wait_requests + g.joining_requests for g in dec))
        running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                                    labels=labels)
        running.add_metric(ours, sum(f.running_requests for f in pre)
                           + sum(g.running_requests + g.transfer_requests for g in dec))
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                                  labels=labels)
        usage.add_metric(ours, _mean([g.kv_used_fraction for g in dec]))
        page = eng.hardware.page_tokens
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=["block_size", "enable_prefix_caching", "engine", "num_gpu_blocks"])
        info.add_metric([str(page), "True", "0", str(sum(f.pool_tokens for f in pre) // page)], 1.0)
        queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                                      "queried tokens.", labels=labels)
        queries.add_metric(ours, sum(f.prompt_tokens_total for f in pre))
        hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                   "tokens.", labels=labels)
        hits.add_metric(ours, sum(f.cached_tokens_total for f in pre))
        prompt = CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.", labels=labels)
        prompt.add_metric(ours, sum(f.prompt_tokens_total for f in pre))
        gen = CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.", labels=labels)
        gen.add_metric(ours, eng.generation_tokens_total)
        lent = GaugeMetricFamily(LENT_CACHE_TOKENS, _LENT_HELP, labels=labels)
        lent.add_metric(ours, sum(g.lent_tokens for g in dec))
        kv = GaugeMetricFamily(DECODE_KV_TOKENS, _DECODE_KV_HELP, labels=labels)
        kv.add_metric(ours, sum(g.kv_tokens for g in dec))
        yield from (waiting, running, usage, info, queries, hits, prompt, gen, lent, kv)


def metrics_text(engine: EmulatedEngine, style: MetricsStyle, model: str, view: View = "all") -> str:
    """The Prometheus exposition text of ``engine`` now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(engine, style, view, model))
    return generate_latest(registry).decode("utf-8")
