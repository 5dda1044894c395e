"""Engine adapters: /metrics parsing per engine, priority and affinity mapping, feature probes, the poller.

The fixtures are /metrics texts in each engine's own exposition style: vLLM V1
with two DP engines (prometheus_client, `_total` counters and `_created`
series), an SGLang PD decode server with two DP ranks and an SGLang PD prefill
server (multiprocess mode), and llama-server built with --metrics.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from tests.support.local_app import start_app

from basin.errors import BasinInputError
from basin.gateway.adapters import ENGINES, make_adapter
from basin.gateway.adapters.base import EngineAdapter
from basin.gateway.exposition import MetricsError
from basin.gateway.poller import MetricsPoller
from basin.gateway.snapshot import EngineSnapshot

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def set_values(text: str, changes: dict[str, float]) -> str:
    """Rewrite the value of every sample line starting with a key (name plus the start of its labels)."""
    out = []
    for line in text.splitlines():
        for prefix, value in changes.items():
            if line.startswith(prefix):
                line = f"{line.rsplit(' ', 1)[0]} {value!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def drop(text: str, *names: str) -> str:
    """Remove every series (sample, HELP and TYPE lines) of the given wire names."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 3 and parts[2] in names:
                continue
        elif line.split("{")[0].split(" ")[0] in names:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# vLLM


def test_vllm_two_engines_summed():
    snap = make_adapter("vllm").parse_metrics(fixture("vllm_v1_dp2.txt"), 10.0)
    assert isinstance(snap, EngineSnapshot)
    assert snap.at_s == 10.0
    # First scrape: cumulative (900k + 500k) / (1.2M + 0.8M).
    assert snap.hit_rate == pytest.approx(0.7)
    assert snap.queue_requests == 3 + 1
    assert snap.running_requests == 12 + 10
    assert snap.kv_used_fraction == pytest.approx((0.62 + 0.58) / 2)
    assert snap.decode_wait_requests == 0
    assert snap.cache_capacity_tokens == 2 * 27650 * 16
    assert "vllm:prefix_cache_hits_total" in snap.found
    assert "vllm:kv_cache_usage_perc" in snap.found
    assert snap.as_dict()["hit_rate"] == pytest.approx(0.7)


def test_vllm_hit_rate_is_over_the_tokens_since_the_previous_scrape():
    adapter = make_adapter("vllm")
    first = fixture("vllm_v1_dp2.txt")
    adapter.parse_metrics(first, 0.0)
    second = set_values(first, {
        'vllm:prefix_cache_hits_total{engine="0"': 950_000.0,
        'vllm:prefix_cache_queries_total{engine="0"': 1_300_000.0,
        'vllm:prefix_cache_hits_total{engine="1"': 530_000.0,
        'vllm:prefix_cache_queries_total{engine="1"': 840_000.0,
        'vllm:num_requests_waiting{engine="0"': 9.0,
    })
    snap = adapter.parse_metrics(second, 5.0)
    assert snap.hit_rate == pytest.approx((50_000 + 30_000) / (100_000 + 40_000))
    assert snap.queue_requests == 10
    # No tokens since: unknown, not zero.
    assert math.isnan(adapter.parse_metrics(second, 10.0).hit_rate)
    assert adapter.parse_metrics(second, 10.0).as_dict()["hit_rate"] is None


def test_vllm_counter_reset_of_one_engine_counts_its_new_value():
    adapter = make_adapter("vllm")
    first = fixture("vllm_v1_dp2.txt")
    adapter.parse_metrics(first, 0.0)
    restarted = set_values(first, {
        'vllm:prefix_cache_hits_total{engine="0"': 950_000.0,
        'vllm:prefix_cache_queries_total{engine="0"': 1_300_000.0,
        'vllm:prefix_cache_hits_total{engine="1"': 5_000.0,  # engine 1 restarted
        'vllm:prefix_cache_queries_total{engine="1"': 20_000.0,
    })
    snap = adapter.parse_metrics(restarted, 5.0)
    assert snap.hit_rate == pytest.approx((50_000 + 5_000) / (100_000 + 20_000))


def test_vllm_old_aliases_and_counters_without_total():
    text = """\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
# HELP vllm:gpu_prefix_cache_queries GPU prefix cache queries, in terms of number of queried blocks.
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries{model_name="m"} 400
# HELP vllm:gpu_prefix_cache_hits GPU prefix cache hits, in terms of number of cached blocks.
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits{model_name="m"} 100
vllm:num_requests_waiting{model_name="m"} 2
vllm:num_requests_running{model_name="m"} 5
"""
    snap = make_adapter("vllm").parse_metrics(text, 1.0)
    assert snap.kv_used_fraction == pytest.approx(0.25)
    assert snap.hit_rate == pytest.approx(0.25)
    assert snap.queue_requests == 2 and snap.running_requests == 5
    assert snap.cache_capacity_tokens is None
    assert "vllm:gpu_prefix_cache_hits_total" in snap.found  # the parser names counter samples x_total


def test_vllm_missing_series_fall_back_to_unknown():
    text = drop(
        fixture("vllm_v1_dp2.txt"),
        "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    )
    text = text.replace('num_gpu_blocks="27650"', 'num_gpu_blocks="None"')
    snap = make_adapter("vllm").parse_metrics(text, 1.0)
    assert math.isnan(snap.kv_used_fraction)
    assert math.isnan(snap.hit_rate)
    assert snap.cache_capacity_tokens is None
    assert snap.running_requests == 22
    assert "vllm:kv_cache_usage_perc" not in snap.found


# ---------------------------------------------------------------------------
# SGLang


def test_sglang_pd_decode_server():
    snap = make_adapter("sglang").parse_metrics(fixture("sglang_pd_decode.txt"), 3.0)
    assert snap.decode_wait_requests == (5 + 3) + (1 + 2)  # prealloc + transfer, both DP ranks
    assert snap.running_requests == 48 + 52
    assert snap.queue_requests == 2
    assert snap.kv_used_fraction == pytest.approx((0.91 + 0.87) / 2)
    assert snap.cache_capacity_tokens == 1_000_000
    assert snap.hit_rate == 0.0  # the decode side computes no prefix: 0 cached of 2.4M
    assert "sglang:num_decode_prealloc_queue_reqs" in snap.found
    assert "sglang:num_decode_transfer_queue_reqs" in snap.found


def test_sglang_pd_prefill_server():
    adapter = make_adapter("sglang")
    first = fixture("sglang_pd_prefill.txt")
    snap = adapter.parse_metrics(first, 0.0)
    assert snap.hit_rate == pytest.approx(3_100_000 / 5_000_000)
    assert snap.queue_requests == 14 and snap.running_requests == 6
    assert snap.decode_wait_requests == 0
    assert snap.cache_capacity_tokens == 800_000
    second = set_values(first, {
        "sglang:prompt_tokens_total{": 5_100_000.0,
        "sglang:cached_tokens_total{": 3_190_000.0,
    })
    assert adapter.parse_metrics(second, 5.0).hit_rate == pytest.approx(0.9)
    restarted = set_values(first, {"sglang:prompt_tokens_total{": 1000.0,
                                   "sglang:cached_tokens_total{": 250.0})
    assert adapter.parse_metrics(restarted, 10.0).hit_rate == pytest.approx(0.25)


def test_sglang_falls_back_to_the_hit_rate_gauge_without_counters():
    text = drop(fixture("sglang_pd_prefill.txt"), "sglang:cached_tokens_total", "sglang:prompt_tokens_total")
    snap = make_adapter("sglang").parse_metrics(text, 1.0)
    assert snap.hit_rate == pytest.approx(0.64)
    assert "sglang:cache_hit_rate" in snap.found
    assert "sglang:cached_tokens_total" not in snap.found


def test_sglang_missing_capacity_and_usage():
    text = drop(fixture("sglang_pd_prefill.txt"), "sglang:max_total_num_tokens", "sglang:token_usage")
    snap = make_adapter("sglang").parse_metrics(text, 1.0)
    assert snap.cache_capacity_tokens is None
    assert math.isnan(snap.kv_used_fraction)


# ---------------------------------------------------------------------------
# llama.cpp


def test_llamacpp_hit_rate_adds_cached_tokens_back():
    adapter = make_adapter("llamacpp")
    first = fixture("llamacpp_b11434.txt")
    snap = adapter.parse_metrics(first, 0.0)
    # prompt_tokens_total excludes reused tokens: hit rate = cached / (cached + computed).
    assert snap.hit_rate == pytest.approx(1115 / (1115 + 787))
    assert snap.running_requests == 2
    assert snap.queue_requests == 1
    assert math.isnan(snap.kv_used_fraction)
    assert snap.cache_capacity_tokens is None
    assert snap.decode_wait_requests == 0
    second = set_values(first, {"llamacpp:prompt_tokens_total": 827,
                                "llamacpp:prompt_tokens_cached_total": 1475})
    assert adapter.parse_metrics(second, 5.0).hit_rate == pytest.approx(360 / 400)
    # The server restarted: the counters start again from zero.
    restarted = set_values(first, {"llamacpp:prompt_tokens_total": 100,
                                   "llamacpp:prompt_tokens_cached_total": 300})
    assert adapter.parse_metrics(restarted, 10.0).hit_rate == pytest.approx(0.75)


def test_llamacpp_older_build_without_cached_counter():
    text = drop(fixture("llamacpp_b11434.txt"), "llamacpp:prompt_tokens_cached_total")
    text += "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.4\n"
    snap = make_adapter("llamacpp").parse_metrics(text, 1.0)
    assert math.isnan(snap.hit_rate)
    assert snap.kv_used_fraction == pytest.approx(0.4)
    assert snap.running_requests == 2


# ---------------------------------------------------------------------------
# Bad texts


@pytest.mark.parametrize("engine", ["sglang", "vllm", "llamacpp"])
@pytest.mark.parametrize("text", [
    "<html><head><title>404 Not Found</title></head><body>nope</body></html>\n",
    '{"detail": "Not Found"}',
    "Internal Server Error",
])
def test_garbage_is_a_metrics_error(engine: str, text: str):
    with pytest.raises(MetricsError, match=f"{engine}: .*not Prometheus text exposition"):
        make_adapter(engine).parse_metrics(text, 1.0)


def test_empty_and_wrong_engine_texts_name_what_is_missing():
    with pytest.raises(MetricsError, match="sglang: the /metrics response is empty.*--enable-metrics"):
        make_adapter("sglang").parse_metrics("  \n", 1.0)
    with pytest.raises(MetricsError, match=r"sglang: none of the expected series \(sglang:num_queue_reqs"):
        make_adapter("sglang").parse_metrics(fixture("vllm_v1_dp2.txt"), 1.0)
    with pytest.raises(MetricsError, match="llamacpp: none of the expected.*--metrics"):
        make_adapter("llamacpp").parse_metrics(fixture("sglang_pd_decode.txt"), 1.0)
    with pytest.raises(MetricsError, match="openai"):
        make_adapter("openai").parse_metrics(fixture("vllm_v1_dp2.txt"), 1.0)
    assert issubclass(MetricsError, ValueError)


def test_malformed_expected_line_is_an_error_and_keeps_counter_state():
    adapter = make_adapter("llamacpp")
    first = fixture("llamacpp_b11434.txt")
    adapter.parse_metrics(first, 0.0)
    with pytest.raises(MetricsError, match="llamacpp: malformed"):
        broken = first.replace("llamacpp:requests_deferred 1", "llamacpp:requests_deferred one")
        adapter.parse_metrics(broken, 1.0)
    with pytest.raises(MetricsError):
        adapter.parse_metrics("garbage", 2.0)
    second = set_values(first, {"llamacpp:prompt_tokens_total": 827,
                                "llamacpp:prompt_tokens_cached_total": 1475})
    assert adapter.parse_metrics(second, 3.0).hit_rate == pytest.approx(0.9)  # deltas still against scrape 1


# ---------------------------------------------------------------------------
# Priority, affinity, construction


def test_priority_mapping_per_engine_and_direction():
    assert make_adapter("vllm").priority_fields(0) == {"priority": 0}
    assert make_adapter("vllm").priority_fields(3) == {"priority": 3}
    assert make_adapter("sglang").priority_fields(3) == {"priority": -3}  # higher value first
    assert make_adapter("sglang", low_priority_first=True).priority_fields(3) == {"priority": 3}
    assert make_adapter("sglang", low_priority_first=False).priority_fields(0) == {"priority": 0}
    assert make_adapter("llamacpp").priority_fields(3) == {}
    assert make_adapter("openai").priority_fields(3) == {}
    # More urgent (lower rank) must be served first under each engine's convention.
    sg = make_adapter("sglang")
    assert sg.priority_fields(1)["priority"] > sg.priority_fields(2)["priority"]
    vl = make_adapter("vllm")
    assert vl.priority_fields(1)["priority"] < vl.priority_fields(2)["priority"]
    assert make_adapter("sglang").priority_field_supported and make_adapter("vllm").priority_field_supported
    assert not make_adapter("llamacpp").priority_field_supported
    assert not make_adapter("openai").priority_field_supported
    for engine in ENGINES:
        with pytest.raises(ValueError):
            make_adapter(engine).priority_fields(-1)


def test_disable_priority_drops_the_field():
    adapter = make_adapter("vllm")
    adapter.disable_priority("HTTP 400: priority requires --scheduling-policy priority")
    assert adapter.priority_fields(2) == {}
    assert adapter.priority_enabled is False
    assert "scheduling-policy" in (adapter.priority_disabled_reason or "")


def test_affinity_per_engine():
    assert make_adapter("sglang").affinity_headers("s-1") == {"X-SMG-Routing-Key": "s-1"}
    assert make_adapter("sglang").affinity_body("s-1") == {}
    assert make_adapter("vllm").affinity_body("s-1") == {"session_id": "s-1"}
    assert make_adapter("vllm").affinity_headers("s-1") == {}
    for engine in ("llamacpp", "openai"):
        assert make_adapter(engine).affinity_headers("s-1") == {}
        assert make_adapter(engine).affinity_body("s-1") == {}


def test_make_adapter():
    for engine in ENGINES:
        adapter = make_adapter(engine)
        assert isinstance(adapter, EngineAdapter)
        assert adapter.name == engine
    assert make_adapter(" SGLang ").name == "sglang"
    with pytest.raises(BasinInputError) as err:
        make_adapter("tgi")
    message = str(err.value)
    assert "engine" in message and "tgi" in message
    for engine in ENGINES:
        assert engine in message


def test_each_adapter_keeps_its_own_counters():
    a, b = make_adapter("llamacpp"), make_adapter("llamacpp")
    text = fixture("llamacpp_b11434.txt")
    a.parse_metrics(text, 0.0)
    assert math.isnan(a.parse_metrics(text, 1.0).hit_rate)
    assert b.parse_metrics(text, 1.0).hit_rate == pytest.approx(1115 / 1902)


# ---------------------------------------------------------------------------
# A tiny engine on loopback


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve(routes: dict[str, Handler]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    return await start_app(app)


def json_handler(payload: object, status: int = 200) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(payload, status=status)

    return handle


def text_handler(text: str, status: int = 200) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(text=text, status=status, content_type="text/plain")

    return handle


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(engine: str, routes: dict[str, Handler], **kw: object) -> tuple[EngineAdapter, list[str]]:
    async def main() -> tuple[EngineAdapter, list[str]]:
        runner, base = await serve(routes)
        try:
            adapter = make_adapter(engine, **kw)  # type: ignore[arg-type]
            async with aiohttp.ClientSession() as session:
                warnings = await adapter.check_features(session, base + "/v1/")
            return adapter, warnings
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_sglang_probe_reads_the_flags():
    info = {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True,
            "version": "0.5.9"}
    adapter, warnings = check("sglang", {"/get_server_info": json_handler(info)})
    assert warnings == []
    assert adapter.priority_enabled is True
    assert adapter.priority_fields(4) == {"priority": 4}  # direction discovered from the server


def test_sglang_probe_warns_when_priority_is_off_and_follows_the_server():
    adapter, warnings = check(
        "sglang",
        {"/get_server_info": json_handler({}, status=404),
         "/server_info": json_handler({"server_args": {"enable_priority_scheduling": False,
                                                       "schedule_low_priority_values_first": False}})},
        low_priority_first=True,
    )
    text = " ".join(warnings)
    assert "--enable-priority-scheduling" in text
    assert "following the server" in text
    assert adapter.priority_enabled is False
    assert adapter.priority_fields(1) == {}


def test_sglang_probe_never_raises_when_the_server_is_down():
    async def main() -> list[str]:
        async with aiohttp.ClientSession() as session:
            return await make_adapter("sglang").check_features(session, f"http://127.0.0.1:{free_port()}")

    warnings = asyncio.run(main())
    assert len(warnings) == 1
    assert "cannot verify priority scheduling" in warnings[0]


def test_vllm_probe_warns_about_the_policy_and_prefix_caching():
    _, warnings = check("vllm", {"/metrics": text_handler(fixture("vllm_v1_dp2.txt"))})
    assert len(warnings) == 1 and "--scheduling-policy priority" in warnings[0]
    no_prefix = drop(fixture("vllm_v1_dp2.txt"), "vllm:prefix_cache_queries_total")
    _, warnings = check("vllm", {"/metrics": text_handler(no_prefix)})
    assert len(warnings) == 2 and "prefix caching" in warnings[1]


def test_llamacpp_probe_reads_props_and_warns_without_metrics():
    props = {"default_generation_settings": {"n_ctx": 4096, "params": {}}, "total_slots": 2,
             "model_path": "gemma-3-270m-q4_k_m.gguf"}
    adapter, warnings = check("llamacpp", {
        "/props": json_handler(props),
        "/metrics": text_handler("This server does not support metrics endpoint.", status=501),
    })
    assert adapter.props == {"total_slots": 2, "n_ctx": 4096}  # type: ignore[attr-defined]
    text = " ".join(warnings)
    assert "no per-request priority" in text
    assert "start llama-server with --metrics" in text
    adapter, warnings = check("llamacpp", {
        "/props": json_handler(props), "/metrics": text_handler(fixture("llamacpp_b11434.txt"))})
    assert len(warnings) == 1


def test_openai_probe_warns():
    _, warnings = check("openai", {})
    assert len(warnings) == 1 and "no engine metrics" in warnings[0]


# ---------------------------------------------------------------------------
# The poller


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_poller_good_then_failing_scrapes_keep_the_latest():
    state: dict[str, object] = {"mode": "ok"}
    good = fixture("llamacpp_b11434.txt")

    async def metrics(request: web.Request) -> web.StreamResponse:
        if state["mode"] == "500":
            return web.Response(text="boom", status=500)
        if state["mode"] == "slow":
            release = state["release"]
            assert isinstance(release, asyncio.Event)
            await release.wait()  # held past the poller's timeout, let go before shutdown
        if state["mode"] == "garbage":
            return web.Response(text="<html>oops</html>")
        return web.Response(text=good)

    async def main() -> None:
        state["release"] = asyncio.Event()
        runner, base = await serve({"/metrics": metrics})
        clock = FakeClock()
        try:
            async with aiohttp.ClientSession() as session:
                poller = MetricsPoller(make_adapter("llamacpp"), session, base + "/metrics",
                                       interval_s=0.05, timeout_s=0.3, clock=clock)
                assert poller.stale_s(clock()) == math.inf
                snap = await poller.scrape_once()
                assert snap is not None and poller.latest is snap
                assert snap.at_s == 100.0 and poller.failures == 0 and poller.last_error is None
                assert poller.stale_s(101.5) == pytest.approx(1.5)

                state["mode"] = "500"
                clock.now = 105.0
                assert await poller.scrape_once() is None
                assert poller.failures == 1 and "HTTP 500" in (poller.last_error or "")
                assert poller.latest is snap
                assert poller.stale_s(clock()) == pytest.approx(5.0)

                state["mode"] = "slow"
                clock.now = 110.0
                assert await poller.scrape_once() is None
                assert poller.failures == 2 and "timed out" in (poller.last_error or "")
                assert poller.latest is snap
                assert poller.stale_s(clock()) == pytest.approx(10.0)

                state["mode"] = "garbage"
                assert await poller.scrape_once() is None
                assert poller.failures == 3 and "not Prometheus" in (poller.last_error or "")

                state["mode"] = "ok"
                clock.now = 115.0
                again = await poller.scrape_once()
                assert again is not None and poller.latest is again
                assert poller.failures == 0 and poller.last_error is None
                assert poller.stale_s(clock()) == 0.0
        finally:
            release = state["release"]
            assert isinstance(release, asyncio.Event)
            release.set()
            await runner.cleanup()

    asyncio.run(main())


def test_poller_connection_refused():
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            poller = MetricsPoller(make_adapter("vllm"), session, f"http://127.0.0.1:{free_port()}/metrics",
                                   timeout_s=1.0)
            assert await poller.scrape_once() is None
            assert await poller.scrape_once() is None
            assert poller.failures == 2
            assert poller.latest is None and poller.stale_s(0.0) == math.inf
            assert "Connect" in (poller.last_error or "")

    asyncio.run(main())


def test_poller_run_loops_until_cancelled_and_returns_without_url():
    hits = {"n": 0}

    async def metrics(request: web.Request) -> web.StreamResponse:
        hits["n"] += 1
        return web.Response(text=fixture("sglang_pd_decode.txt"))

    async def main() -> None:
        runner, base = await serve({"/metrics": metrics})
        try:
            async with aiohttp.ClientSession() as session:
                idle = MetricsPoller(make_adapter("sglang"), session, None)
                await asyncio.wait_for(idle.run(), timeout=1.0)
                assert await idle.scrape_once() is None

                poller = MetricsPoller(make_adapter("sglang"), session, base + "/metrics", interval_s=0.02)
                task = asyncio.create_task(poller.run())
                for _ in range(200):
                    if hits["n"] >= 3:
                        break
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert hits["n"] >= 3
                assert poller.latest is not None and poller.latest.decode_wait_requests == 11
                assert poller.scrapes >= 3
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_poller_rejects_nonsense_intervals():
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(ValueError):
                MetricsPoller(make_adapter("vllm"), session, "http://127.0.0.1:1/metrics", interval_s=0)

    asyncio.run(main())
