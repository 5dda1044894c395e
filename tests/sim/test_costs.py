"""The simulator's copies of the step-cost formulas equal the catalogue's methods bit for bit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from basin.catalog import load_hardware
from basin.sim.costs import DecodeCosts, PrefillCosts

PROFILES = [load_hardware(name) for name in ("h200", "h100-nvl")]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PROFILES), st.integers(0, 4096), st.integers(0, 2**40), st.booleans())
def test_a_decode_step_costs_what_the_profile_says(hardware, batch, context_tokens, saturate) -> None:
    profile = hardware.decode
    if saturate:  # the expert-saturation branch, whether or not the shipped profile has it
        profile = profile.model_copy(update={"expert_saturation_batch": 64, "step_per_request_beyond_s": 3.1e-5})
    assert DecodeCosts(profile).step_s(batch, context_tokens) == profile.step_s(batch, context_tokens)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PROFILES), st.integers(0, 2**20), st.integers(0, 2**24))
def test_a_prefill_chunk_costs_what_the_profile_says(hardware, n_tokens, start_position) -> None:
    profile = hardware.prefill
    assert PrefillCosts(profile).tokens_cost_s(n_tokens, start_position) == \
        profile.tokens_cost_s(n_tokens, start_position)
