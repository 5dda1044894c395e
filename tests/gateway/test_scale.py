"""A call costs the same with ten sessions in the table or tens of thousands
(issue 14, item 6): nothing on the path of a call or an arrival walks the
session table, and expiry visits only the sessions it ends."""

from __future__ import annotations

from tests.gateway.test_gate import CONFIG, OnceFuture, Scripted

from basin.gateway.gate import Gate
from basin.gateway.usage import CallUsage


class CountingDict(dict):
    """A dict that counts the walks over it."""

    walks = 0

    def values(self):
        CountingDict.walks += 1
        return super().values()

    def items(self):
        CountingDict.walks += 1
        return super().items()

    def __iter__(self):
        CountingDict.walks += 1
        return super().__iter__()


def _call(gate: Gate, sid: str, now: float, end: bool) -> None:
    sess = gate.open_call(sid, now, 500, None, end=end)
    gate.forwarded(sess, 500, now)
    gate.answering(sess, 500)
    gate.done(sess, CallUsage(500, 20, 400), now)


def test_calls_and_arrivals_never_walk_the_session_table() -> None:
    gate = Gate(Scripted([]), CONFIG, capacity_tokens=10_000)
    for i in range(5_000):
        _call(gate, f"resident-{i}", float(i) * 1e-3, end=False)
    gate.table.sessions = CountingDict(gate.table.sessions)
    gate.table.by_uid = CountingDict(gate.table.by_uid)
    CountingDict.walks = 0
    for i in range(200):
        _call(gate, f"new-{i}", 10.0, end=False)  # an arrival: the policy's signals are built too
        _call(gate, f"new-{i}", 10.5, end=True)
        _call(gate, f"resident-{i}", 11.0, end=False)
    gate.tick(12.0)  # nobody idle yet: expiry looks at one session and stops
    assert CountingDict.walks == 0
    assert gate.table.unanswered_prompt_tokens() == 0 and gate.table.unanswered_sessions() == 0
    assert gate.signals(12.0).prefill_queue_requests == 0


def test_expiry_ends_the_longest_idle_first_and_spares_held_calls() -> None:
    gate = Gate(Scripted([]), CONFIG, capacity_tokens=10_000)  # idle_timeout_s = 100
    for i, sid in enumerate(("a", "b", "c", "d")):
        _call(gate, sid, float(i), end=False)
    busy = gate.open_call("c", 50.0, 500, None, end=False)
    gate.forwarded(busy, 500, 50.0)  # c has a call in flight: not idle
    held = gate.table.get("d")
    gate.wait(held, OnceFuture())  # d's call is held: not idleness
    _call(gate, "a", 60.0, end=False)  # a was seen again
    gate.tick(102.0)
    assert gate.table.get("b") is None and gate.counts["expired"] == 1
    assert all(gate.table.get(s) is not None for s in ("a", "c", "d"))
    gate.done(busy, None, 103.0)
    gate.tick(161.0)  # a: idle since 60
    assert gate.table.get("a") is None and gate.table.get("c") is not None
    gate.tick(204.0)
    assert gate.table.get("c") is None and gate.table.get("d") is not None  # d is still held
