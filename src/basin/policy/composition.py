"""``composition``: ThunderAgent's admission bound + Crossflow's borrowing +
Continuum's ordering and TTL pinning (the paper's own combination; no public
source describes it).

Wiring (each part is the corresponding baseline object with its defaults):

* admission, pausing and resuming: :class:`ThunderAgentPolicy` (5 s tick,
  ledger against the larger cache tier, new sessions held while paused work
  waits, forced resume after 30 min);
* engine scheduling: :class:`ContinuumPolicy` orders both queues (pinned
  programs first, then program age), pins a session's prefix for its TTL after
  each call, and the decode instance retracts the youngest program first;
* prefill placement: decode instances borrow prefill chunks under the ITL
  lease (``EngineNeeds(decode_runs_prefill=True)``, as ``crossflow``).

Interactions, where the material is silent (defaults of baselines.md):

* a pinned program counts in ThunderAgent's ledger as ACTING with weight 1 and
  no decay while its pin lives (its KV is really resident);
* when ThunderAgent pauses a program its pin is dropped from the ledger; the
  engine keeps the pin to its TTL (at most 2 s under the default rule), since
  pausing does not unpin in the engine;
* ``thunderagent``, ``continuum`` and ``crossflow`` take their parameters as
  dictionaries of the same names.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from basin.policy.base import Admission, ControlDecision, Policy, SessionInfo, Signals
from basin.policy.continuum import ContinuumPolicy
from basin.policy.crossflow import borrow_needs
from basin.policy.thunderagent import ThunderAgentPolicy


class CompositionPolicy(Policy):
    name = "composition"

    def __init__(self, thunderagent: Mapping[str, Any] | None = None, continuum: Mapping[str, Any] | None = None,
                 crossflow: Mapping[str, Any] | None = None):
        self.admission = ThunderAgentPolicy(**dict(thunderagent or {}))
        self.ordering = ContinuumPolicy(**dict(continuum or {}))
        cf = {"margin": 0.1, "chunk_charge_s": 0.0, "min_chunk_tokens": 256, "step_token_budget": None}
        cf.update(crossflow or {})
        self.needs = borrow_needs(**cf)

    def on_session_arrival(self, info: SessionInfo, signals: Signals) -> Admission:
        self.ordering.on_session_arrival(info, signals)
        return self.admission.on_session_arrival(info, signals)

    def attach(self, active: Sequence[SessionInfo], now_s: float) -> None:
        self.ordering.attach(active, now_s)
        self.admission.attach(active, now_s)

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        self.ordering.on_call_issued(uid, prompt_tokens, now_s)
        self.admission.on_call_issued(uid, prompt_tokens, now_s)

    def on_call_held(self, uid: int, now_s: float) -> None:
        self.admission.on_call_held(uid, now_s)

    def on_call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        ttl = self.ordering.on_call_finished(uid, context_tokens, last_call, now_s)
        self.admission.on_call_finished(uid, context_tokens, last_call, now_s)
        p = self.admission.programs.get(uid)
        if p is not None and ttl > 0:
            p.resident_until = now_s + ttl
        return ttl

    def on_session_finished(self, uid: int, now_s: float) -> None:
        self.ordering.on_session_finished(uid, now_s)
        self.admission.on_session_finished(uid, now_s)

    def control(self, signals: Signals, parked: Sequence[int]) -> ControlDecision:
        self.ordering.signals = signals
        d = self.admission.control(signals, parked)
        for uid in d.pause:
            p = self.admission.programs.get(uid)
            if p is not None:
                p.resident_until = -1.0
        return dataclasses.replace(d, order_by_priority=True)

    def priority_key(self, uid: int) -> float | None:
        return self.ordering.priority_key(uid)
