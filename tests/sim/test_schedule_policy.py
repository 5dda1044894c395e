"""The prefill queue's scheduling policy: SGLang's LPM (longest cached prefix
first while at most 128 wait, FCFS order above; matching refreshes LRU;
in-batch prefix caching) against the first-come default, and the field's
validation and refusal on a colocated (vLLM) deployment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.cli_helpers import run_basin

from basin.catalog import Deployment, HardwareProfile
from basin.errors import BasinInputError
from basin.sim.cache import RadixCache
from basin.sim.colocated import ColocatedCluster, ColocatedTopology
from basin.sim.events import CLIENT, EventLoop
from basin.sim.prefill import (
    IN_BATCH_DEPRIORITIZE_TOKENS,
    LPM_MAX_WAITING,
    PrefillInstance,
    lpm_order,
    shared_prefix_tokens,
)
from basin.sim.requests import Callbacks, Request

from .helpers import HW, request


def _instance(policy: str, *, chunk: int = 512, cache_tokens: int = 1 << 20,
              loop: EventLoop | None = None) -> tuple[PrefillInstance, list[Request]]:
    done: list[Request] = []
    profile = HW.prefill.model_copy(update={"schedule_policy": policy, "chunk_tokens": chunk})
    inst = PrefillInstance(0, profile, RadixCache(cache_tokens, page_tokens=64), loop or EventLoop(), done.append)
    return inst, done


def _cached(cache: RadixCache, key, now: float = 0.0) -> None:
    n = sum(k for _, k in key)
    assert cache.allocate(n)
    cache.insert(key, now, n)


def _drain(inst: PrefillInstance, done: list[Request], n: int) -> None:
    """Run until ``n`` requests finished, releasing each within 2 ms (its KV
    goes to decode, and its prompt into the cache)."""
    released: set[int] = set()
    while len(done) < n or len(released) < n:
        inst.loop.run(inst.loop.now + 0.002)
        for r in done:
            if id(r) not in released:
                inst.release(r, inst.loop.now)
                released.add(id(r))


def _start_order(inst: PrefillInstance, done: list[Request], reqs: list[Request]) -> list[int]:
    _drain(inst, done, len(reqs) + 1)  # the blocker too
    return [r.session for r in sorted(reqs, key=lambda r: (r.prefill_start_s, r.seq))]


def _blocked(policy: str, **kw) -> tuple[PrefillInstance, list[Request]]:
    """An instance busy with a 4096-token prompt for eight 512-token steps,
    so that what is queued meanwhile is ordered before anything starts."""
    inst, done = _instance(policy, **kw)
    inst.enqueue(request(900, 4096, seq=0))
    assert inst.busy and len(inst.running) == 1
    return inst, done


@pytest.mark.parametrize(("policy", "order"), [("fcfs", [1, 2, 3]), ("lpm", [3, 2, 1])])
def test_lpm_starts_the_longest_cached_prefix_first(policy, order):
    inst, done = _blocked(policy)
    _cached(inst.cache, [("a", 2048)])
    _cached(inst.cache, [("b", 1024)])
    reqs = [request(1, 1024, seq=1),
            request(2, 1536, seq=2, key=[("b", 1024), ("n2", 512)]),
            request(3, 2560, seq=3, key=[("a", 2048), ("n3", 512)])]
    for r in reqs:
        inst.enqueue(r)
    assert _start_order(inst, done, reqs) == order
    assert [r.cached for r in reqs] == [0, 1024, 2048]


def test_ties_keep_first_come_order():
    inst, done = _blocked("lpm")
    _cached(inst.cache, [("a", 1024)])
    reqs = [request(s, 1536, seq=s, key=[("a", 1024), (("own", s), 512)]) for s in (1, 2, 3)]
    for r in reversed(reqs):  # sequence numbers, not enqueue calls, are arrival order
        inst.enqueue(r)
    assert _start_order(inst, done, reqs) == [1, 2, 3]


def _cutoff_first_pick(waiting: int) -> int:
    """Queue ``waiting`` requests behind the blocker, only the last with a
    cached prefix; the session that starts first."""
    inst, done = _blocked("lpm")
    _cached(inst.cache, [("a", 2048)])
    for s in range(1, waiting):
        inst.enqueue(request(s, 512, seq=s))
    inst.enqueue(request(waiting, 2560, seq=waiting, key=[("a", 2048), ("n", 512)]))
    assert len(inst.queue) == waiting
    while len(inst.queue) == waiting:
        inst.loop.run(inst.loop.now + 0.01)
    started = [r for r in inst.running if r.session != 900]
    assert len(started) == 1
    return started[0].session


def test_lpm_sorts_at_the_cut_off_and_serves_first_come_above_it():
    assert _cutoff_first_pick(LPM_MAX_WAITING) == LPM_MAX_WAITING  # 128 wait: the cached one first
    assert _cutoff_first_pick(LPM_MAX_WAITING + 1) == 1  # 129 wait: first come


def test_above_the_cut_off_the_last_sort_stands_and_later_arrivals_queue_behind():
    inst, done = _blocked("lpm")
    _cached(inst.cache, [("a", 2048)])
    inst.enqueue(request(1, 512, seq=1))
    inst.enqueue(request(2, 2560, seq=2, key=[("a", 2048), ("n", 512)]))
    inst.loop.run(inst.loop.now + 0.02)  # a round sorts 2 before 1
    assert [e.req.session for e in sorted(inst.queue)] == [2, 1]
    for s in range(3, 3 + LPM_MAX_WAITING):
        inst.enqueue(request(s, 512, seq=s))
    inst.loop.run(inst.loop.now + 0.02)  # 130 wait: no round, the order stands
    assert [e.req.session for e in sorted(inst.queue)][:4] == [2, 1, 3, 4]


def test_matching_a_waiting_request_keeps_its_prefix_young():
    """Prefix a is older than z. An LPM round re-stamps a for its waiting
    request, so an allocation that must evict takes z; first-come matches
    nothing before a request starts, and a goes."""
    survivors = {}
    for policy in ("fcfs", "lpm"):
        inst, done = _instance(policy, chunk=256, cache_tokens=4096)
        _cached(inst.cache, [("a", 1024)], now=0.0)
        _cached(inst.cache, [("z", 1024)], now=0.5)
        inst.loop.run(1.0)
        inst.enqueue(request(900, 1024, seq=0))  # four steps of 256
        inst.enqueue(request(1, 2048, seq=1, key=[("a", 1024), ("n", 1024)]))
        inst.loop.run(inst.loop.now + 0.01)  # one step ends, the next begins with a round
        assert inst.running[0].session == 900 and len(inst.queue) == 1
        assert inst.cache.allocate(2048)  # 1024 free: one prefix must go
        survivors[policy] = (inst.cache.peek([("a", 1024)]), inst.cache.peek([("z", 1024)]))
    assert survivors == {"fcfs": (0, 1024), "lpm": (1024, 0)}


def test_lpm_ranking_counts_nothing_in_the_cache_statistics():
    inst, done = _blocked("lpm")
    _cached(inst.cache, [("a", 2048)])
    inst.enqueue(request(1, 2560, seq=1, key=[("a", 2048), ("n", 512)]))
    queried = inst.cache.stats.queried_tokens
    inst.loop.run(inst.loop.now + 0.02)  # rounds rank the waiting request
    assert inst.queue and inst.cache.stats.queried_tokens == queried
    _drain(inst, done, 2)
    assert inst.cache.stats.queried_tokens == queried + 2560  # counted once, when it started
    assert inst.cache.stats.matched_device_tokens == 2048


@pytest.mark.parametrize(("policy", "order"), [("fcfs", [1, 2, 3]), ("lpm", [1, 3, 2])])
def test_in_batch_prefix_caching_defers_a_request_sharing_an_uncached_prefix(policy, order):
    """1 and 2 share 1024 tokens nothing holds yet: under LPM 2 goes last, so
    that it finds the prefix 1 computes cached."""
    inst, done = _blocked(policy)
    reqs = [request(1, 1536, seq=1, key=[("s", 1024), ("n1", 512)]),
            request(2, 1536, seq=2, key=[("s", 1024), ("n2", 512)]),
            request(3, 1024, seq=3)]
    for r in reqs:
        inst.enqueue(r)
    assert _start_order(inst, done, reqs) == order
    if policy == "lpm":
        assert reqs[1].cached == 1024


def test_lpm_ignores_session_priorities():
    inst, done = _blocked("lpm")
    _cached(inst.cache, [("a", 2048)])
    low = request(1, 512, seq=1)
    low.prio = 0.0  # the policy's first choice
    high = request(2, 2560, seq=2, key=[("a", 2048), ("n", 512)])
    high.prio = 5.0
    inst.set_ordered(True)
    inst.enqueue(low)
    inst.enqueue(high)
    assert _start_order(inst, done, [low, high]) == [2, 1]


def test_lpm_order_is_stable_and_puts_deprioritised_last():
    assert lpm_order([0, 5, 5, 9, 3], [False, False, False, True, False]) == [1, 2, 4, 0, 3]


def test_shared_prefix_tokens():
    assert shared_prefix_tokens([("a", 100), ("b", 50)], [("a", 100), ("b", 20)]) == 120
    assert shared_prefix_tokens([("a", 100), ("b", 50)], [("a", 60), ("b", 50)]) == 60
    assert shared_prefix_tokens([("a", 100)], [("x", 100)]) == 0
    assert shared_prefix_tokens([("a", 100), ("b", 50)], [("a", 100), ("c", 50)]) == 100
    assert IN_BATCH_DEPRIORITIZE_TOKENS == 32


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=30), st.lists(st.booleans(), min_size=30, max_size=30))
def test_lpm_order_properties(matched, flags):
    deprioritized = flags[:len(matched)]
    order = lpm_order(matched, deprioritized)
    assert sorted(order) == list(range(len(matched)))
    ranks = [(deprioritized[i], -matched[i]) for i in order]
    assert ranks == sorted(ranks)  # not deprioritised first, then the most matched
    for k in range(len(order) - 1):
        if ranks[k] == ranks[k + 1]:
            assert order[k] < order[k + 1]  # ties in their standing order


# One request: (shared prefix id or None, shared tokens, own tokens).
_REQ = st.tuples(st.sampled_from([None, "p", "q", "r"]), st.integers(1, 24), st.integers(1, 24))


def _run(policy: str, spec: list[tuple[str | None, int, int]], warm: list[str]) -> list[tuple]:
    inst, done = _instance(policy, chunk=1024, cache_tokens=1 << 16)
    for name in warm:
        _cached(inst.cache, [(name, 24 * 64)])
    reqs = []
    for s, (shared, n_shared, n_own) in enumerate(spec, start=1):
        key = ([(shared, n_shared * 64)] if shared else []) + [(("own", s), n_own * 64)]
        reqs.append(request(s, sum(n for _, n in key), seq=s, key=key))
    # Arrivals a few milliseconds apart, so that queues form and rounds reorder them.
    for i, r in enumerate(reqs):
        inst.loop.at(0.002 * i, CLIENT, inst.enqueue, r)
    _drain(inst, done, len(reqs))
    inst.cache.check(lock_handles=0)
    for r in reqs:
        assert r.cached + r.loaded + r.uncached == r.prompt  # every prompt token accounted for once
        assert r.remaining == 0 and r.position == r.prompt
    return [(r.session, r.prefill_start_s, r.prefill_end_s, r.cached) for r in done]


@settings(max_examples=60, deadline=None)
@given(st.lists(_REQ, min_size=1, max_size=20), st.lists(st.sampled_from(["p", "q", "r"]), max_size=3))
def test_lpm_serves_every_request_once_conserving_tokens_deterministically(spec, warm):
    lpm = _run("lpm", spec, warm)
    assert lpm == _run("lpm", spec, warm)  # same input, same run
    fcfs = _run("fcfs", spec, warm)
    assert sorted(s for s, *_ in lpm) == sorted(s for s, *_ in fcfs) == list(range(1, len(spec) + 1))


def test_a_colocated_deployment_refuses_lpm():
    hw = HardwareProfile.model_validate(
        {**HW.model_dump(), "prefill": {**HW.prefill.model_dump(), "schedule_policy": "lpm"}})
    dep = Deployment(name="1C", hardware="h200", prefill_instances=1, decode_instances=1, host_ratio=0.0,
                     topology="colocated")
    with pytest.raises(BasinInputError, match="schedule_policy 'lpm'.*fcfs"):
        ColocatedCluster(hw, ColocatedTopology.of(dep, hw), Callbacks())


def test_the_profile_field_names_the_values_allowed():
    with pytest.raises(ValueError, match="'fcfs' or 'lpm'"):
        HW.prefill.model_validate({**HW.prefill.model_dump(), "schedule_policy": "sjf"})
    assert HW.prefill.schedule_policy == "fcfs"


def test_basin_run_refuses_a_bad_or_inapplicable_policy_in_one_line(capsys, tmp_path):
    code, _, err = run_basin(capsys, "run", "trap-1p1d", "--set", "engine.schedule_policy=sjf", "--no-plots",
                             "--out", str(tmp_path / "a"))
    assert code == 2 and "field 'engine.schedule_policy': expected one of 'fcfs' or 'lpm'" in err
    code, _, err = run_basin(capsys, "run", "trap-1p1d", "--set", "deployment=1C-h100-nvl", "--set",
                             "engine.schedule_policy=lpm", "--set", "duration_min=5", "--set", "measure_end_min=5",
                             "--no-plots", "--out", str(tmp_path / "b"))
    assert code == 2 and "colocated deployment is a vLLM server" in err and "Traceback" not in err
