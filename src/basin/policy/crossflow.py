"""``crossflow``: decode-side elastic prefill (Crossflow), on HiCache.

Sessions are admitted at arrival and both queues stay first-come first-served
(as ``hicache``); the difference is in the engine: decode instances run
prefill chunks of requests waiting in a prefill queue, under a lease that
keeps each mixed step within the 50 ms ITL SLO, prefill and decode sharing the
mixed step's token budget. The mechanism is :mod:`basin.sim.borrow`, enabled
by ``EngineNeeds(decode_runs_prefill=True)``; its parameters travel in
``EngineNeeds.extra["borrow"]``.

No public source describes Crossflow itself; the rule follows the two public
designs it matches (prefill deflection to decode nodes under a TBT SLO, and
flexible decode). Assumptions (all parameters):

* ``margin=0.1``: a mixed step is planned to at most 90% of the ITL SLO;
* ``chunk_charge_s=0``: no fixed charge per borrowed chunk (the paper's
  sensitivity test used 20 ms);
* ``min_chunk_tokens=256``: a decode instance borrows only when at least
  that many tokens fit under the SLO;
* ``step_token_budget=None``: the shared budget is the prefill chunk size
  (8192 tokens), minus one token per decoding request;
* a borrowing decode instance takes waiting requests that reserved their
  decode memory on it (the KV decodes where it was computed), in the prefill
  queue's order, and is triggered whenever such a request waits: the prefill
  queue is non-empty;
* the borrowed request matches and fills the prefill instance's radix cache
  (its cached prefix is sent over, the computed part sent back), so reuse is
  unchanged by where it is computed; see :mod:`basin.sim.borrow`.
"""

from __future__ import annotations

from basin.policy.base import EngineNeeds, Policy


def borrow_needs(margin: float, chunk_charge_s: float, min_chunk_tokens: int,
                 step_token_budget: int | None) -> EngineNeeds:
    params: dict[str, object] = {"margin": margin, "chunk_charge_s": chunk_charge_s,
                                 "min_chunk_tokens": min_chunk_tokens}
    if step_token_budget is not None:
        params["step_token_budget"] = step_token_budget
    return EngineNeeds(decode_runs_prefill=True, extra={"borrow": params})


class CrossflowPolicy(Policy):
    name = "crossflow"

    def __init__(self, margin: float = 0.1, chunk_charge_s: float = 0.0, min_chunk_tokens: int = 256,
                 step_token_budget: int | None = None):
        self.needs = borrow_needs(margin, chunk_charge_s, min_chunk_tokens, step_token_budget)
