"""``continuum``: program-level ordering and TTL pinning (Continuum, arXiv 2511.02230).

What it decides
---------------
* **Ordering.** Both engine queues (prefill and the wait for decode memory)
  are ordered by program age: a request whose session holds a live pin when
  the request is issued goes first, oldest program first; every other
  request follows by its session's arrival time (program first-entry time).
  The arrival time of the individual request does not matter. The key is
  fixed when the call is issued (the engine reads it then).
* **TTL pinning.** When a call that is not the session's last finishes, the
  session's cached prefix may be pinned (locked against eviction) for a TTL.
  Two rules, chosen by ``ttl_mode``:

  - ``"code"`` (default, the only rule visible in the public code): pin for
    ``fixed_ttl_s`` (2 s) when the running mean of the observed tool
    durations of the call's *tool class* is at most ``threshold_s`` (2 s), or
    when the class has no observation yet.
  - ``"utility"`` (the paper's rule, reconstructed): choose the TTL among 0
    and the class's observed durations that maximises
    ``F(tau) * (R + Q) - m * S * E[min(T, tau)]``; see :meth:`_utility_ttl`.

* **Preemption of the youngest program.** Under decode-memory pressure the
  engine retracts the running request whose session has the largest priority
  key (the youngest unpinned program) while the queues are ordered.

Assumptions where the public material is silent (all parameters)
----------------------------------------------------------------
* ``tool_class="session"`` (default): our trajectories carry no tool names
  (the public code keys the duration mean on the first word of the bash
  command), so each session's calls form one class. ``"global"`` pools every
  session (with Terminal-Bench gaps, mean 12 s, that never pins).
* A tool duration is observed as the time from a call's finish to the
  session's next call being issued (the code's definition).
* The engine ends a pin when the session's next call is issued (the call's
  prefill then matches and locks its prefix itself) or when the TTL runs out.
  The public code keeps the old pin until the next call *finishes* and lets
  it expire only when nothing is waiting; in PD serving the request's wait for
  decode memory is then unprotected here. Pins live in the prefill instance's
  prefix cache; the code's "release the pin with the latest expiry when at
  most one request runs" has no counterpart there (pins are at most a few
  seconds long under the default rule).
* Utility rule: the empirical CDF of a class is kept over its 64 most recent
  durations (the pooled one over 512); ``n_min=5`` observations before a
  class uses its own CDF (the pooled CDF before that); ``R`` is the reload
  cost of the context (recompute, or host load-back when a host tier exists,
  whichever is cheaper) and ``Q`` the prefill backlog at the last control
  tick in seconds, both from the :class:`ReloadCosts` the policy is handed
  (facts of the hardware, not settings: the rule is refused without them);
  ``m`` is ``1 / C_dev`` when a queue is non-empty, else 0; TTL capped at
  ``tau_max_s`` (60 s).

Settings are :class:`ContinuumParams`. Durations are recorded per session
and pooled whatever the rule, so ``update_params`` may switch ``ttl_mode``
or ``tool_class`` during a run and the new rule starts from what was seen.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from basin.errors import BasinInputError
from basin.policy.base import Admission, ControlDecision, EngineNeeds, Handed, Policy, SessionInfo, Signals
from basin.policy.params import PolicyParamError, PolicyParams

if TYPE_CHECKING:
    from typing import Self

#: Pinned sessions' keys are shifted this far ahead of every arrival time.
PINNED_OFFSET = 1e12
#: Recent durations kept per tool class for the utility rule's CDF.
CLASS_SAMPLES = 64
#: Recent durations kept in the pooled CDF (every session's).
POOLED_SAMPLES = 8 * CLASS_SAMPLES


@dataclass(frozen=True, slots=True)
class ContinuumParams(PolicyParams):
    """Continuum's settings (see the module docstring for each rule)."""

    policy = "continuum"

    #: ``"code"``: the public code's fixed pin; ``"utility"``: the paper's rule.
    ttl_mode: Literal["code", "utility"] = "code"
    #: Pin length of the code rule.
    fixed_ttl_s: float = 2.0
    #: The code rule pins while the class's mean tool duration is at most this.
    threshold_s: float = 2.0
    #: ``"session"``: a session's calls form one tool class; ``"global"``: one class.
    tool_class: Literal["session", "global"] = "session"
    #: Observations before a class uses its own CDF (utility rule).
    n_min: int = 5
    #: The utility rule's TTL is at most this.
    tau_max_s: float = 60.0
    #: Control tick.
    tick_s: float = 5.0

    def check(self) -> None:
        self.require(self.fixed_ttl_s >= 0, "fixed_ttl_s", "must be >= 0")
        self.require(self.threshold_s >= 0, "threshold_s", "must be >= 0")
        # A class holds at most CLASS_SAMPLES durations, so a larger n_min
        # would silently never use the class's own CDF.
        self.require(1 <= self.n_min <= CLASS_SAMPLES, "n_min",
                     f"must be between 1 and {CLASS_SAMPLES} (the durations kept per class)")
        self.require(self.tau_max_s > 0, "tau_max_s", "must be > 0")
        self.require(self.tick_s > 0 and math.isfinite(self.tick_s), "tick_s", "must be a finite number > 0")


@dataclass(frozen=True, slots=True)
class ReloadCosts:
    """What it costs the prefill side to get a context back, for the utility
    TTL rule: facts of the hardware (and deployment), not policy settings.

    * ``linear_tokens_per_s`` and ``attention_s_per_token_position``: the
      prefill compute model, recomputing ``n`` tokens from position 0 taking
      ``n * (1 / linear_tokens_per_s + attention_s_per_token_position * n / 2)``
      seconds (the prefill profile's fields of the same names);
    * ``load_tokens_per_s``: host-tier load-back bandwidth in tokens of KV per
      second (the profile's ``load_tokens_per_s``);
    * ``backlog_tokens_per_s``: the rate at which the deployment's prefill
      backlog drains, turning ``Signals.prefill_backlog_tokens`` into seconds
      of queueing. No profile field is this rate: it lies below the linear
      rate by each chunk's step overhead and the attention cost at the queued
      prompts' positions, which depend on the workload, and it grows with the
      number of prefill instances. The former constant, 55,000 tokens/s, is
      10/11 of the H200's linear rate (60,500): a flat allowance of about 9%
      for overhead and attention, not a measurement.
      :meth:`from_prefill` keeps that ratio, ``prefill_instances *
      linear_tokens_per_s * 10 / 11``, unless it is handed a measured rate.
      (The former constant ignored the instance count; one instance, the
      default, reproduces it.)

    The constructor takes plain numbers (tokens per second, seconds per token
    and position).
    """

    linear_tokens_per_s: float
    attention_s_per_token_position: float
    load_tokens_per_s: float
    backlog_tokens_per_s: float

    def __post_init__(self) -> None:
        for name in ("linear_tokens_per_s", "attention_s_per_token_position", "load_tokens_per_s",
                     "backlog_tokens_per_s"):
            value = getattr(self, name)
            zero_ok = name == "attention_s_per_token_position"
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and (value >= 0 if zero_ok else value > 0) and value < math.inf):
                raise BasinInputError(f"continuum reload costs: '{name}' must be a finite number "
                                      f"{'>= 0' if zero_ok else '> 0'}, got {value!r}")
            object.__setattr__(self, name, float(value))

    @classmethod
    def from_prefill(cls, profile: Any, *, prefill_instances: int = 1,
                             backlog_tokens_per_s: float | None = None) -> ReloadCosts:
        """Costs from a prefill hardware profile: any object (or mapping) with
        ``linear_tokens_per_s``, ``attention_s_per_token_position`` and
        ``load_tokens_per_s``, such as ``HardwareProfile.prefill``.

        ``backlog_tokens_per_s`` is the deployment's backlog drain rate when
        it is known; otherwise ``prefill_instances`` times
        ``linear_tokens_per_s * 10 / 11`` (see the class docstring; for the
        H200 profile and one instance, exactly the former 55,000 tokens/s).
        """
        def get(name: str) -> Any:
            if isinstance(profile, Mapping):
                if name not in profile:
                    raise BasinInputError(f"continuum reload costs: the prefill profile has no '{name}'")
                return profile[name]
            try:
                return getattr(profile, name)
            except AttributeError:
                raise BasinInputError(f"continuum reload costs: the prefill profile has no '{name}'") from None

        if isinstance(prefill_instances, bool) or not isinstance(prefill_instances, int) or prefill_instances < 1:
            raise BasinInputError(f"continuum reload costs: prefill_instances must be a whole number >= 1, "
                                  f"got {prefill_instances!r}")
        linear = get("linear_tokens_per_s")
        if backlog_tokens_per_s is None:
            if isinstance(linear, (int, float)) and not isinstance(linear, bool):
                # Written as * 10 / 11 (not * 0.909...) so 60,500 gives 55,000.0 exactly.
                backlog_tokens_per_s = prefill_instances * (linear * 10.0 / 11.0)
            else:
                backlog_tokens_per_s = linear  # refused below, naming the field
        return cls(linear_tokens_per_s=linear,
                   attention_s_per_token_position=get("attention_s_per_token_position"),
                   load_tokens_per_s=get("load_tokens_per_s"),
                   backlog_tokens_per_s=backlog_tokens_per_s)

    def recompute_s(self, tokens: int) -> float:
        """Seconds to recompute ``tokens`` of context from position 0."""
        return tokens * (1.0 / self.linear_tokens_per_s + self.attention_s_per_token_position * tokens / 2.0)


class _Durations:
    """Observed tool durations of one class: a running mean (every
    observation) and, for the utility rule, the most recent ``keep`` of them."""

    __slots__ = ("n", "total", "recent", "keep", "_sorted")

    def __init__(self, keep: int = 0) -> None:
        self.n = 0
        self.total = 0.0
        self.keep = keep
        self.recent: deque[float] = deque(maxlen=keep or None)
        self._sorted: list[float] | None = None

    def add(self, d: float) -> None:
        self.n += 1
        self.total += d
        if self.keep:
            self.recent.append(d)
            self._sorted = None

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    @property
    def samples(self) -> int:
        return len(self.recent)

    def best_ttl(self, value_s: float, price: float, tokens: int, tau_max_s: float) -> float:
        """argmax over tau in {0} and the observed durations (up to
        ``tau_max_s``) of ``F(tau) value - price tokens E[min(T, tau)]``."""
        if self._sorted is None:
            self._sorted = sorted(self.recent)
        xs = self._sorted
        n = len(xs)
        best_tau, best = 0.0, 0.0
        below = 0.0
        i = 0
        while i < n:
            tau = xs[i]
            if tau > tau_max_s:
                break
            while i < n and xs[i] == tau:  # ties: F jumps by all of them
                below += xs[i]
                i += 1
            gain = (i / n) * value_s - price * tokens * (below + tau * (n - i)) / n
            if gain > best + 1e-12:
                best_tau, best = tau, gain
        return best_tau


class ContinuumPolicy(Policy):
    name = "continuum"

    Params = ContinuumParams
    params: ContinuumParams

    HANDED = frozenset({"reload_costs"})

    @classmethod
    def build(cls, params: PolicyParams, handed: Handed) -> Self:
        return cls(params, costs=handed.reload_costs)  # type: ignore[arg-type]  # _own refuses a wrong class

    def __init__(self, params: ContinuumParams | None = None, *, costs: ReloadCosts | None = None):
        if costs is not None and not isinstance(costs, ReloadCosts):
            raise TypeError(f"policy 'continuum' takes costs=ReloadCosts, got {type(costs).__name__}")
        self.costs = costs
        self.params = self._needs_costs(self._own(params))
        self.arrival: dict[int, float] = {}
        self.pinned_until: dict[int, float] = {}
        self.keys: dict[int, float] = {}
        self.finished_at: dict[int, float] = {}
        # Durations are kept for either rule (the code rule reads only the
        # means), so a switch of ttl_mode or tool_class finds them.
        self.classes: dict[int, _Durations] = {}
        self.pooled = _Durations(keep=POOLED_SAMPLES)
        self.signals: Signals | None = None

    def _needs_costs(self, params: PolicyParams) -> ContinuumParams:
        """``params``, refused if they choose the utility rule and no costs were handed in."""
        assert isinstance(params, ContinuumParams)  # _own and with_params keep the class
        if params.ttl_mode == "utility" and self.costs is None:
            raise PolicyParamError(
                params.policy, "ttl_mode",
                "'utility' needs the prefill reload costs, and none were handed in "
                "(ContinuumPolicy(params, costs=ReloadCosts.from_prefill(hardware.prefill)))")
        return params

    @property
    def needs(self) -> EngineNeeds:
        return EngineNeeds(prefix_pins=True)

    def update_params(self, **changes: object) -> ContinuumParams:
        self.params = self._needs_costs(self.params.with_params(**changes))
        return self.params

    def replace_params(self, params: ContinuumParams) -> None:
        """Take a whole new set of settings (checked; a composition's part)."""
        self.params = self._needs_costs(self._own(params))

    # ------------------------------------------------------------- sessions
    def on_session_arrival(self, info: SessionInfo, signals: Signals) -> Admission:
        self.arrival[info.uid] = info.arrival_s
        self.signals = signals
        return super().on_session_arrival(info, signals)

    def attach(self, active: Sequence[SessionInfo], now_s: float) -> None:
        for info in active:
            self.arrival.setdefault(info.uid, info.arrival_s)

    def on_session_finished(self, uid: int, now_s: float) -> None:
        self.arrival.pop(uid, None)
        self.pinned_until.pop(uid, None)
        self.keys.pop(uid, None)
        self.finished_at.pop(uid, None)
        self.classes.pop(uid, None)

    def _own_class(self, uid: int) -> _Durations:
        d = self.classes.get(uid)
        if d is None:
            d = self.classes[uid] = _Durations(keep=CLASS_SAMPLES)
        return d

    def _class(self, uid: int) -> _Durations:
        if self.params.tool_class == "global":
            return self.pooled
        return self._own_class(uid)

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        arrival = self.arrival.get(uid)
        if arrival is not None:
            self.keys[uid] = arrival - PINNED_OFFSET if self.pinned(uid, now_s) else arrival
        t0 = self.finished_at.pop(uid, None)
        if t0 is not None:
            d = max(now_s - t0, 0.0)
            self._own_class(uid).add(d)
            self.pooled.add(d)

    def on_call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        self.pinned_until.pop(uid, None)
        if last_call:
            return 0.0
        self.finished_at[uid] = now_s
        ttl = self.ttl_for(uid, context_tokens)
        if ttl > 0.01:
            self.pinned_until[uid] = now_s + ttl
            return ttl
        return 0.0

    # ------------------------------------------------------------------ TTL
    def ttl_for(self, uid: int, context_tokens: int) -> float:
        p = self.params
        if p.ttl_mode == "code":
            return p.fixed_ttl_s if self._class(uid).mean <= p.threshold_s else 0.0
        return self._utility_ttl(uid, context_tokens)

    def _costs(self) -> ReloadCosts:
        if self.costs is None:  # refused when the rule is chosen; kept for type checkers
            raise BasinInputError("policy 'continuum': the utility rule needs the prefill reload costs")
        return self.costs

    def reload_cost_s(self, tokens: int) -> float:
        """Seconds to get ``tokens`` of context back if its pin is not held."""
        costs = self._costs()
        recompute = costs.recompute_s(tokens)
        sig = self.signals
        if sig is not None and sig.host_cache_tokens > 0:
            return min(recompute, tokens / costs.load_tokens_per_s)
        return recompute

    def _utility_ttl(self, uid: int, tokens: int) -> float:
        own = self._class(uid)
        dist = own if own.samples >= self.params.n_min else self.pooled
        if not dist.samples:
            return 0.0
        sig = self.signals
        queue_s = sig.prefill_backlog_tokens / self._costs().backlog_tokens_per_s if sig is not None else 0.0
        busy = sig is not None and (sig.prefill_queue_requests > 0 or sig.decode_wait_requests > 0)
        price = 1.0 / sig.gpu_cache_tokens if busy and sig is not None and sig.gpu_cache_tokens else 0.0
        return dist.best_ttl(self.reload_cost_s(tokens) + queue_s, price, tokens, self.params.tau_max_s)

    # -------------------------------------------------------------- control
    def pinned(self, uid: int, now_s: float) -> bool:
        until = self.pinned_until.get(uid)
        return until is not None and now_s <= until

    def control(self, signals: Signals, parked: Sequence[int]) -> ControlDecision:
        self.signals = signals
        return ControlDecision(release=tuple(parked), order_by_priority=True, next_tick_s=self.params.tick_s)

    def priority_key(self, uid: int) -> float | None:
        """Program age, with sessions whose pin was live when their call was
        issued first (the engine asks right after :meth:`on_call_issued`)."""
        key = self.keys.get(uid)
        if key is not None:
            return key
        arrival = self.arrival.get(uid)
        return arrival
