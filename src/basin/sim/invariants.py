"""Named invariant errors for the simulator.

A broken invariant must stop a run whatever the interpreter's flags: ``assert``
statements vanish under ``python -O``, so the simulator raises
:class:`InvariantViolation` instead, naming the invariant (``LOCK-BALANCE``,
``CAP-DEVICE``, ...) so a failure says which rule broke.

``require`` is the readable form for checks off the hot path. Inside hot
loops the caller writes ``if not cond: raise InvariantViolation(...)`` inline,
which costs nothing unless the condition fails.

Names in use: ``TREE``, ``ACCOUNTING``, ``CAP-DEVICE``, ``CAP-HOST``,
``INFLIGHT``, ``STATE-SLOTS``, ``DEVICE-CHILDREN``, ``LOCKED-KEPT`` and
``LOCK-BALANCE`` (the prefix cache, :mod:`basin.sim.cache`); ``MATCH-FRESH``
(a prefill's load-back matches what its allocation covered,
:mod:`basin.sim.prefill`); ``RESERVE-BALANCE``, ``CAP-DECODE``, ``BATCH`` and
``STAY`` (a decode heap entry acts only on the stay in the batch that pushed
it; decode memory, :mod:`basin.sim.decode`); ``ROUTER-LOAD`` (the counts
the routers read, a prefill instance's queued and running requests and a
decode instance's waiting ones, are what its lists hold); ``LEASE`` (prefill borrowing);
``LIVE-PREFILL-FITS`` and ``LIVE-DECODE-FITS`` (liveness: a request larger
than its instance, raised as :class:`RequestNeverFits`).
"""

from __future__ import annotations


class InvariantViolation(RuntimeError):
    """An invariant of the simulator does not hold.

    ``invariant`` is the rule's short name, ``detail`` what was found.
    """

    def __init__(self, invariant: str, detail: str = ""):
        super().__init__(invariant, detail)
        self.invariant = invariant
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}" if self.detail else self.invariant


class RequestNeverFits(InvariantViolation):
    """A request needs more memory than its instance has even when empty: it
    would wait forever, and everything queued behind it with it (LIVENESS)."""


def require(condition: bool, invariant: str, detail: str = "") -> None:
    """Raise :class:`InvariantViolation` named ``invariant`` unless ``condition``."""
    if not condition:
        raise InvariantViolation(invariant, detail)
