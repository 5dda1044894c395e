"""The engine registry: one list of engine names that make_adapter, the
config's ``engine`` field and the CLI's --engine help all read; and the
module layout around it (light to import, the old import path kept, no test
double in the package)."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest

from basin.errors import BasinInputError
from basin.gateway.adapters import ADAPTERS, ENGINES, adapter_class, engine_key, engines_help, make_adapter
from basin.gateway.adapters.base import EngineAdapter
from basin.gateway.config import GatewayConfig, load_gateway_config

FIXTURES = Path(__file__).parent / "fixtures"
SRC = Path(__file__).resolve().parents[2] / "src" / "basin"

#: A recorded /metrics text per engine that has metrics.
METRICS = {"sglang": "sglang_pd_prefill.txt", "vllm": "vllm_v1_dp2.txt", "llamacpp": "llamacpp_b11434.txt"}


def test_every_engine_name_resolves_to_its_adapter():
    assert ENGINES == tuple(ADAPTERS) and len(set(ENGINES)) == len(ENGINES) >= 4
    for name in ENGINES:
        cls = adapter_class(name)
        assert issubclass(cls, EngineAdapter) and cls is not EngineAdapter
        assert cls.name == name
        adapter = make_adapter(name)
        assert type(adapter) is cls
        assert make_adapter(f"  {name.upper()} ").name == name
        assert engine_key(name.title()) == name


def test_an_unknown_engine_names_the_known_ones():
    for bad in ("tgi", "", "sglang-router", None, 3):
        with pytest.raises(BasinInputError) as err:
            adapter_class(bad)  # type: ignore[arg-type]
        message = str(err.value)
        assert "field 'engine'" in message and f"unknown engine {bad!r}" in message
        assert f"expected one of {', '.join(ENGINES)}" in message
    with pytest.raises(BasinInputError, match="expected one of"):
        make_adapter("tgi", low_priority_first=True)


def test_engine_settings_reach_only_the_engines_that_use_them():
    assert make_adapter("sglang", low_priority_first=True).low_priority_first is True
    assert make_adapter("sglang").low_priority_first is False
    for name in ENGINES:
        make_adapter(name, low_priority_first=True)  # ignored where the engine has no such flag


def test_config_validation_reads_the_registry():
    assert typing.get_args(GatewayConfig.model_fields["engine"].annotation) == ENGINES
    for name in ENGINES:
        assert GatewayConfig(upstream="http://127.0.0.1:30000", engine=name, metrics_urls=()).engine == name
    with pytest.raises(BasinInputError) as err:
        load_gateway_config(upstream="http://127.0.0.1:30000", engine="tgi")
    for name in ENGINES:
        assert repr(name) in str(err.value)


def test_cli_engine_help_lists_the_registry():
    import inspect

    from basin.cli.gateway import gateway

    help_text = inspect.signature(gateway).parameters["engine"].default.help
    assert help_text.startswith(engines_help())
    for name in ENGINES:
        assert name in engines_help()
    assert engines_help().endswith(f" or {ENGINES[-1]}")


@pytest.mark.parametrize("name", sorted(METRICS))
def test_reports_cache_capacity_matches_what_a_scrape_gives(name: str):
    snap = make_adapter(name).parse_metrics((FIXTURES / METRICS[name]).read_text(), 1.0)
    assert (snap.cache_capacity_tokens is not None) == adapter_class(name).reports_cache_capacity
    assert not adapter_class("openai").reports_cache_capacity


def test_reading_the_engine_names_imports_no_http_stack():
    # Every `basin` command builds the gateway's --help, which lists the engines.
    code = ("import sys, basin.cli.app, basin.gateway.adapters; "
            "heavy = [m for m in ('aiohttp', 'prometheus_client', 'basin.gateway.adapters.base') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_package_holds_no_test_double():
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if "fake_upstream" in p.read_text(encoding="utf-8") or p.name == "fake_upstream.py"]
    assert offenders == []
