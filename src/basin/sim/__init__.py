"""The discrete-event simulator of PD-disaggregated agent serving.

Its hot modules can be compiled with mypyc (``make accel``; which ones, and
when a build is used, is :mod:`basin.accel`'s): the compiled and the
pure-Python modules give bit-identical results (tests/sim/test_digests.py
runs both).
"""

from __future__ import annotations


def compiled() -> bool:
    """Whether this process runs the compiled modules (the simulator's and
    the policy driver, built together)."""
    # Lazy: at package import these would load the compiled modules (and the
    # policy package) with every basin.sim submodule, basin.sim.streams too.
    from basin.policy import driver
    from basin.sim import cache

    return all(not (module.__file__ or "").endswith(".py") for module in (cache, driver))
