"""The tournament's winner is the least (key, tie) of its entrants after any
sequence of changes, and its nodes stay consistent (TOURNAMENT)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.sim.invariants import InvariantViolation
from basin.sim.tournament import Entrant, Tournament

#: Few distinct keys, so that ties (broken by the tie number) are common.
KEYS = st.sampled_from([0.0, 1.0, 1.0, 2.5, -3.0, math.inf, math.inf])


@settings(max_examples=300, deadline=None)
@given(st.lists(KEYS, min_size=1, max_size=13),
       st.lists(st.tuples(st.integers(0, 12), KEYS, st.booleans()), max_size=60))
def test_the_winner_is_the_least_entrant_after_every_change(initial, changes):
    tournament = Tournament()
    entrants: list[Entrant] = []
    for j, key in enumerate(initial):
        entrants.append(Entrant(key, j))
        tournament.add(entrants[-1])
        tournament.check()
    for which, key, add in changes:
        if add and len(entrants) < 13:  # an entrant joins mid-way (the tree may grow)
            entrants.append(Entrant(key, len(entrants)))
            tournament.add(entrants[-1])
        else:
            entrant = entrants[which % len(entrants)]
            entrant.key = key
            tournament.moved(entrant)
        tournament.check()
        least = min(entrants, key=lambda e: (e.key, e.tie))
        # Where every key is infinite a padding entrant may win: it counts as none.
        assert tournament.winner is least or tournament.winner.key == least.key == math.inf
    assert tournament.entrants == entrants


def test_a_node_left_behind_by_a_change_fails_the_check():
    tournament = Tournament()
    entrants = [Entrant(float(j), j) for j in range(3)]
    for e in entrants:
        tournament.add(e)
    assert tournament.winner is entrants[0]
    entrants[0].key = 9.0  # changed without a replay
    with pytest.raises(InvariantViolation, match="TOURNAMENT"):
        tournament.check()
    tournament.moved(entrants[0])
    tournament.check()
    assert tournament.winner is entrants[1]
