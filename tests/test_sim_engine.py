"""The simulator's invariants on small hand-made workloads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from basin.catalog import load_deployment, load_hardware
from basin.policy.base import Admission, ControlDecision, Policy
from basin.policy.hicache import HiCachePolicy
from basin.policy.registry import policy_class, policy_names
from basin.sim.cache import RadixCache
from basin.sim.decode import DecodeInstance
from basin.sim.engine import Intervention, SimConfig, Simulator
from basin.sim.events import EventLoop
from basin.sim.prefill import PrefillInstance
from basin.sim.requests import Callbacks, Request, shared_pieces
from basin.sim.sessions import SessionState
from basin.workload.arrivals import SessionArrival
from basin.workload.records import Call, Session


def make_sessions(n: int, seed: int, calls: tuple[int, int] = (5, 20)) -> list[Session]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(*calls))
        prompt = int(rng.integers(2000, 9000))
        seq = []
        for j in range(k):
            new = prompt if j == 0 else int(rng.integers(50, 2000))
            if j:
                prompt = seq[-1].prompt_tokens + seq[-1].output_tokens + new
            gap = float(rng.exponential(5.0)) if j < k - 1 else 0.0
            seq.append(Call(prompt, new, int(rng.integers(20, 700)), gap))
        out.append(Session(f"s{i}", tuple(seq), shared_prefix_tokens=1000, prefix_group="g"))
    return out


def make_arrivals(sessions: list[Session], rate_per_min: float, duration_s: float, seed: int,
                  warm: int = 0) -> list[SessionArrival]:
    rng = np.random.default_rng(seed)
    arrivals = [SessionArrival(0.0, sessions[i % len(sessions)], "warm", start_call=1) for i in range(warm)]
    t = 0.0
    while True:
        t += rng.exponential(60.0 / rate_per_min)
        if t >= duration_s:
            return arrivals
        arrivals.append(SessionArrival(t, sessions[int(rng.integers(len(sessions)))], "base"))


def config(arrivals, duration_s=1800.0, deployment="1p1d-h100", **kw) -> SimConfig:
    return SimConfig(load_hardware(load_deployment(deployment).hardware), load_deployment(deployment),
                     arrivals, duration_s, **kw)


def check_invariants(sim: Simulator, minute: int) -> None:
    """The engine's invariants, checked after every minute of simulated time."""
    for p in sim.cluster.prefills:
        p.cache.check()  # CAP-DEVICE, CAP-HOST, TREE
    for d in sim.cluster.decodes:
        assert 0 <= d.used <= d.capacity, "decode memory over capacity"
        assert d.reserved_idle >= 0
    assert sim.driver.working_set_tokens == sum(s.context_tokens for s in sim.active), "working set drift"
    assert sim.driver.admitted_count == len(sim.active), "driver and engine disagree on who is active"
    assert set(sim.driver.parked) == {s.uid for s in sim.sessions
                                      if s.uid in sim.driver.sessions and s not in sim.active}
    assert sum(sim.active_by_tag.values()) == len(sim.active)


def CheckedSimulator(cfg: SimConfig, policy: Policy) -> Simulator:  # noqa: N802 (reads as the class it stands for)
    """A simulator that checks its invariants every simulated minute."""
    return Simulator(cfg, policy, on_sample=check_invariants)


def test_run_is_deterministic_and_conserves_tokens_and_sessions():
    sessions = make_sessions(60, seed=1)
    arrivals = make_arrivals(sessions, 6.0, 1800.0, seed=2, warm=5)
    a = CheckedSimulator(config(arrivals), HiCachePolicy()).run()
    b = CheckedSimulator(config(arrivals), HiCachePolicy()).run()
    for name in a.calls:
        assert np.array_equal(a.calls[name], b.calls[name]), name
    calls, sess = a.calls, a.sessions
    # TOKENS: every prompt token is a hit, a load or a recomputation.
    assert np.all(calls["cached_tokens"] + calls["loaded_tokens"] + calls["uncached_tokens"] == calls["prompt_tokens"])
    # SESSIONS: each arrived once; a completed session finished every call.
    assert len(sess["session_uid"]) == len(arrivals)
    done = ~np.isnan(sess["finished_s"])
    assert np.all(sess["calls_done"][done] + (sess["warm"][done] * 1) == sess["n_calls"][done])
    per_session = np.bincount(calls["session_uid"], minlength=len(sess["session_uid"]))
    assert np.array_equal(per_session, sess["calls_done"])
    # Times are ordered along each call's path.
    assert np.all(calls["admitted_s"] <= calls["prefill_start_s"])
    assert np.all(calls["prefill_start_s"] < calls["first_token_s"])
    assert np.all(calls["first_token_s"] <= calls["finished_s"])


def test_overload_keeps_invariants_with_host_tier_and_several_instances():
    sessions = make_sessions(80, seed=3, calls=(10, 30))
    arrivals = make_arrivals(sessions, 60.0, 1200.0, seed=4)
    result = CheckedSimulator(config(arrivals, 1200.0, deployment="2P3D-h100-nvl"), HiCachePolicy()).run()
    calls = result.calls
    assert len(calls["session_uid"]) > 0
    assert set(np.unique(calls["prefill_instance"])) == {0, 1}
    assert np.all(calls["cached_tokens"] + calls["loaded_tokens"] + calls["uncached_tokens"] == calls["prompt_tokens"])


def test_reservation_at_prefill_completion_holds_no_decode_memory_while_queued():
    sessions = make_sessions(40, seed=5)
    arrivals = make_arrivals(sessions, 30.0, 900.0, seed=6)
    result = CheckedSimulator(config(arrivals, 900.0, reserve_at_prefill_completion=True), HiCachePolicy()).run()
    ts = result.timeseries
    # With reservation at completion, reserved-idle memory only covers the transfer.
    assert np.nanmax(ts["decode_kv_reserved_idle_tokens"]) < 0.2 * ts["decode_kv_capacity_tokens"][0]


def test_terminating_a_tag_ends_those_sessions():
    sessions = make_sessions(40, seed=7, calls=(30, 40))
    arrivals = make_arrivals(sessions, 6.0, 1200.0, seed=8)
    arrivals = [SessionArrival(a.arrival_s, a.session, "burst" if i % 2 else "base") for i, a in enumerate(arrivals)]
    sim = CheckedSimulator(config(arrivals, 1200.0, interventions=[Intervention(600.0, "terminate-tag", tag="burst")]),
                           HiCachePolicy())
    result = sim.run()
    tags = result.sessions["tag"]
    arrived_before = result.sessions["arrival_s"] < 600.0
    burst_calls_after = [c for c, u in zip(result.calls["issued_s"], result.calls["session_uid"])
                         if tags[u] == "burst" and arrived_before[u] and c > 700.0]
    assert not burst_calls_after
    assert all(s.tag != "burst" or s.arrival_s >= 600.0 for s in sim.active)


class ReverseOrder(Policy):
    """Parks nothing, orders both queues by descending session uid."""

    name = "reverse-order"

    def control(self, signals, parked):
        return ControlDecision(order_by_priority=True, next_tick_s=30.0)

    def priority_key(self, uid):
        return -float(uid)


def test_priority_order_is_held_in_the_prefill_queue():
    loop = EventLoop()
    hw = load_hardware("h100-nvl")
    started: list[int] = []
    inst = PrefillInstance(0, hw.prefill, RadixCache(10**6), loop, lambda r: started.append(r.session))
    inst.set_ordered(True)
    session = make_sessions(1, seed=9)[0]
    reqs = []
    for uid in range(6):
        s = SessionState(uid, session, "base", 0.0, 0, None)
        r = s.request(0, s.prompt_key(0), uid, 0.0)
        r.prio = [5.0, 1.0, 4.0, 2.0, 3.0, 0.5][uid]
        reqs.append(r)
    for r in reqs:
        inst.enqueue(r)
    loop.run(1e6)
    # The first was taken at once (the instance was idle); the rest by key.
    assert started[0] == 0
    keys = [reqs[u].prio for u in started[1:]]
    assert keys == sorted(keys)


def test_priority_order_is_held_in_the_decode_memory_queue():
    loop = EventLoop()
    hw = load_hardware("h100-nvl")
    reserved: list[int] = []
    dec = DecodeInstance(0, hw.decode.model_copy(update={"kv_tokens": 15_000}), 0.05, loop,
                         lambda r: reserved.append(r.session), Callbacks())
    session = Session("x", (Call(9000, 9000, 10),))
    blocker_state = SessionState(100, session, "base", 0.0, 0, None)
    blocker = blocker_state.request(0, [], 0, 0.0)
    dec.request_memory(blocker)  # takes most of the memory
    dec.set_ordered(True)
    reqs = []
    for uid, prio in enumerate([3.0, 1.0, 2.0]):
        s = SessionState(uid, session, "base", 0.0, 0, None)
        r = s.request(0, [], uid + 1, 0.0)
        r.prio = prio
        reqs.append(r)
        dec.request_memory(r)
    assert reserved == [100]
    dec.release_reservation(blocker)
    assert reserved[1] == 1  # lowest key first


def naive_decode(prompts: list[int], outputs: list[int], hw) -> list[float]:
    """Step-by-step reference: every request decodes from t=0 together."""
    p = hw.decode
    remaining = [max(o - 1, 0) for o in outputs]
    ctx = [pr + 1 for pr in prompts]
    t = 0.0
    finish = [0.0 if r == 0 else math.nan for r in remaining]
    while any(r > 0 for r in remaining):
        live = [i for i, r in enumerate(remaining) if r > 0]
        t += p.step_s(len(live), sum(ctx[i] for i in live))
        for i in live:
            remaining[i] -= 1
            ctx[i] += 1
            if remaining[i] == 0:
                finish[i] = t
    return finish


def test_closed_form_decode_matches_step_by_step_reference():
    hw = load_hardware("h100-nvl")
    loop = EventLoop()
    finished: dict[int, float] = {}
    dec = DecodeInstance(0, hw.decode, hw.itl_slo_s, loop, lambda r: None,
                         Callbacks(on_finished=lambda r: finished.__setitem__(r.session, loop.now)))
    prompts = [1000, 30_000, 5000, 80_000, 200]
    outputs = [50, 300, 1, 120, 700]
    session = Session("x", (Call(100, 100, 10),))
    for uid, (pr, out) in enumerate(zip(prompts, outputs)):
        s = SessionState(uid, session, "base", 0.0, 0, None)
        r = s.request(0, [], uid, 0.0)
        r.prompt, r.output, r.decode_steps = pr, out, max(out - 1, 0)
        dec.request_memory(r)
        dec.join(r)
        loop.run(0.0)
    loop.run(1e6)
    expected = naive_decode(prompts, outputs, hw)
    for uid, t in enumerate(expected):
        assert finished[uid] == pytest.approx(t, rel=1e-9, abs=1e-9)


class ParkAll(Policy):
    name = "park-all"

    def on_session_arrival(self, info, signals):
        return Admission.PARK

    def control(self, signals, parked):
        # Release the two oldest, shed the rest, every tick.
        return ControlDecision(release=tuple(parked[:2]), shed=tuple(parked[2:]), next_tick_s=60.0)


def test_parked_sessions_are_released_or_shed_by_the_policy():
    sessions = make_sessions(30, seed=11)
    arrivals = make_arrivals(sessions, 10.0, 900.0, seed=12)
    result = CheckedSimulator(config(arrivals, 900.0), ParkAll()).run()
    s = result.sessions
    started = ~np.isnan(s["first_admitted_s"])
    assert np.all(started | s["shed"] | (s["arrival_s"] > 840.0))
    assert not np.any(started & s["shed"])
    waits = s["first_admitted_s"][started] - s["arrival_s"][started]
    assert np.all(waits >= 0) and np.all(waits <= 60.0 + 1e-9)


class FakeLentTier:
    """Holds every session's previous prompt, as lent decode memory would."""

    def __init__(self):
        self.fetched = 0
        self.last_prompt: dict[int, int] = {}

    def covered_tokens(self, session_uid, prompt_tokens):
        return self.last_prompt.get(session_uid, 0)

    def fetch(self, session_uid, tokens, now):
        self.fetched += tokens
        return tokens / 1e6


def test_a_lower_tier_supplies_what_the_local_cache_lost():
    loop = EventLoop()
    hw = load_hardware("h100-nvl")
    done: list[Request] = []
    tiny = RadixCache(4096, page_tokens=64)  # far too small to keep any context
    inst = PrefillInstance(0, hw.prefill, tiny, loop, done.append)
    tier = FakeLentTier()
    inst.lower_tiers.append(tier)
    session = Session("x", (Call(3000, 3000, 10, 1.0), Call(3500, 490, 10)))
    s = SessionState(0, session, "base", 0.0, 0, None)
    first = s.request(0, s.prompt_key(0), 1, 0.0)
    inst.enqueue(first)
    loop.run(10.0)
    inst.release(first, loop.now)
    tier.last_prompt[0] = 3000
    s.key = first.key
    second = s.request(1, s.prompt_key(1), 2, loop.now)
    inst.enqueue(second)
    loop.run(20.0)
    assert second in done
    assert second.cached + second.loaded + second.uncached == 3500
    assert second.loaded >= 3000 - second.cached - 64 and tier.fetched > 0
    assert second.uncached <= 500
    tiny.check()


@pytest.mark.parametrize("system", policy_names())
def test_a_run_leaves_no_cyclic_garbage_that_grows_with_its_length(system):
    # The cyclic collector is off while a run is on (Simulator.run), because
    # a run frees what it makes by reference counting: were a per-call cycle
    # to appear under some system, a run would hold all of them until it
    # ended, so this pins their absence under every system.
    import gc

    sessions = make_sessions(40, seed=5)

    def cyclic_garbage(duration_s: float) -> int:
        gc.collect()
        gc.disable()
        try:
            sim = Simulator(config(make_arrivals(sessions, 6.0, duration_s, seed=6), duration_s=duration_s),
                            policy_class(system)())
            sim.run()
            return gc.collect()  # the simulator is still referenced: only garbage counts
        finally:
            gc.enable()

    cyclic_garbage(300.0)  # the first run's one-time garbage (lazy imports, caches) is left out
    short, long = cyclic_garbage(300.0), cyclic_garbage(1200.0)
    assert long <= short + 50, (short, long)


def test_a_run_gives_back_the_garbage_collector_as_it_found_it():
    # A run turns the cyclic collector off for its length (Simulator.run);
    # the process's settings and its unfrozen objects come back afterwards, also on failure.
    import gc

    sessions = make_sessions(10, seed=5)
    before = gc.get_threshold()
    gc.set_threshold(900, 11, 12)
    try:
        frozen = gc.get_freeze_count()
        seen: list[bool] = []
        Simulator(config(make_arrivals(sessions, 6.0, 300.0, seed=6), duration_s=300.0), HiCachePolicy(),
                  on_sample=lambda sim, minute: seen.append(gc.isenabled())).run()
        assert seen and not any(seen)  # off while the run is on
        assert gc.isenabled() and gc.get_threshold() == (900, 11, 12) and gc.get_freeze_count() == frozen
        gc.disable()  # a process that keeps it off finds it off
        Simulator(config(make_arrivals(sessions, 6.0, 300.0, seed=6), duration_s=300.0), HiCachePolicy()).run()
        assert not gc.isenabled()
        gc.enable()

        def fail(sim: Simulator, minute: int) -> None:
            raise RuntimeError("stop")

        with pytest.raises(RuntimeError, match="stop"):
            Simulator(config(make_arrivals(sessions, 6.0, 300.0, seed=6), duration_s=300.0), HiCachePolicy(),
                      on_sample=fail).run()
        assert gc.isenabled() and gc.get_threshold() == (900, 11, 12) and gc.get_freeze_count() == frozen
        gc.freeze()  # a process's own freeze stays as it is
        held = gc.get_freeze_count()
        Simulator(config(make_arrivals(sessions, 6.0, 300.0, seed=6), duration_s=300.0), HiCachePolicy()).run()
        assert gc.get_freeze_count() > held // 2  # still frozen (a few of its objects may have been freed)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_session_own_chunks_hit_only_where_it_was_placed():
    # The cache-aware router walks only the shared pieces of a key on an
    # instance the session was never placed on; that is exact only while its
    # own chunks are nowhere else. Checked every minute, warm sessions included.
    sessions = make_sessions(60, seed=8)
    checked = [0]

    def own_chunks_stay_home(sim: Simulator, minute: int) -> None:
        for s in sim.sessions:
            if not s.key or not math.isnan(s.finished_s):
                continue
            assert shared_pieces(s.key) == 1  # the workload's system prefix
            for p in sim.cluster.prefills:
                if not s.route.placed_on >> p.index & 1:
                    assert p.cache.peek(s.key) == p.cache.peek(s.key, None, 1) <= 1000, (s.uid, p.index)
                    checked[0] += 1

    sim = Simulator(config(make_arrivals(sessions, 400.0, 600.0, seed=9, warm=20), duration_s=600.0,
                           deployment="4P12D-h200"), HiCachePolicy(), on_sample=own_chunks_stay_home)
    sim.run()
    assert checked[0] > 100
    assert len({p.index for p in sim.cluster.prefills}) == 4
    assert any(bin(s.route.placed_on).count("1") > 1 for s in sim.sessions)  # some sessions moved


def test_run_scenario_gives_back_the_garbage_collector_as_it_found_it():
    # run_scenario makes the workload with the collector off and freezes it
    # for the run; the caller's switch and threshold come back, and a process
    # that froze nothing has nothing frozen after it.
    import gc

    from basin.experiments.runner import run_scenario
    from basin.experiments.scenario import load_scenario

    sc = load_scenario("surge-1p3d", ["workload.sessions=60", "duration_min=10", "measure_end_min=10"])
    before, was = gc.get_threshold(), gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            gc.unfreeze()
            run_scenario(sc, "hicache")
            assert gc.isenabled() is enabled and gc.get_threshold() == before
            assert gc.get_freeze_count() == 0
    finally:
        (gc.enable if was else gc.disable)()
        gc.set_threshold(*before)


@pytest.mark.parametrize(("system", "deployment"), [
    *[(system, "1p1d-h100") for system in ("hicache", "basin", "continuum", "crossflow")],
    ("hicache", "1C-h100-nvl"), ("basin", "1C-h100-nvl")])  # the colocated core too
def test_a_finished_run_is_freed_by_reference_counting(system, deployment):
    # References in a run point one way (requests name their session and
    # instances by number, the instances report to the engine core, the
    # core to the simulator as its listener; the run's end stops the core
    # and detaches the driver), so when the simulator goes, reference
    # counting frees all it built, its configuration and arrivals included:
    # a collection afterwards finds only a few objects of fixed number (the
    # loop's timers and the tournaments' nodes, which link to each other).
    import gc
    from collections import Counter

    sessions = make_sessions(40, seed=5)

    def garbage(drop: bool) -> Counter[str]:
        gc.collect()
        sim = Simulator(config(make_arrivals(sessions, 8.0, 1200.0, seed=6), duration_s=1200.0,
                               deployment=deployment), policy_class(system)())
        result = sim.run()
        kept = [] if drop else [sim]
        del sim
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            return Counter(type(o).__name__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            assert len(result.calls["session_uid"]) > 100  # the result outlives its simulator
            kept.clear()

    assert sum(garbage(False).values()) < 100  # a simulator still held holds all it built
    freed = garbage(True)
    state = ("Simulator", "SimConfig", "SessionArrival", "Cluster", "PrefillInstance", "DecodeInstance",
             "ColocatedCluster", "ColocatedInstance", "RadixCache", "_Node", "_Candidate", "Request", "Route",
             "SessionState", "KeyCursor", "MatchResult")
    assert not any(freed[t] for t in state), freed
    assert sum(freed.values()) < 100, freed


def test_a_finished_simulator_refuses_to_go_on():
    sim = Simulator(config(make_arrivals(make_sessions(5, seed=5), 6.0, 120.0, seed=6), duration_s=120.0),
                    HiCachePolicy())
    sim.run()
    with pytest.raises(RuntimeError, match="detached"):
        sim.driver.host.admitted(1)
    with pytest.raises(RuntimeError, match="stopped"):
        sim.cluster.decodes[0].listener.finished(sim.sessions[0].request(0, [], 1, 0.0))
    with pytest.raises(RuntimeError, match="stopped"):
        sim.cluster.listener.finished(sim.sessions[0].request(0, [], 1, 0.0))
    assert sim.loop.pending == 0
