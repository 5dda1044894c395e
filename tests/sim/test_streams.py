"""The simulator's random streams by name (basin.sim.streams): exactly the
streams the results were made with, and nothing made up elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from basin.sim.streams import BURST_WORKLOAD, NAMES, WARM_START, builder_seed, entropy, stream

SRC = Path(__file__).resolve().parents[2] / "src" / "basin"


def test_the_streams_are_the_ones_the_results_were_made_with():
    for seed in (0, 1, 42):
        want = np.random.default_rng(np.random.SeedSequence([seed, 7])).uniform(size=5)
        assert np.array_equal(stream(seed, WARM_START).uniform(size=5), want)
        assert builder_seed(seed, BURST_WORKLOAD) == seed + 1
    assert set(NAMES) == {WARM_START, BURST_WORKLOAD}


def test_an_unknown_stream_or_a_multiword_one_as_a_seed_is_refused():
    with pytest.raises(ValueError, match="no random stream named 'arrivals'.*warm-start"):
        entropy(0, "arrivals")
    with pytest.raises(ValueError, match="not one seed"):
        builder_seed(0, WARM_START)


def test_the_simulator_and_the_runner_make_no_stream_of_their_own():
    """No SeedSequence, default_rng or seed arithmetic in the simulator or
    the runner: their streams come from basin.sim.streams."""
    for path in [*SRC.joinpath("sim").glob("*.py"), SRC / "experiments" / "runner.py"]:
        if path.name == "streams.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("SeedSequence", "default_rng"), f"{path.name}:{node.lineno}"
            if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Attribute) and node.left.attr == "seed":
                raise AssertionError(f"{path.name}:{node.lineno}: a seed derived in place")
