"""The catalogue's step-cost formulas, held as plain numbers for the event loop.

The hardware profiles (:mod:`basin.catalog.hardware`) are pydantic models;
their cost methods are the definition. A decode epoch or a prefill step asks
for a cost hundreds of thousands of times a run, and a compiled simulator
calling back into a model's method pays more for the call than for the
arithmetic. These classes copy a profile's coefficients once and evaluate the
same expressions, term for term, so their results are bit-identical to the
profile's (tests/sim/test_costs.py checks them against the methods).
"""

from __future__ import annotations

from basin.catalog import DecodeProfile, PrefillProfile


class DecodeCosts:
    """:meth:`DecodeProfile.step_s` of one profile."""

    __slots__ = ("base_s", "per_request_s", "per_context_token_s", "saturation_batch", "per_request_beyond_s")

    def __init__(self, profile: DecodeProfile) -> None:
        self.base_s: float = profile.step_base_s
        self.per_request_s: float = profile.step_per_request_s
        self.per_context_token_s: float = profile.step_per_context_token_s
        #: -1: no expert saturation.
        sat = profile.expert_saturation_batch
        self.saturation_batch: int = -1 if sat is None else sat
        self.per_request_beyond_s: float = profile.step_per_request_beyond_s

    def step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` requests holding ``context_tokens`` in all."""
        sat = self.saturation_batch
        if sat < 0 or batch <= sat:
            batch_s = self.base_s + self.per_request_s * batch
        else:
            batch_s = self.base_s + self.per_request_s * sat + self.per_request_beyond_s * (batch - sat)
        return batch_s + self.per_context_token_s * context_tokens


class PrefillCosts:
    """:meth:`PrefillProfile.tokens_cost_s` of one profile."""

    __slots__ = ("inverse_linear_tokens_per_s", "attention_s_per_token_position")

    def __init__(self, profile: PrefillProfile) -> None:
        # The profile divides on every call; the quotient is the same number.
        self.inverse_linear_tokens_per_s: float = 1.0 / profile.linear_tokens_per_s
        self.attention_s_per_token_position: float = profile.attention_s_per_token_position

    def tokens_cost_s(self, n_tokens: int, start_position: int) -> float:
        """Compute time of ``n_tokens`` new tokens placed after ``start_position`` earlier ones."""
        return n_tokens * (self.inverse_linear_tokens_per_s
                           + self.attention_s_per_token_position * (start_position + n_tokens / 2.0))
