"""A session's unloaded time: the reference its slowdown is measured against.

One definition for the simulator and the real load client: its tool gaps plus,
per call, the new suffix's prefill (after the reused prefix), the fixed
overheads and the KV transfer, and batch-one decode of its output, all at the
catalogue's calibrated costs of the deployment's hardware.
"""

from __future__ import annotations

from collections.abc import Sequence

from basin.catalog import HardwareProfile
from basin.workload.records import Call


def unloaded_reference_s(calls: Sequence[Call], hardware: HardwareProfile) -> float:
    """Unloaded time of ``calls`` (a session, or its calls from where it joined)."""
    # The profiles' cost formulas with their constants read once (every run
    # computes this for each of its sessions); the arithmetic is theirs, term
    # for term, so the result is the same to the last bit.
    pre, dec = hardware.prefill, hardware.decode
    fixed_s, transfer_s = pre.step_overhead_s, hardware.transfer_s
    per_token_s, per_position_s = 1.0 / pre.linear_tokens_per_s, pre.attention_s_per_token_position
    batch_one_s, per_context_s = dec.batch_s(1), dec.step_per_context_token_s
    total = 0.0
    last = len(calls) - 1
    for k, c in enumerate(calls):
        prompt, new = c.prompt_tokens, c.new_tokens
        # PrefillProfile.tokens_cost_s(new, reused), then the fixed overheads.
        total += fixed_s + new * (per_token_s + per_position_s * ((prompt - new) + new / 2.0)) + transfer_s
        m = max(c.output_tokens - 1, 0)
        # DecodeProfile.step_s(1, context) per step, plus the context growing by one a step.
        total += m * (batch_one_s + per_context_s * (prompt + 1)) + per_context_s * m * (m - 1) / 2.0
        if k < last:
            total += c.tool_gap_s
    return float(total)
