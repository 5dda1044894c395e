"""Switching the policy mid-run re-applies the new policy's engine needs."""

from __future__ import annotations

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.experiments.runner import run_scenario
from basin.experiments.scenario import load_scenario
from basin.policy.base import BorrowSettings, EngineNeeds
from basin.sim.engine import switch_refusal

SHORT = ["duration_min=25", "measure_end_min=25"]


def _switch(to: str, at_min: float = 10.0) -> list[str]:
    return SHORT + [f'interventions=[{{"at_min": {at_min}, "switch_policy": "{to}"}}]']


def test_basin_switched_on_lends_decode_memory_after_the_switch() -> None:
    run = run_scenario(load_scenario("surge-1p3d", _switch("basin")), "hicache")
    lent = run.result.timeseries["decode_kv_lent_tokens"]
    assert lent[:10].max() == 0, "nothing is lent under hicache"
    assert lent[10:].max() > 1_000_000, "BASIN lends decode memory once switched on"


def test_a_run_without_the_switch_lends_nothing() -> None:
    run = run_scenario(load_scenario("surge-1p3d", SHORT), "hicache")
    assert run.result.timeseries["decode_kv_lent_tokens"].max() == 0


def test_reservation_order_follows_the_switch() -> None:
    """Calls issued before the switch reserve before prefill, after it at
    prefill completion; no call is reserved twice (memory balances)."""
    run = run_scenario(load_scenario("trap-1p1d", _switch("basin", 5.0) + ["surge.factor=1.0"]), "hicache")
    calls = run.result.calls
    assert len(calls["finished_s"]) > 0
    ts = run.result.timeseries
    assert np.all(ts["decode_kv_reserved_idle_tokens"] >= 0)


def test_borrowing_cannot_start_mid_run() -> None:
    with pytest.raises(BasinInputError, match="prefill on decode instances .* cannot start, stop or change mid-run"):
        run_scenario(load_scenario("surge-1p3d", _switch("crossflow")), "hicache")


def test_switch_refusal_rules() -> None:
    plain, borrow = EngineNeeds(), EngineNeeds(decode_prefill_borrowing=BorrowSettings())
    assert switch_refusal(plain, EngineNeeds(decode_memory_lending=True,
                                             reserve_decode_at_prefill_completion=True)) is None
    assert switch_refusal(borrow, borrow) is None
    assert switch_refusal(plain, borrow) is not None and switch_refusal(borrow, plain) is not None
