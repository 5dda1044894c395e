"""``crossflow``: decode-side elastic prefill (Crossflow), on HiCache.

Sessions are admitted at arrival and both queues stay first-come first-served
(as ``hicache``); the difference is in the engine: decode instances run
prefill chunks of requests waiting in a prefill queue, under a lease that
keeps each mixed step within the 50 ms ITL SLO, prefill and decode sharing the
mixed step's token budget. The mechanism is :mod:`basin.sim.borrow`, asked for
with ``EngineNeeds(decode_prefill_borrowing=BorrowSettings(...))``, the
settings coming from :class:`CrossflowParams`.

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

The settings are read by the driver when it builds the engine (from
``needs``); a later ``update_params`` changes ``needs`` but not an engine
already running.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from basin.policy.base import BorrowSettings, EngineNeeds, Policy
from basin.policy.params import PolicyParams


@dataclass(frozen=True, slots=True)
class CrossflowParams(PolicyParams):
    """The borrowing lease's settings (see the module docstring)."""

    policy = "crossflow"

    #: A mixed step is planned to at most ``(1 - margin)`` of the ITL SLO.
    margin: float = 0.1
    #: Fixed extra time per borrowed chunk.
    chunk_charge_s: float = 0.0
    #: A decode instance borrows only when at least this many tokens fit.
    min_chunk_tokens: int = 256
    #: Tokens per mixed step shared by prefill and decode (None: the prefill chunk size).
    step_token_budget: int | None = None

    def check(self) -> None:
        # margin 1 would plan mixed steps to 0 s: nothing could be borrowed.
        self.require(0 <= self.margin < 1, "margin", "must be in [0, 1)")
        self.require(0 <= self.chunk_charge_s < math.inf, "chunk_charge_s", "must be a finite number >= 0")
        self.require(self.min_chunk_tokens >= 1, "min_chunk_tokens", "must be >= 1")
        if self.step_token_budget is not None:
            self.require(self.step_token_budget >= 1, "step_token_budget", "must be >= 1 (or null)")

    def borrow_settings(self) -> BorrowSettings:
        return BorrowSettings(margin=self.margin, chunk_charge_s=self.chunk_charge_s,
                              min_chunk_tokens=self.min_chunk_tokens, step_token_budget=self.step_token_budget)


class CrossflowPolicy(Policy):
    name = "crossflow"

    Params = CrossflowParams
    params: CrossflowParams

    def __init__(self, params: CrossflowParams | None = None):
        super().__init__(params)

    @property
    def needs(self) -> EngineNeeds:
        return EngineNeeds(decode_prefill_borrowing=self.params.borrow_settings())
