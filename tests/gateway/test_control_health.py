"""A control loop that cannot die silently (issue 14, item 1): parameters
checked at start and on every admin change, a control step that raises logged,
counted and retried, /healthz unhealthy after repeated failures, and no parked
call left waiting for a tick that never comes."""

from __future__ import annotations

import asyncio
import logging

import pytest
from tests.gateway.test_gate import CONFIG, OnceFuture, Scripted
from tests.gateway.test_proxy import TOKEN, QueuePolicy, chat, run, stack

from basin.gateway.gate import Gate, ShedError, control_retry_s
from basin.gateway.sessions import SessionState
from basin.policy.base import Admission
from cli_helpers import run_basin

AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Breaking(Scripted):
    """A scripted policy whose control step raises while ``broken``."""

    def __init__(self, verdicts: list[Admission], broken: bool = True):
        super().__init__(verdicts)
        self.broken = broken
        self.arrival_breaks = False

    def on_session_arrival(self, info, signals):
        if self.arrival_breaks:
            raise ZeroDivisionError("arrival")
        return super().on_session_arrival(info, signals)

    def control(self, signals, parked):
        if self.broken:
            raise ZeroDivisionError("a policy bug")
        return super().control(signals, parked)


def test_wrong_params_at_start_exit_2_with_one_line_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_basin(capsys, "gateway", "--upstream", "http://127.0.0.1:9", "--param", "budget_high=1,0")
    assert code == 2
    assert "parameter 'budget_high': expected a number, got '1,0'" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_admin_params_out_of_range_are_a_400_naming_the_field() -> None:
    async def go():
        async with stack(policy="basin") as (fake, server, client):
            for update, field in (({"context_smoothing_s": 0}, "context_smoothing_s"),
                                  ({"budget_high": -5}, "budget_high"), ({"budget_high": "1,0"}, "budget_high")):
                async with client.post(server.url + "/admin/params", json=update, headers=AUTH) as r:
                    assert r.status == 400
                    err = (await r.json())["error"]
                    assert err["type"] == "invalid_parameter" and f"parameter '{field}'" in err["message"]
            assert server.policy.params.context_smoothing_s == 600.0 and server.policy.params.budget_high == 2.0
            assert server.gate.control_failures == 0
    run(go())


def test_a_failing_step_is_logged_counted_retried_and_parked_sessions_are_shed(caplog) -> None:
    policy = Breaking([Admission.PARK, Admission.PARK])
    gate = Gate(policy, CONFIG.model_copy(update={"control_retry_s": 0.5}), capacity_tokens=10_000)
    held = gate.open_call("p", 0.0, 100, None, end=False)
    waiter = OnceFuture()
    gate.wait(held, waiter)
    with caplog.at_level(logging.ERROR, logger="basin.gateway"):
        delays = [gate.control_step(float(i)) for i in range(1, 3)]
    assert delays == [0.5, 1.0] and gate.control_failures == 2 and gate.control_errors == 2
    assert all(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)
    assert not gate.control_failed and gate.session_state(held) is SessionState.PARKED  # still within the limit
    assert gate.control_step(3.0) == 2.0 and gate.control_failed  # the third in a row
    assert gate.session_state(held) is SessionState.SHED and waiter.results == [SessionState.SHED]
    assert held.shed_reason == "controller-failed" and not gate.driver.parked
    # While the controller is down, a new session the policy parks is answered at once.
    with pytest.raises(ShedError) as shed:
        gate.open_call("q", 4.0, 100, None, end=False)
    assert shed.value.reason == "controller-failed"
    policy.broken = False
    gate.control_step(5.0)
    assert gate.control_failures == 0 and not gate.control_failed and gate.last_tick_s == 5.0


def test_retry_delays_double_and_are_capped() -> None:
    assert [control_retry_s(1.0, n) for n in (1, 2, 3, 6, 20)] == [1.0, 2.0, 4.0, 30.0, 30.0]


def test_an_arrival_the_policy_fails_on_is_a_retryable_503_and_leaves_no_trace() -> None:
    policy = Breaking([], broken=False)
    policy.arrival_breaks = True
    gate = Gate(policy, CONFIG, capacity_tokens=10_000)
    with pytest.raises(ShedError) as shed:
        gate.open_call("a", 0.0, 100, None, end=False)
    assert shed.value.reason == "controller-error" and gate.control_errors == 1
    assert not gate.table.sessions and not gate.driver.sessions


def test_over_http_healthz_turns_unhealthy_and_held_calls_are_answered(caplog) -> None:
    async def go():
        policy = Breaking([Admission.ADMIT], broken=False)
        async with stack(policy_obj=policy, control_retry_s=0.02) as (fake, server, client):
            url = server.url
            async with client.post(url + "/v1/chat/completions", json=chat("ok")) as r:
                assert r.status == 200
            policy.verdicts = [Admission.PARK]
            held = asyncio.create_task(client.post(url + "/v1/chat/completions", json=chat("held")))
            await asyncio.sleep(0.1)
            assert server.gate.session_state(server.gate.table.get("held")) is SessionState.PARKED
            policy.broken = True
            server.request_tick()
            for _ in range(100):
                await asyncio.sleep(0.02)
                if server.gate.control_failed:
                    break
            resp = await asyncio.wait_for(held, 2)
            assert resp.status == 503 and (await resp.json())["error"]["reason"] == "controller-failed"
            assert resp.headers["Retry-After"] == "60"
            async with client.get(url + "/healthz") as r:
                assert r.status == 503
                health = await r.json()
                assert health["status"] == "unhealthy" and "ZeroDivision" not in health["reason"]
            async with client.get(url + "/metrics") as r:
                text = await r.text()
            assert "basin_gateway_control_failures " in text and "basin_gateway_control_errors_total" in text
            async with client.get(url + "/admin/state", headers=AUTH) as r:
                assert "ZeroDivisionError" in (await r.json())["control"]["last_error"]
            # Admitted sessions keep being served meanwhile.
            async with client.post(url + "/v1/chat/completions", json=chat("ok")) as r:
                assert r.status == 200
            policy.broken = False
            for _ in range(200):
                await asyncio.sleep(0.02)
                if not server.gate.control_failures:
                    break
            async with client.get(url + "/healthz") as r:
                assert r.status == 200 and (await r.json())["status"] == "ok"
    with caplog.at_level(logging.ERROR, logger="basin.gateway"):
        run(go())
    assert any("the control step failed" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_policy_hook_that_raises_on_the_request_path_does_not_fail_the_call() -> None:
    class BadHooks(QueuePolicy):
        def on_call_finished(self, uid, context_tokens, last_call, now_s):
            raise RuntimeError("hook")

    async def go():
        async with stack(policy_obj=BadHooks(admit_first=5)) as (fake, server, client):
            async with client.post(server.url + "/v1/chat/completions", json=chat("h", session_end=True)) as r:
                assert r.status == 200
            assert server.gate.control_errors == 1 and server.gate.table.get("h") is None
            assert server.gate.counts["finished"] == 1
    run(go())
