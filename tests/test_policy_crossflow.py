"""Crossflow: the lease's sizing rule, the borrowing mechanism on a hand-made
prefill backlog, and a small engine run with the engine's invariants."""

from __future__ import annotations

import numpy as np
import pytest

from basin.catalog import load_hardware
from basin.policy.base import BorrowSettings
from basin.policy.crossflow import CrossflowParams, CrossflowPolicy
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class
from basin.sim.borrow import BorrowConfig, PrefillBorrower, attach_borrowing
from basin.sim.cache import RadixCache
from basin.sim.decode import DecodeInstance
from basin.sim.events import EventLoop
from basin.sim.prefill import PrefillInstance
from basin.sim.requests import Callbacks, Request
from basin.sim.sessions import SessionState
from basin.workload.records import Call, Session
from test_sim_engine import CheckedSimulator, config, make_arrivals, make_sessions

HW = load_hardware("h200")


def _borrower(**kw) -> PrefillBorrower:
    loop = EventLoop()
    dec = DecodeInstance(0, HW.decode, HW.itl_slo_s, loop, lambda r: None, Callbacks())
    return PrefillBorrower(dec, HW.prefill, BorrowConfig(itl_slo_s=HW.itl_slo_s, **kw), loop, [])


def test_policy_declares_the_mechanism_and_its_parameters():
    assert policy_class("crossflow") is CrossflowPolicy
    p = CrossflowPolicy(CrossflowParams.from_mapping({"chunk_charge_s": 0.02}))
    assert p.needs.decode_prefill_borrowing == BorrowSettings(margin=0.1, chunk_charge_s=0.02,
                                                              min_chunk_tokens=256, step_token_budget=None)
    assert p.needs.required() == ("prefill on decode instances",)
    assert not p.needs.prefix_pins and not p.needs.decode_memory_lending
    assert CrossflowPolicy().needs.decode_prefill_borrowing == BorrowSettings()


def test_params_refuse_wrong_types_and_out_of_range_values():
    assert CrossflowParams(margin=0.999).margin == 0.999   # the sensitivity run of docs/results.md
    with pytest.raises(PolicyParamError, match="policy 'crossflow', parameter 'min_chunk_tokens'.*whole number"):
        CrossflowParams(min_chunk_tokens=256.0)
    with pytest.raises(PolicyParamError, match="parameter 'step_token_budget'.*whole number"):
        CrossflowParams(step_token_budget="8192")
    with pytest.raises(PolicyParamError, match="parameter 'margin'.*\\[0, 1\\)"):
        CrossflowParams(margin=1.0)
    with pytest.raises(PolicyParamError, match="parameter 'chunk_charge_s'"):
        CrossflowParams(chunk_charge_s=-0.01)
    with pytest.raises(PolicyParamError, match="parameter 'min_chunk_tokens'"):
        CrossflowParams(min_chunk_tokens=0)
    with pytest.raises(PolicyParamError, match="parameter 'step_token_budget'"):
        CrossflowParams(step_token_budget=0)
    with pytest.raises(PolicyParamError, match="parameter 'lease': unknown; known parameters: margin"):
        CrossflowParams.from_mapping({"lease": 3})


def test_update_params_changes_what_the_policy_needs_and_a_bad_update_keeps_it():
    p = CrossflowPolicy()
    p.update_params(margin=0.2, step_token_budget=4096)
    assert p.needs.decode_prefill_borrowing == BorrowSettings(margin=0.2, step_token_budget=4096)
    with pytest.raises(PolicyParamError, match="margin"):
        p.update_params(margin=-0.1)
    assert p.params == CrossflowParams(margin=0.2, step_token_budget=4096)


def test_chunk_keeps_the_mixed_step_within_the_lease_target():
    b = _borrower()
    for step_s, position in ((0.004, 0), (0.02, 30_000), (0.035, 100_000)):
        k = b.chunk_tokens(step_s, batch=10, position=position, remaining=10**6)
        assert k > 0 and k % 64 == 0
        assert step_s + HW.prefill.tokens_cost_s(k, position) <= 0.9 * HW.itl_slo_s + 1e-12
        # One more page would break the target (or the token budget).
        assert step_s + HW.prefill.tokens_cost_s(k + 64, position) > 0.9 * HW.itl_slo_s
    # No room under the SLO, or below the minimum chunk: no lease.
    assert b.chunk_tokens(0.046, batch=10, position=0, remaining=10**6) == 0
    assert b.chunk_tokens(0.0449, batch=10, position=0, remaining=10**6) == 0
    # A short remainder is taken whole.
    assert b.chunk_tokens(0.004, batch=10, position=0, remaining=100) == 100


def test_mixed_step_shares_the_token_budget_and_pays_the_chunk_charge():
    b = _borrower(step_token_budget=1000)
    assert b.chunk_tokens(0.004, batch=200, position=0, remaining=10**6) == 768  # 800 left, page-aligned
    free = _borrower().chunk_tokens(0.01, batch=10, position=0, remaining=10**6)
    charged = _borrower(chunk_charge_s=0.02).chunk_tokens(0.01, batch=10, position=0, remaining=10**6)
    assert 0 < charged < free


class _Bench:
    """One prefill and one decode instance wired the way the engine wires them."""

    def __init__(self, prompts: list[int], slo_margin: float = 0.1):
        self.loop = EventLoop()
        self.done: list[Request] = []
        self.pre = PrefillInstance(0, HW.prefill, RadixCache(10**7), self.loop, self._prefilled)
        self.dec = DecodeInstance(0, HW.decode, HW.itl_slo_s, self.loop, self._reserved, Callbacks())
        self.borrowing = attach_borrowing([self.dec], [self.pre], HW.prefill, HW.itl_slo_s, self.loop,
                                          {"margin": slo_margin})
        self.reqs = []
        for uid, prompt in enumerate(prompts):
            session = Session(f"s{uid}", (Call(prompt, prompt, 400),))
            s = SessionState(uid, session, "base", 0.0, 0, None)
            self.reqs.append(s.request(0, s.prompt_key(0), uid + 1, 0.0))

    def _reserved(self, req: Request) -> None:
        self.pre.enqueue(req)
        self.borrowing.queued(req)

    def _prefilled(self, req: Request) -> None:
        self.done.append(req)
        self.pre.release(req, self.loop.now)
        self.dec.join(req)

    def submit(self) -> None:
        for r in self.reqs:
            self.dec.request_memory(r)


def test_an_idle_decode_instance_prefills_a_waiting_request_within_the_slo():
    bench = _Bench([40_000, 20_000])
    bench.submit()
    first, second = bench.reqs
    assert not np.isnan(first.prefill_start_s)      # the prefill instance took the first
    assert not np.isnan(second.prefill_start_s)     # the decode instance borrowed the second
    bench.loop.run(60.0)
    stats = bench.borrowing.stats()
    assert stats["completed"] == 1 and stats["tokens"] == 20_000
    # The borrowed prefill finished before the prefill instance could have started it.
    assert second.prefill_end_s < first.prefill_end_s
    assert second.cached + second.loaded + second.uncached == second.prompt
    # Its prompt went into the prefill instance's cache like any other.
    assert bench.pre.cache.peek(second.key) >= 20_000 - 64
    bench.pre.cache.check()
    # No decode step, mixed or not, exceeded the ITL SLO.
    assert bench.dec.cum_viol == 0 and first.itl_violations == 0


def test_a_decode_instance_without_room_under_the_slo_does_not_borrow():
    bench = _Bench([40_000, 20_000], slo_margin=0.95)   # target 2.5 ms: below a bare decode step
    bench.submit()
    assert np.isnan(bench.reqs[1].prefill_start_s)
    bench.loop.run(60.0)
    assert bench.borrowing.stats()["leases"] == 0
    assert len(bench.done) == 2


def test_engine_run_with_borrowing_keeps_the_invariants():
    sessions = make_sessions(60, seed=21, calls=(8, 16))
    arrivals = make_arrivals(sessions, 40.0, 900.0, seed=22)
    cfg = config(arrivals, 900.0, deployment="1p2d-h200")
    sim = CheckedSimulator(cfg, CrossflowPolicy())
    result = sim.run()
    calls = result.calls
    assert np.all(calls["cached_tokens"] + calls["loaded_tokens"] + calls["uncached_tokens"] == calls["prompt_tokens"])
    assert np.all(calls["prefill_start_s"] < calls["first_token_s"])
    stats = sim.cluster.borrowing.stats()
    assert stats["tokens"] > 0 and stats["completed"] > 0
    assert stats["tokens"] <= calls["uncached_tokens"].sum() + 10**6  # (calls in flight at the end)
    with pytest.raises(ValueError):
        BorrowConfig.from_params(0.05, {"lease": 3})
