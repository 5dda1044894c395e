"""``composition``: ThunderAgent's admission bound + Crossflow's borrowing +
Continuum's ordering and TTL pinning (the paper's own combination; no public
source describes it).

Wiring (each part is the corresponding baseline object, with its defaults
unless :class:`CompositionParams` says otherwise):

* admission, pausing and resuming: :class:`ThunderAgentPolicy` (5 s tick,
  ledger against the larger cache tier, new sessions held while paused work
  waits, forced resume after 30 min);
* engine scheduling: :class:`ContinuumPolicy` orders both queues (pinned
  programs first, then program age), pins a session's prefix for its TTL after
  each call, and the decode instance retracts the youngest program first;
* prefill placement: decode instances borrow prefill chunks under the ITL
  lease (``EngineNeeds(decode_prefill_borrowing=...)``, as ``crossflow``).

Interactions, where the material is silent (defaults of baselines.md):

* a pinned program counts in ThunderAgent's ledger as ACTING with weight 1 and
  no decay while its pin lives (its KV is really resident);
* when ThunderAgent pauses a program its pin is dropped from the ledger; the
  engine keeps the pin to its TTL (at most 2 s under the default rule), since
  pausing does not unpin in the engine;
* the parts' settings are the nested ``thunderagent``, ``continuum`` and
  ``crossflow`` fields of :class:`CompositionParams` (each given as its
  parameter class or a mapping of its fields); Continuum's utility rule
  needs the reload costs handed in (``CompositionPolicy(params, costs=...)``);
* :meth:`CompositionPolicy.update_params` merges a mapping given for a part
  into that part's current settings (``crossflow={"margin": 0.2}`` keeps the
  other Crossflow fields); a parameter object replaces them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from basin.policy.base import Admission, ControlDecision, EngineNeeds, Handed, Policy, SessionInfo, Signals
from basin.policy.continuum import ContinuumParams, ContinuumPolicy, ReloadCosts
from basin.policy.crossflow import CrossflowParams
from basin.policy.params import PolicyParams
from basin.policy.thunderagent import ThunderAgentParams, ThunderAgentPolicy

if TYPE_CHECKING:
    from typing import Self


@dataclass(frozen=True, slots=True)
class CompositionParams(PolicyParams):
    """The settings of each part."""

    policy = "composition"

    thunderagent: ThunderAgentParams = field(default_factory=ThunderAgentParams)
    continuum: ContinuumParams = field(default_factory=ContinuumParams)
    crossflow: CrossflowParams = field(default_factory=CrossflowParams)


class CompositionPolicy(Policy):
    name = "composition"

    Params = CompositionParams
    params: CompositionParams

    HANDED = frozenset({"reload_costs"})

    @classmethod
    def build(cls, params: PolicyParams, handed: Handed) -> Self:
        return cls(params, costs=handed.reload_costs)  # type: ignore[arg-type]  # _own refuses a wrong class

    def __init__(self, params: CompositionParams | None = None, *, costs: ReloadCosts | None = None):
        super().__init__(params)
        self.admission = ThunderAgentPolicy(self.params.thunderagent)
        self.ordering = ContinuumPolicy(self.params.continuum, costs=costs)

    @property
    def needs(self) -> EngineNeeds:
        return EngineNeeds(prefix_pins=True, decode_prefill_borrowing=self.params.crossflow.borrow_settings())

    def update_params(self, **changes: object) -> CompositionParams:
        """Change the parts' settings; a mapping for a part is merged into its
        current settings. Checked before anything changes."""
        merged: dict[str, object] = {}
        for name, value in changes.items():
            current = getattr(self.params, name, None)
            if isinstance(current, PolicyParams) and isinstance(value, Mapping):
                value = current.with_params(**value)
            merged[name] = value
        new = self.params.with_params(**merged)
        self.ordering.replace_params(new.continuum)  # refuses the utility rule without costs
        self.admission.params = new.thunderagent
        self.params = new
        return new

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
