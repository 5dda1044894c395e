"""The decision interface between a driver (the simulator or the gateway) and a
control policy.

A policy is a pure decision object: it is handed signals and events and
answers with decisions. It never reads a clock, a socket or the engine's
internals; time arrives as ``now_s`` in what it is handed. The same policy
object therefore runs under the simulator and under the real gateway.

Events in: a session arrived (its first call is ready), a call was issued, a
call finished, a session finished, and a periodic control tick with the
current signals.
Decisions out: admit / park / shed a new session; which parked sessions to
release or shed; whether both engine queues are ordered by the policy's
session priority; whether decode memory is lent as cache; which admitted
sessions to pause or resume at their next turn boundary; how long to pin a
session's cached prefix after a call (TTL); when to tick next. Engine
mechanisms a policy needs (reservation at prefill completion, lending) are
declared up front in :class:`EngineNeeds`. Settings live in one frozen
:class:`~basin.policy.params.PolicyParams` per policy and change only through
:meth:`Policy.update_params`.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from basin.policy.params import PolicyParams

if TYPE_CHECKING:
    from typing import Self

    from basin.policy.basin import CliffSummary, PeakPredictor
    from basin.policy.continuum import ReloadCosts

#: What a run can hand a policy when it builds one (:attr:`Policy.HANDED`):
#: BASIN's offline cliff profile, a fitted peak-context predictor, the
#: deployment's prefill costs as KV reload costs.
Ingredient = Literal["cliff", "predictor", "reload_costs"]


@dataclass(frozen=True, slots=True)
class Handed:
    """What a run hands a policy at build time: only what its class asks for
    in :attr:`Policy.HANDED`, the rest None (``basin.systems`` fills it in)."""

    cliff: CliffSummary | None = None
    predictor: PeakPredictor | None = None
    #: The predictor as named in the run's settings (for messages).
    predictor_spec: str | None = None
    reload_costs: ReloadCosts | None = None


class Admission(enum.Enum):
    ADMIT = "admit"
    PARK = "park"
    SHED = "shed"


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What is visible of a session when its first call arrives."""

    uid: int
    session_id: str
    tag: str
    arrival_s: float
    first_prompt_tokens: int
    task_text: str | None = None
    #: The session's true peak context. Only oracle ablations may read it;
    #: the gateway never knows it (None there).
    oracle_peak_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class EngineFigures:
    """What the host measures of its engine at a decision point (the engine's
    part of :class:`Signals`). Token quantities are totals over the
    deployment; ``hit_rate`` is the prefix hit rate of recent calls (NaN when
    none finished recently)."""

    hit_rate: float
    prefill_queue_requests: int
    prefill_backlog_tokens: int
    decode_wait_requests: int
    decode_used_fraction: float
    gpu_cache_tokens: int
    host_cache_tokens: int
    #: Prefix the two prefill tiers keep together, ``max(gpu, host)``
    #: (:func:`basin.catalog.effective_cache_tokens`).
    effective_cache_tokens: int
    lent_cache_tokens: int
    decode_kv_tokens: int
    #: Age of the engine-side figures (0 in simulation; the gateway reports
    #: its scrape age, and a policy should act safely when it grows).
    stale_s: float = 0.0


#: The fields of :class:`EngineFigures`, in order (a :class:`Signals` starts with them).
ENGINE_FIGURES: tuple[str, ...] = tuple(EngineFigures.__dataclass_fields__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Signals(EngineFigures):
    """Engine and gateway state at a decision point: the host's engine
    figures and the driver's account of the sessions (given by keyword)."""

    now_s: float
    active_sessions: int
    parked_sessions: int
    working_set_tokens: int
    mean_context_tokens: float
    arrival_rate_per_min: float


@dataclass(frozen=True, slots=True)
class ControlDecision:
    """What a control tick changes. Empty fields leave things as they are."""

    release: tuple[int, ...] = ()
    shed: tuple[int, ...] = ()
    pause: tuple[int, ...] = ()
    resume: tuple[int, ...] = ()
    order_by_priority: bool = False
    lend_decode_memory: bool = False
    next_tick_s: float = 30.0


@dataclass(frozen=True, slots=True)
class BorrowSettings:
    """Decode instances running prefill chunks under an ITL lease (Crossflow)."""

    #: The lease keeps a mixed step within ``(1 - margin)`` of the ITL SLO.
    margin: float = 0.1
    #: Fixed extra time per borrowed chunk (the paper's sensitivity test: 20 ms).
    chunk_charge_s: float = 0.0
    #: A decode instance borrows only when at least this many tokens fit.
    min_chunk_tokens: int = 256
    #: Tokens per mixed step shared by prefill and decode (None: the prefill chunk size).
    step_token_budget: int | None = None


@dataclass(frozen=True, slots=True)
class EngineNeeds:
    """Engine mechanisms a policy relies on; its driver enables them.

    A *preferred* mechanism improves the policy but it runs without one (a
    gateway in front of an unmodified engine cannot move decode reservation);
    a *required* one is part of what the policy is, so a driver that cannot
    provide it must refuse the policy rather than run something else under
    its name.
    """

    #: Reserve decode KV when prefill completes instead of before it (preferred).
    reserve_decode_at_prefill_completion: bool = False
    #: Lend idle decode memory to the prefill side as a cache tier (required when on).
    decode_memory_lending: bool = False
    #: Lent memory never exceeds this share of decode memory (phi).
    lend_cap_fraction: float = 0.5
    #: Pin a session's cached prefix for the TTL ``on_call_finished`` returns (required when on).
    prefix_pins: bool = False
    #: Decode instances run prefill chunks (required when set).
    decode_prefill_borrowing: BorrowSettings | None = None

    def required(self) -> tuple[str, ...]:
        """The required mechanisms, in words an operator reads."""
        out = []
        if self.decode_memory_lending:
            out.append("decode-memory lending")
        if self.prefix_pins:
            out.append("prefix-cache TTL pins")
        if self.decode_prefill_borrowing is not None:
            out.append("prefill on decode instances")
        return tuple(out)

    def preferred(self) -> tuple[str, ...]:
        return ("decode reservation at prefill completion",) if self.reserve_decode_at_prefill_completion else ()


class NoParams(PolicyParams):
    """Parameters of a policy that has none."""


class Policy:
    """Base class: admit everything, order nothing, pin nothing.

    Subclasses override what they decide. ``name`` is the registry name.
    """

    name: ClassVar[str] = "base"
    #: The policy's parameter class; ``params`` is an instance of it.
    Params: ClassVar[type[PolicyParams]] = NoParams
    #: What the policy is built with besides its parameters (:meth:`build`).
    HANDED: ClassVar[frozenset[Ingredient]] = frozenset()
    #: A subclass without parameters need not call ``__init__``.
    params: PolicyParams = NoParams()

    def __init__(self, params: PolicyParams | None = None) -> None:
        self.params = self._own(params)

    @classmethod
    def build(cls, params: PolicyParams, handed: Handed) -> Self:
        """The policy for a run, from its checked parameters and what the run
        hands it; a policy that asks for more in :attr:`HANDED` overrides this."""
        return cls(params)

    def describe(self) -> dict[str, object]:
        """What a run's provenance and the gateway's state record of how the
        policy was built (its parameters are recorded separately): plain values."""
        return {}

    def _own(self, params: PolicyParams | None) -> PolicyParams:
        if params is None:
            return self.Params()
        if not isinstance(params, self.Params):
            raise TypeError(f"policy '{self.name}' takes {self.Params.__name__}, got {type(params).__name__}")
        return params

    @property
    def needs(self) -> EngineNeeds:
        """Engine mechanisms this policy relies on, for its current parameters."""
        return EngineNeeds()

    def needs_with(self, params: PolicyParams) -> EngineNeeds:
        """The engine mechanisms this policy would need with ``params`` (a
        driver checks a change before making it)."""
        current = self.params
        self.params = self._own(params)
        try:
            return self.needs
        finally:
            self.params = current

    def update_params(self, **changes: object) -> PolicyParams:
        """Change settings between decisions (a gateway's admin API): checked
        as a new instance would be, so a bad value leaves the old settings."""
        self.params = self.params.with_params(**changes)
        return self.params

    def on_session_arrival(self, info: SessionInfo, signals: Signals) -> Admission:
        return Admission.ADMIT

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        """A session's next call left the client (its tool gap is over)."""
        return None

    def on_call_held(self, uid: int, now_s: float) -> None:
        """A paused session's next call is ready and held until it is resumed."""
        return None

    def on_call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        """Returns seconds to pin the session's cached prefix (0: no pin)."""
        return 0.0

    def on_session_finished(self, uid: int, now_s: float) -> None:
        return None

    def attach(self, active: Sequence[SessionInfo], now_s: float) -> None:
        """Take over sessions that were admitted before this policy was switched on."""
        return None

    def control(self, signals: Signals, parked: Sequence[int]) -> ControlDecision:
        """Periodic tick. ``parked`` lists parked session uids in arrival order."""
        return ControlDecision(next_tick_s=30.0)

    def between_steps(self, signals: Signals, parked: Collection[int]) -> tuple[int, ...]:
        """Between two control steps, when its host learns of a change (a
        gateway: each arrival, a call's end, a session's end): bring the
        admission gate up to date with ``signals``, without the adaptation a
        step makes, and name parked sessions to release now. A host that ticks
        densely enough need not call it (the simulator does not). Default:
        nothing changes."""
        return ()

    def on_prompt_counted(self, info: SessionInfo) -> None:
        """The engine counted a session's first prompt (``info.first_prompt_tokens``;
        0 when it refused the call before any count): an estimate made from the
        request body gives way to it. Called by hosts that estimate (a gateway)."""
        return None

    def persisted_state(self) -> dict[str, object] | None:
        """The policy's own state between decisions, as JSON values, for a host
        that keeps it across restarts (a gateway's state store); None: the
        policy keeps nothing a restart would lose, or cannot hand it over."""
        return None

    def persisted_session(self, uid: int) -> dict[str, object] | None:
        """One session's part of that state (read when the session changes)."""
        return None

    def restore(self, state: Mapping[str, Any], sessions: Mapping[int, Mapping[str, Any]]) -> None:
        """Take back, after a restart, what :meth:`persisted_state` and
        :meth:`persisted_session` gave (only called when the former is not None)."""
        raise NotImplementedError(f"policy '{self.name}' keeps no state across restarts")

    def limiting_admission(self) -> bool:
        """True while the policy's own admission gate is engaged, whether or
        not anyone waits at it now (read for the run's action record, never by
        the engine; a policy without such a gate: never)."""
        return False

    def priority_key(self, uid: int) -> float | None:
        """Fixed session priority for both engine queues (lower first);
        None keeps arrival order for that session."""
        return None
