"""Named invariant errors for the simulator.

A broken invariant must stop a run whatever the interpreter's flags: ``assert``
statements vanish under ``python -O``, so the simulator raises
:class:`InvariantViolation` instead, naming the invariant (``LOCK-BALANCE``,
``CAP-DEVICE``, ...) so a failure says which rule broke.

``require`` is the readable form for checks off the hot path. Inside hot
loops the caller writes ``if not cond: raise InvariantViolation(...)`` inline,
which costs nothing unless the condition fails.

The names in use, what each says and where it is checked, are
:data:`INVARIANTS` (tests/sim/test_invariant_names.py holds it to the names
the code raises, both ways).
"""

from __future__ import annotations

from typing import Final

#: Every invariant by name: the module that checks it (a raise, or
#: ``tests`` for a rule only the tests pin) and what it says.
INVARIANTS: Final[dict[str, tuple[str, str]]] = {
    # the prefix cache (basin.sim.cache)
    "TREE": ("cache", "every node's ancestors are in the tree; a device node's ancestors are on the device"),
    "CHILD-KIND": ("cache", "a child that begins its chunk is held by chunk id, any other is its parent's next"),
    "DEVICE-CHILDREN": ("cache", "a node's count of device-resident children is exact"),
    "ACCOUNTING": ("cache", "the device and host tokens counted are the tokens of the nodes on each tier"),
    "CAP-DEVICE": ("cache", "device tokens (nodes plus in-flight allocations) stay within the device pool"),
    "CAP-HOST": ("cache", "host tokens stay within the host tier"),
    "INFLIGHT": ("cache colocated", "in-flight allocations are never negative, released exactly once, and "
                 "on a colocated instance what its running requests hold"),
    "STATE-SLOTS": ("cache", "recurrent-state slots in use are counted exactly and stay within the limit"),
    "LOCK-BALANCE": ("cache colocated", "the lock references in the tree are two per live lock handle; on a "
                     "colocated instance one handle per running request"),
    "LOCKED-KEPT": ("tests", "a locked node is never evicted from any tier"),
    "INCLUSIVE": ("tests", "under write-through, a device node that could be backed up on the host is"),
    # prefill (basin.sim.prefill)
    "MATCH-FRESH": ("prefill", "a prefill's load-back is what its allocation covered"),
    "LIVE-PREFILL-FITS": ("prefill", "a prompt that could never start on its instance is refused, not queued"),
    # decode (basin.sim.decode)
    "RESERVE-BALANCE": ("decode", "decode memory used is what the idle reservations, joins and batch hold"),
    "CAP-DECODE": ("decode", "decode memory used stays within the instance's KV"),
    "BATCH": ("decode", "the batch's context and growing counts are its members'"),
    "STAY": ("decode", "a batch heap entry acts only on the stay in the batch that pushed it"),
    "LIVE-DECODE-FITS": ("decode", "a reservation larger than the whole instance is refused, not queued"),
    # the colocated instance (basin.sim.colocated)
    "LIVE-COLOCATED-FITS": ("colocated", "a call that could never be admitted to its colocated pool is refused"),
    "COLOCATED-RUNNING": ("colocated", "at most max_running requests run on a colocated instance"),
    # what the routers read (basin.sim.prefill, basin.sim.decode)
    "ROUTER-LOAD": ("decode prefill", "the counts the routers read are what the instances' queues hold"),
    "ROUTER-ROOM": ("decode", "the decode room the router reads is current for every instance not marked stale"),
    "TOURNAMENT": ("tournament", "each match of a tournament holds the lesser of its sides' winners"),
    # engine mechanisms
    "LEASE": ("borrow", "a borrowed prefill chunk runs only for a leased request"),
    "LENDING-WIRED": ("cluster", "a decode instance lends only with the lent tier wired in"),
}


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
