"""The engine's lock and reservation balance on small runs that stress the
caches: every lock in a prefix cache belongs to a live request or pin, every
idle decode reservation to a request that has not joined yet."""

from __future__ import annotations

import numpy as np
import pytest

from basin.catalog import load_deployment, load_hardware
from basin.policy.basin import BasinPolicy
from basin.policy.continuum import ContinuumPolicy
from basin.policy.crossflow import CrossflowPolicy
from basin.policy.hicache import HiCachePolicy
from basin.sim.engine import SimConfig, Simulator
from basin.workload.arrivals import SessionArrival
from basin.workload.records import Call, Session


def _sessions(n: int, seed: int) -> list[Session]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = int(rng.integers(3000, 12_000))
        calls = []
        for j in range(int(rng.integers(4, 12))):
            new = prompt if j == 0 else int(rng.integers(100, 3000))
            if j:
                prompt = calls[-1].prompt_tokens + calls[-1].output_tokens + new
            calls.append(Call(prompt, new, int(rng.integers(20, 600)), float(rng.exponential(3.0))))
        out.append(Session(f"s{i}", tuple(calls), shared_prefix_tokens=1500, prefix_group=f"g{i % 3}"))
    return out


def _config(deployment: str, n: int, rate_per_min: float, duration_s: float, seed: int,
            pool_tokens: int, kv_tokens: int, **kw) -> SimConfig:
    dep = load_deployment(deployment)
    hw = load_hardware(dep.hardware)
    hw = hw.model_copy(update={
        "prefill": hw.prefill.model_copy(update={"prefix_cache_tokens": pool_tokens}),
        "decode": hw.decode.model_copy(update={"kv_tokens": kv_tokens}),
    })
    sessions = _sessions(n, seed)
    rng = np.random.default_rng(seed + 1)
    arrivals, t = [], 0.0
    while True:
        t += float(rng.exponential(60.0 / rate_per_min))
        if t >= duration_s:
            break
        arrivals.append(SessionArrival(t, sessions[int(rng.integers(n))], "base"))
    return SimConfig(hw, dep, arrivals, duration_s, **kw)


class BalanceCheck:
    """Checks, every simulated minute and at the end, that the caches' lock
    counts and the decode instances' idle reservations are exactly what the
    live requests and pins hold, and that the loads the routers read are
    what the instances' queues hold (ROUTER-LOAD)."""

    def __init__(self) -> None:
        self.pins_seen = 0

    def __call__(self, sim: Simulator, minute: int) -> None:
        cluster = sim.cluster
        locks = [0] * len(cluster.prefills)
        idle = [0] * len(cluster.decodes)
        for s in sim.sessions:
            req = s.inflight
            if req is not None:
                if req.match is not None:
                    locks[req.prefill] += 1
                dec = cluster.decodes[req.decode]
                if req.reserved and req not in dec.batch and req not in dec.pending:
                    idle[req.decode] += 1 * req.reserved
            if s.pin is not None:
                locks[s.pin_instance] += 1
                self.pins_seen += 1
        for p in cluster.prefills:
            p.cache.check(lock_handles=locks[p.index])
            p.check()
        for d in cluster.decodes:
            d.check(reserved_idle=idle[d.index])


def _run(cfg: SimConfig, policy) -> tuple[Simulator, dict, BalanceCheck]:
    check = BalanceCheck()
    sim = Simulator(cfg, policy, on_sample=check)
    result = sim.run()
    check(sim, -1)
    calls = result.calls
    assert len(calls["session_uid"]) > 20
    assert np.all(calls["cached_tokens"] + calls["loaded_tokens"] + calls["uncached_tokens"] == calls["prompt_tokens"])
    return sim, result, check


@pytest.mark.parametrize("at_completion", [False, True])
def test_locks_balance_under_cache_pressure_with_a_host_tier(at_completion):
    cfg = _config("2P3D-h100-nvl", 40, 30.0, 600.0, seed=1, pool_tokens=120_000, kv_tokens=400_000,
                  reserve_at_prefill_completion=at_completion)
    sim, result, _ = _run(cfg, HiCachePolicy())
    stats = [p.cache.stats for p in sim.cluster.prefills]
    assert sum(s.evicted_device_tokens for s in stats) > 0 and sum(s.loaded_tokens for s in stats) > 0


def test_locks_balance_with_ttl_pins_and_ordered_queues():
    cfg = _config("1p2d-h100", 40, 30.0, 600.0, seed=2, pool_tokens=150_000, kv_tokens=600_000)
    sim, result, check = _run(cfg, ContinuumPolicy())
    assert check.pins_seen > 0


def test_locks_balance_when_decode_instances_borrow_prefill():
    cfg = _config("1p2d-h200", 40, 40.0, 600.0, seed=3, pool_tokens=150_000, kv_tokens=600_000)
    sim, _, _ = _run(cfg, CrossflowPolicy())
    assert sim.cluster.borrowing is not None and sim.cluster.borrowing.stats()["completed"] > 0


def test_locks_balance_with_decode_memory_lent_as_cache():
    cfg = _config("1p2d-h100", 40, 30.0, 600.0, seed=4, pool_tokens=100_000, kv_tokens=800_000)
    sim, _, _ = _run(cfg, BasinPolicy())
    assert sim.cluster.lent_tier is not None
