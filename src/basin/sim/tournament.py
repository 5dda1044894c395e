"""A tournament tree: the least of a set of entrants whose keys change one
at a time, for the event loop's timers (the earliest wake of the decode
instances) and the decode router (the instance with the most room).

Each change replays the matches from the entrant's leaf to the root, so it
costs about log2(n) comparisons, and the least entrant is read at the
root. A heap would hold an entry per change and leave the superseded ones
to pop; a scan would read every entrant, each a cache miss on a large
deployment. Nodes link to each other rather than sit in a list: compiled,
a replay is a few field reads a level.
"""

from __future__ import annotations

import math
from typing import Final

from basin.sim.invariants import require

_INF: Final = math.inf


class Entrant:
    """One side of the tournament: the least ``(key, tie)`` wins. ``tie``
    must differ between entrants that can tie on ``key``."""

    __slots__ = ("key", "tie", "leaf")

    def __init__(self, key: float, tie: int) -> None:
        self.key = key
        self.tie = tie
        self.leaf = _Match(self, None, None)


class _Match:
    """A node: ``winner`` is the lesser of its sides' winners (a leaf's is its entrant)."""

    __slots__ = ("winner", "left", "right", "parent")

    def __init__(self, winner: Entrant, left: _Match | None, right: _Match | None) -> None:
        self.winner = winner
        self.left = left
        self.right = right
        self.parent: _Match | None = None


def _lesser(a: Entrant, b: Entrant) -> Entrant:
    return a if a.key < b.key or (a.key == b.key and a.tie < b.tie) else b


class Tournament:
    """Entrants in the order added, padded to a power of two with entrants
    whose key is infinite (one can win only where every key is)."""

    __slots__ = ("entrants", "_leaves", "root")

    def __init__(self) -> None:
        self.entrants: list[Entrant] = []
        self._leaves: list[Entrant] = [Entrant(_INF, 0)]
        self.root = self._leaves[0].leaf

    def add(self, entrant: Entrant) -> None:
        """Enter ``entrant`` (the tree is rebuilt when it outgrows its size)."""
        index = len(self.entrants)
        self.entrants.append(entrant)
        if index == len(self._leaves):
            self._leaves.extend(Entrant(_INF, 0) for _ in range(index))
        self._leaves[index] = entrant
        level = [e.leaf for e in self._leaves]
        for leaf in level:
            leaf.parent = None
        while len(level) > 1:
            above = []
            for j in range(0, len(level), 2):
                a, b = level[j], level[j + 1]
                match = _Match(_lesser(a.winner, b.winner), a, b)
                a.parent = b.parent = match
                above.append(match)
            level = above
        self.root = level[0]

    def moved(self, entrant: Entrant) -> None:
        """Replay the matches above ``entrant``, whose key or tie changed.
        Where a node's winner is another entrant and stays so, nothing
        above it changes."""
        node = entrant.leaf.parent
        while node is not None:
            left = node.left
            right = node.right
            assert left is not None and right is not None
            a = left.winner
            b = right.winner
            # _lesser, written out: a compiled call per level costs more than the comparison.
            winner = a if a.key < b.key or (a.key == b.key and a.tie < b.tie) else b
            if winner is node.winner and winner is not entrant:
                break
            node.winner = winner
            node = node.parent

    @property
    def winner(self) -> Entrant:
        """The least entrant; where every key is infinite, possibly a padding one."""
        return self.root.winner

    def check(self) -> None:
        """TOURNAMENT: every node's winner is the lesser of its sides' winners."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.left is None or node.right is None:
                require(node.left is None and node.right is None and node.winner.leaf is node, "TOURNAMENT",
                        "a leaf that is not its entrant's")
                continue
            expected = _lesser(node.left.winner, node.right.winner)
            require(node.winner is expected, "TOURNAMENT",
                    f"a node won by ({node.winner.key}, {node.winner.tie}), "
                    f"not ({expected.key}, {expected.tie})")
            stack.extend((node.left, node.right))
