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
    pre, dec = hardware.prefill, hardware.decode
    total = 0.0
    last = len(calls) - 1
    for k, c in enumerate(calls):
        total += pre.step_overhead_s + pre.tokens_cost_s(c.new_tokens, c.reused_tokens) + hardware.transfer_s
        m = max(c.output_tokens - 1, 0)
        total += m * dec.step_s(1, c.prompt_tokens + 1) + dec.step_per_context_token_s * m * (m - 1) / 2.0
        if k < last:
            total += c.tool_gap_s
    return float(total)
