"""The driver calls a policy's per-call hooks, and asks it about arrivals,
only where the policy has its own.

The base class's hooks do nothing and its arrival answer is to admit; the
driver skips them rather than make an interpreted call per hook at every
agent call (and assemble signals at every arrival). What it must never do is
skip a hook a policy does define, also after :meth:`PolicyDriver.switch_policy`.
"""

from __future__ import annotations

from basin.policy.base import Admission, EngineFigures, SessionInfo, Signals
from basin.policy.driver import PolicyDriver
from basin.policy.hicache import HiCachePolicy


class _Host:
    def engine_figures(self, now_s: float) -> EngineFigures:
        return EngineFigures(0.0, 0, 0, 0, 0.0, 1, 0, 1, 0, 1)

    def admitted(self, uid: int) -> None: ...
    def shed(self, uid: int, reason: str) -> None: ...
    def resumed(self, uid: int) -> None: ...
    def ordering(self, on: bool) -> None: ...
    def lending(self, on: bool) -> None: ...


class _Listening(HiCachePolicy):
    """Defines every per-call hook and writes down what it is told."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[tuple[str, int]] = []

    def on_session_arrival(self, info: SessionInfo, signals: Signals) -> Admission:
        self.heard.append(("arrival", info.uid))
        return Admission.PARK if signals.active_sessions >= 1 else Admission.ADMIT

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        self.heard.append(("issued", uid))

    def on_call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        self.heard.append(("finished", uid))
        return 7.0

    def priority_key(self, uid: int) -> float | None:
        return float(uid)


def _info(uid: int) -> SessionInfo:
    return SessionInfo(uid=uid, session_id=f"s{uid}", tag="agent", arrival_s=0.0, first_prompt_tokens=100)


def _one_call(driver: PolicyDriver, uid: int) -> tuple[float | None, float]:
    key = driver.call_issued(uid, 100, 1.0)
    return key, driver.call_finished(uid, 150, False, 2.0)


def test_a_policy_that_defines_the_hooks_hears_every_call() -> None:
    policy = _Listening()
    driver = PolicyDriver(policy, _Host())
    assert driver.arrive(_info(3)) is Admission.ADMIT
    assert driver.arrive(_info(4)) is Admission.PARK  # judged on the signals: one session active
    assert _one_call(driver, 3) == (3.0, 7.0)
    assert policy.heard == [("arrival", 3), ("arrival", 4), ("issued", 3), ("finished", 3)]


def test_a_policy_without_them_gets_the_base_answers() -> None:
    driver = PolicyDriver(HiCachePolicy(), _Host())
    assert [driver.arrive(_info(uid)) for uid in (3, 4)] == [Admission.ADMIT] * 2
    assert driver.admitted_count == 2
    assert _one_call(driver, 3) == (None, 0.0)
    assert driver.priority_key(3) is None
    assert driver.working_set_tokens == 150  # the driver's own accounting still runs


def test_switching_policies_switches_which_hooks_are_heard() -> None:
    driver = PolicyDriver(HiCachePolicy(), _Host())
    driver.arrive(_info(3))
    listening = _Listening()
    driver.switch_policy(listening, [_info(3)], 1.0)
    assert driver.policy is listening
    assert _one_call(driver, 3) == (3.0, 7.0)
    assert listening.heard == [("issued", 3), ("finished", 3)]
    assert driver.arrive(_info(4)) is Admission.PARK
    heard = [("issued", 3), ("finished", 3), ("arrival", 4)]
    assert listening.heard == heard
    driver.switch_policy(HiCachePolicy(), [_info(3)], 3.0)
    assert _one_call(driver, 3) == (None, 0.0)
    assert driver.arrive(_info(5)) is Admission.ADMIT
    assert listening.heard == heard
