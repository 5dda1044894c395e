"""What each kind of engine declares about itself, and the metrics it exports.

Calibration measures; these are the engine's own figures it is
cross-checked against, each with where it was read:

- vLLM: ``/v1/models`` ``max_model_len``; ``/metrics``
  ``vllm:cache_config_info`` (``num_gpu_blocks`` x ``block_size``: its KV
  pool, which running requests and the prefix cache share),
  ``vllm:kv_cache_usage_perc``, ``vllm:prefix_cache_hits_total`` /
  ``vllm:prefix_cache_queries_total``; and, where the server runs with its
  development endpoints (``VLLM_SERVER_DEV_MODE=1``), ``/server_info``'s
  scheduler config: the per-step token budget (``max_num_scheduled_tokens``,
  else ``max_num_batched_tokens``) and ``max_num_seqs``. vLLM 0.32 exports
  the budget nowhere else (not in ``/metrics``, ``/v1/models``, ``/load``).
- SGLang: ``/get_server_info`` (``context_length``, ``max_total_num_tokens``,
  ``chunked_prefill_size``, ``page_size``, ``max_running_requests``);
  ``sglang:token_usage``, ``sglang:cached_tokens_total``.
- llama.cpp: ``/props`` (``default_generation_settings.n_ctx`` per slot,
  ``total_slots``); ``llamacpp:kv_cache_usage_ratio`` where the build has it.
- ``basin emulate`` (in either style) adds ``basin_emulator_decode_kv_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from basin.calibrate.client import EngineClient

EngineKind = Literal["vllm", "sglang", "llamacpp", "generic"]
KINDS: tuple[str, ...] = ("vllm", "sglang", "llamacpp", "generic")

#: Fields the call bodies add per kind: output of exactly ``max_tokens`` (a
#: model may otherwise stop at its end-of-sequence token) and, for llama.cpp,
#: its prompt cache switched on explicitly.
EXTRA_BODY: dict[str, dict[str, Any]] = {
    "vllm": {"ignore_eos": True},
    "sglang": {"ignore_eos": True},
    "llamacpp": {"ignore_eos": True, "cache_prompt": True},
    "generic": {},
}

#: The gauge of KV memory in use (a share of 1) per kind.
KV_USAGE_GAUGE = {"vllm": "vllm:kv_cache_usage_perc", "sglang": "sglang:token_usage",
                  "llamacpp": "llamacpp:kv_cache_usage_ratio"}
#: Counters of prompt tokens served from the prefix cache, per kind.
CACHED_COUNTER = {"vllm": "vllm:prefix_cache_hits", "sglang": "sglang:cached_tokens",
                  "llamacpp": "llamacpp:prompt_tokens_cached"}
EMULATOR_KV = "basin_emulator_decode_kv_tokens"
#: A histogram of each request's decode time (first token to last) by the
#: engine's own clock: read around calls when the stream's arrival times
#: cannot time the decode (a lagging API server sends tokens in bursts).
DECODE_TIME_HISTOGRAM = {"vllm": "vllm:request_decode_time_seconds"}


@dataclass
class Declared:
    """Figures the engine states about itself; ``sources`` says where each came from."""

    model: str | None = None
    context_tokens: int | None = None
    page_tokens: int | None = None
    kv_tokens: int | None = None
    prefix_cache_tokens: int | None = None
    chunk_tokens: int | None = None
    max_running_requests: int | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, value: Any, source: str) -> None:
        if isinstance(value, bool) or value is None:
            return
        try:
            number = int(value)
        except (TypeError, ValueError):
            return
        if number > 0 and getattr(self, name) is None:
            setattr(self, name, number)
            self.sources[name] = source

    def record(self) -> dict[str, object]:
        names = ("model", "context_tokens", "page_tokens", "kv_tokens", "prefix_cache_tokens", "chunk_tokens",
                 "max_running_requests")
        out: dict[str, object] = {n: getattr(self, n) for n in names if getattr(self, n) is not None}
        out["sources"] = dict(self.sources)
        return out


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text as ``{sample name: [(labels, value), ...]}``; bad text gives what parsed."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except ValueError:
        pass
    return out


def metric_sum(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    """Sum of a series over its labels (``name`` or ``name_total``); None when absent."""
    for candidate in (name, name + "_total"):
        if candidate in metrics:
            return sum(v for _, v in metrics[candidate])
    return None


def metric_mean(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    rows = metrics.get(name)
    return sum(v for _, v in rows) / len(rows) if rows else None


async def scrape(client: EngineClient) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, text = await client.get_text("/metrics")
    return parse_metrics(text) if status == 200 else {}


async def declared(client: EngineClient, kind: str) -> Declared:
    """What the engine at ``client`` says about itself (every endpoint tried is optional)."""
    out = Declared()
    models = await client.get_json("/v1/models")
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        first = models["data"][0]
        if isinstance(first, dict):
            if isinstance(first.get("id"), str):
                out.model = first["id"]
                out.sources["model"] = "/v1/models"
            out.set("context_tokens", first.get("max_model_len"), "/v1/models max_model_len")
    if kind in ("sglang", "generic"):
        for path in ("/get_server_info", "/server_info"):
            info = await client.get_json(path)
            if isinstance(info, dict):
                out.set("context_tokens", info.get("context_length"), f"{path} context_length")
                out.set("kv_tokens", info.get("max_total_num_tokens"), f"{path} max_total_num_tokens")
                out.set("chunk_tokens", info.get("chunked_prefill_size"), f"{path} chunked_prefill_size")
                out.set("page_tokens", info.get("page_size"), f"{path} page_size")
                out.set("max_running_requests", info.get("max_running_requests"), f"{path} max_running_requests")
                break
    if kind in ("llamacpp", "generic"):
        props = await client.get_json("/props")
        if isinstance(props, dict):
            settings = props.get("default_generation_settings")
            n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
            slots = props.get("total_slots")
            out.set("context_tokens", n_ctx, "/props default_generation_settings.n_ctx (per slot)")
            out.set("max_running_requests", slots, "/props total_slots")
            if isinstance(n_ctx, int) and isinstance(slots, int):
                out.set("kv_tokens", n_ctx * slots, "/props n_ctx x total_slots")
                out.set("prefix_cache_tokens", n_ctx * slots, "/props n_ctx x total_slots (one prompt a slot)")
            out.set("page_tokens", 1, "llama.cpp reuses a slot's prompt token by token")
    if kind in ("vllm", "generic"):
        await _vllm_scheduler(client, out)
    metrics = await scrape(client)
    for _labels, _value in metrics.get("vllm:cache_config_info", []):
        blocks, size = _labels.get("num_gpu_blocks"), _labels.get("block_size")
        if blocks and size and blocks.isdigit() and size.isdigit():
            out.set("page_tokens", int(size), "vllm:cache_config_info block_size")
            out.set("prefix_cache_tokens", int(blocks) * int(size),
                    "vllm:cache_config_info num_gpu_blocks x block_size")
    emu_kv = metric_sum(metrics, EMULATOR_KV)
    if emu_kv:
        out.set("kv_tokens", emu_kv, EMULATOR_KV)
    elif kind == "vllm" and out.prefix_cache_tokens:
        out.set("kv_tokens", out.prefix_cache_tokens,
                "vllm:cache_config_info (running requests and the prefix cache share one pool)")
    if kind == "sglang" and out.kv_tokens:
        pool = metric_sum(metrics, "sglang:max_total_num_tokens")
        out.set("prefix_cache_tokens", pool, "sglang:max_total_num_tokens")
    return out


#: vLLM's development endpoint of its whole config (served with VLLM_SERVER_DEV_MODE=1).
VLLM_SERVER_INFO = "/server_info?config_format=json"


async def _vllm_scheduler(client: EngineClient, out: Declared) -> None:
    """vLLM's scheduler figures from its development ``/server_info``, where it serves one."""
    info = await client.get_json(VLLM_SERVER_INFO)
    config = info.get("vllm_config") if isinstance(info, dict) else None
    sched = config.get("scheduler_config") if isinstance(config, dict) else None
    if not isinstance(sched, dict):
        return
    where = "/server_info vllm_config.scheduler_config"
    if sched.get("enable_chunked_prefill") is not False:
        budget = sched.get("max_num_scheduled_tokens")
        name = "max_num_scheduled_tokens"
        if budget is None:
            budget, name = sched.get("max_num_batched_tokens"), "max_num_batched_tokens"
        out.set("chunk_tokens", budget, f"{where}.{name} (the per-step token budget)")
    running = sched.get("max_num_active_seqs")
    name = "max_num_active_seqs"
    if running is None:
        running, name = sched.get("max_num_seqs"), "max_num_seqs"
    out.set("max_running_requests", running, f"{where}.{name}")
