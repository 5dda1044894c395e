"""The simulator and the gateway drive a policy alike.

A simulated run records everything its policy is told and answers; the same
event trace is then fed to the gateway's gate (sessions arriving, calls
forwarded and answered, control ticks), with the engine's figures taken from
the simulation, and a fresh copy of the policy must be told and answer the
very same things: the same verdicts, releases, sheds, pauses and resumes, on
the same session accounting (active and parked sessions, working set, mean
context, arrival rate).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import basin.experiments.runner as runner
from basin.experiments.scenario import load_scenario
from basin.gateway.config import GatewayConfig
from basin.gateway.gate import Gate, ShedError
from basin.gateway.sessions import SessionState
from basin.gateway.usage import CallUsage
from basin.policy.base import Admission, ControlDecision, EngineFigures, Policy, SessionInfo, Signals
from basin.policy.basin import BasinParams, BasinPolicy, CliffSummary
from basin.policy.driver import PolicyDriver
from basin.policy.thunderagent import ThunderAgentPolicy
from basin.predict.peak import GrowthPredictor

#: Signal fields the driver itself keeps (the rest are the host's engine figures).
DRIVER_FIELDS = ("now_s", "active_sessions", "parked_sessions", "working_set_tokens", "mean_context_tokens",
                 "arrival_rate_per_min")
ENGINE_FIELDS = tuple(f for f in EngineFigures.__dataclass_fields__)


def _driver_view(s: Signals) -> tuple[Any, ...]:
    return tuple(round(v, 9) if isinstance(v, float) else v for v in (getattr(s, f) for f in DRIVER_FIELDS))


def _figures(s: Signals) -> EngineFigures:
    return EngineFigures(**{f: getattr(s, f) for f in ENGINE_FIELDS})


class Recording(Policy):
    """Wraps a policy and writes down every exchange with it."""

    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.log: list[tuple[Any, ...]] = []
        self.figures: list[EngineFigures] = []

    @property
    def needs(self):  # type: ignore[override]
        return self.inner.needs

    def on_session_arrival(self, info: SessionInfo, signals: Signals) -> Admission:
        verdict = self.inner.on_session_arrival(info, signals)
        self.figures.append(_figures(signals))
        self.log.append(("arrival", info.uid, info.session_id, info.arrival_s, info.first_prompt_tokens,
                         _driver_view(signals), verdict))
        return verdict

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        self.log.append(("issued", uid, prompt_tokens, now_s))
        self.inner.on_call_issued(uid, prompt_tokens, now_s)

    def on_call_held(self, uid: int, now_s: float) -> None:
        self.log.append(("held", uid, now_s))
        self.inner.on_call_held(uid, now_s)

    def on_call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        self.log.append(("finished", uid, context_tokens, last_call, now_s))
        return self.inner.on_call_finished(uid, context_tokens, last_call, now_s)

    def on_session_finished(self, uid: int, now_s: float) -> None:
        self.log.append(("session-finished", uid, now_s))
        self.inner.on_session_finished(uid, now_s)

    def attach(self, active: Sequence[SessionInfo], now_s: float) -> None:
        self.inner.attach(active, now_s)

    def control(self, signals: Signals, parked: Sequence[int]) -> ControlDecision:
        decision = self.inner.control(signals, parked)
        self.figures.append(_figures(signals))
        self.log.append(("control", _driver_view(signals), tuple(parked), decision))
        return decision

    def priority_key(self, uid: int) -> float | None:
        return self.inner.priority_key(uid)


def _simulate(make: Callable[[], Policy], scenario: str, overrides: list[str],
              monkeypatch: pytest.MonkeyPatch) -> Recording:
    recording = Recording(make())
    monkeypatch.setattr(runner, "build_policy", lambda *a, **k: recording)
    runner.run_scenario(load_scenario(scenario, overrides))
    return recording


class ReplayGate(Gate):
    """The gateway's gate with the engine's figures taken from a recording."""

    def __init__(self, policy: Policy, figures: list[EngineFigures]):
        super().__init__(policy, GatewayConfig(upstream="http://127.0.0.1:9", idle_timeout_s=604_800.0))
        self.recorded = deque(figures)

    def engine_figures(self, now_s: float) -> EngineFigures:
        return self.recorded.popleft()


def _replay(sim: Recording, make: Callable[[], Policy], skip: int | None = None) -> Recording:
    """Feed the simulated run's events to a gate, as a gateway would see them."""
    recording = Recording(make())
    gate = ReplayGate(recording, sim.figures)
    last_issue, completes = {}, set()
    for i, event in enumerate(sim.log):
        if event[0] == "issued":
            last_issue[event[1]] = i
        elif event[0] == "finished" and event[3]:
            completes.add(event[1])
    ids: dict[int, str] = {}
    for i, event in enumerate(sim.log):
        kind = event[0]
        if i == skip:
            continue
        if kind == "arrival":
            _, uid, sid, now, prompt, _, _ = event
            ids[uid] = sid
            try:
                gate.open_call(sid, now, prompt, None, end=False)
            except ShedError:
                pass
        elif kind == "issued":
            _, uid, prompt, now = event
            sess = gate.open_call(ids[uid], now, prompt, None, end=uid in completes and last_issue[uid] == i)
            gate.forwarded(sess, prompt, now)
        elif kind == "finished":
            _, uid, context, _, now = event
            sess = gate.table.by_uid[uid]
            gate.done(sess, CallUsage(prompt_tokens=context, completion_tokens=0, cached_tokens=None), now)
        elif kind == "control":
            gate.tick(event[1][0])
        elif kind == "held":
            _, uid, now = event
            gate.open_call(ids[uid], now, 0, None, end=False)
    return recording


def _basin() -> Policy:
    # A small cliff and a short shedding horizon, so a short run parks, releases and sheds.
    return BasinPolicy(BasinParams(lending=False, shed_horizon_s=120.0), predictor=GrowthPredictor(1.5),
                       cliff=CliffSummary(kappa=0.2, x_knee=1.9, lambda_c_per_min=3.0))


@pytest.mark.parametrize("make, expect", [
    (_basin, ("park", "release", "shed")),
    (ThunderAgentPolicy, ("park", "release", "pause", "resume", "held")),
])
def test_the_gateway_drives_a_policy_as_the_simulator_does(make, expect, monkeypatch) -> None:
    sim = _simulate(make, "trap-1p1d", ["duration_min=45", "measure_end_min=45", "surge.factor=4.0",
                                        "arrivals.warm_sessions=0"], monkeypatch)
    decisions = [e[3] for e in sim.log if e[0] == "control"]
    verdicts = [e[6] for e in sim.log if e[0] == "arrival"]
    seen = {
        "park": Admission.PARK in verdicts,
        "release": any(d.release for d in decisions),
        "pause": any(d.pause for d in decisions),
        "resume": any(d.resume for d in decisions),
        "shed": any(d.shed for d in decisions),
        "held": any(e[0] == "held" for e in sim.log),
    }
    assert all(seen[k] for k in expect), f"the trace does not exercise {expect}: {seen}"
    gateway = _replay(sim, make)
    for i, (a, b) in enumerate(zip(sim.log, gateway.log)):
        assert a == b, f"event {i}: simulator {a} != gateway {b}"
    assert len(gateway.log) == len(sim.log)


def test_a_host_that_loses_one_answer_is_caught(monkeypatch) -> None:
    """The comparison is not vacuous: a gateway that misses one call's answer
    counts another working set, and the policy is told so."""
    sim = _simulate(_basin, "trap-1p1d", ["duration_min=20", "measure_end_min=20", "arrivals.warm_sessions=0"],
                    monkeypatch)
    first_answer = next(i for i, e in enumerate(sim.log) if e[0] == "finished" and not e[3])
    gateway = _replay(sim, _basin, skip=first_answer)
    assert gateway.log != [e for i, e in enumerate(sim.log) if i != first_answer]


def test_a_burst_of_first_calls_is_decided_alike_by_the_gateway_and_the_driver() -> None:
    """The same burst through the gate and through a bare PolicyDriver hosted as the
    simulator hosts it (admission issues the first call at once): the same verdicts."""
    prompts = [800, 1_200, 3_000, 400, 2_500] * 8
    gate = Gate(BasinPolicy(BasinParams(lending=False), predictor=GrowthPredictor(1.5)),
                GatewayConfig(upstream="http://127.0.0.1:9"), capacity_tokens=10_000)
    gate.control_step(0.0)
    gate_verdicts = []
    for i, p in enumerate(prompts):
        sess = gate.open_call(f"s{i}", 1.0, p, None, end=False)
        gate_verdicts.append(gate.session_state(sess) is SessionState.ADMITTED)
        if gate.session_state(sess) is SessionState.ADMITTED:
            gate.forwarded(sess, p, 1.0)

    class SimHost:
        def __init__(self, figures: EngineFigures):
            self.figures, self.prompts = figures, {}

        def engine_figures(self, now_s):
            return self.figures

        def admitted(self, uid):
            driver.call_issued(uid, self.prompts[uid], 1.0)

        def shed(self, uid, reason):
            pass

        def resumed(self, uid):
            pass

        def ordering(self, on):
            pass

        def lending(self, on):
            pass

    host = SimHost(gate.engine_figures(1.0))
    policy = BasinPolicy(BasinParams(lending=False), predictor=GrowthPredictor(1.5))
    driver = PolicyDriver(policy, host)
    host.figures = gate.engine_figures(0.0)
    driver.tick(0.0)
    sim_verdicts = []
    for i, p in enumerate(prompts):
        host.prompts[i] = p
        driver.refresh(1.0)
        sim_verdicts.append(driver.arrive(SessionInfo(i, f"s{i}", "gateway", 1.0, p, None), 0) is Admission.ADMIT)
    assert gate_verdicts == sim_verdicts and 0 < sum(sim_verdicts) < len(prompts)
    assert gate.driver.working_set_tokens == driver.working_set_tokens
