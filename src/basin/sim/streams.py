"""The simulator's random streams, one per subsystem, by name.

A run is a pure function of its scenario and seed, and each subsystem that
draws draws from its own stream, so changing one (the policy, the warm
start) never moves another's numbers. Every stream is derived here from the
run's seed, under its name; nothing else makes one up.

Streams today: ``warm-start`` (where each warm session is in its tool gap,
:meth:`basin.sim.engine.Simulator._warm_start`) and ``burst-workload`` (the
seed the surge's own workload is built from, :mod:`basin.experiments.runner`).
The arrivals and the synthetic workloads split the run's seed themselves
(:func:`basin.workload.arrivals.draw_arrivals`, :mod:`basin.workload.synthetic`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

WARM_START: Final = "warm-start"
BURST_WORKLOAD: Final = "burst-workload"

#: Each stream's seed material: the words a ``numpy.random.SeedSequence`` is
#: made of, from the run's seed.
_ENTROPY: Final[dict[str, Callable[[int], list[int]]]] = {
    WARM_START: lambda seed: [seed, 7],
    BURST_WORKLOAD: lambda seed: [seed + 1],
}

NAMES: Final = tuple(_ENTROPY)


def entropy(seed: int, name: str) -> list[int]:
    """The seed material of stream ``name`` of a run seeded ``seed``."""
    try:
        derive = _ENTROPY[name]
    except KeyError:
        raise ValueError(f"no random stream named '{name}'; the streams are {', '.join(NAMES)}") from None
    return derive(seed)


def stream(seed: int, name: str) -> np.random.Generator:
    """Stream ``name`` of a run seeded ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(entropy(seed, name)))


def builder_seed(seed: int, name: str) -> int:
    """Stream ``name`` as the one int a builder that seeds itself takes (a
    workload): its seed material must be one word."""
    words = entropy(seed, name)
    if len(words) != 1:
        raise ValueError(f"random stream '{name}' is {len(words)} words, not one seed")
    return words[0]
