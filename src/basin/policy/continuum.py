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
  cost of the context
  (recompute, or host load-back when a host tier exists, whichever is
  cheaper) from the prefill cost parameters (H200 defaults); ``Q`` is the
  prefill backlog in seconds at the last control tick; ``m`` is ``1 / C_dev``
  when a queue is non-empty, else 0; TTL capped at ``tau_max_s`` (60 s).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from basin.errors import BasinInputError
from basin.policy.base import ControlDecision, Policy, SessionInfo, Signals

#: Pinned sessions' keys are shifted this far ahead of every arrival time.
PINNED_OFFSET = 1e12


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

    def __init__(self, ttl_mode: str = "code", fixed_ttl_s: float = 2.0, threshold_s: float = 2.0,
                 tool_class: str = "session", n_min: int = 5, tau_max_s: float = 60.0,
                 linear_tokens_per_s: float = 60500.0, attention_s_per_token_position: float = 1.33e-10,
                 load_tokens_per_s: float = 4.0e6, prefill_tokens_per_s: float = 55000.0,
                 tick_s: float = 5.0):
        if ttl_mode not in ("code", "utility"):
            raise BasinInputError(f"continuum: ttl_mode must be 'code' or 'utility', got {ttl_mode!r}")
        if tool_class not in ("session", "global"):
            raise BasinInputError(f"continuum: tool_class must be 'session' or 'global', got {tool_class!r}")
        self.ttl_mode = ttl_mode
        self.fixed_ttl_s = fixed_ttl_s
        self.threshold_s = threshold_s
        self.tool_class = tool_class
        self.n_min = n_min
        self.tau_max_s = tau_max_s
        self.linear_tokens_per_s = linear_tokens_per_s
        self.attention = attention_s_per_token_position
        self.load_tokens_per_s = load_tokens_per_s
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.tick_s = tick_s
        self.arrival: dict[int, float] = {}
        self.pinned_until: dict[int, float] = {}
        self.keys: dict[int, float] = {}
        self.finished_at: dict[int, float] = {}
        keep = 64 if ttl_mode == "utility" else 0
        self.classes: dict[int, _Durations] = {}
        self._keep_own = keep
        self.pooled = _Durations(keep=8 * keep)
        self.signals: Signals | None = None

    # ------------------------------------------------------------- sessions
    def on_session_arrival(self, info: SessionInfo, signals: Signals):
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

    def _class(self, uid: int) -> _Durations:
        if self.tool_class == "global":
            return self.pooled
        d = self.classes.get(uid)
        if d is None:
            d = self.classes[uid] = _Durations(keep=self._keep_own)
        return d

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        arrival = self.arrival.get(uid)
        if arrival is not None:
            self.keys[uid] = arrival - PINNED_OFFSET if self.pinned(uid, now_s) else arrival
        t0 = self.finished_at.pop(uid, None)
        if t0 is not None:
            d = max(now_s - t0, 0.0)
            if self.tool_class == "session":
                self._class(uid).add(d)
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
        if self.ttl_mode == "code":
            return self.fixed_ttl_s if self._class(uid).mean <= self.threshold_s else 0.0
        return self._utility_ttl(uid, context_tokens)

    def reload_cost_s(self, tokens: int) -> float:
        """Seconds to get ``tokens`` of context back if its pin is not held."""
        recompute = tokens * (1.0 / self.linear_tokens_per_s + self.attention * tokens / 2.0)
        sig = self.signals
        if sig is not None and sig.host_cache_tokens > 0:
            return min(recompute, tokens / self.load_tokens_per_s)
        return recompute

    def _utility_ttl(self, uid: int, tokens: int) -> float:
        own = self._class(uid)
        dist = own if own.samples >= self.n_min else self.pooled
        if not dist.samples:
            return 0.0
        sig = self.signals
        queue_s = sig.prefill_backlog_tokens / self.prefill_tokens_per_s if sig is not None else 0.0
        busy = sig is not None and (sig.prefill_queue_requests > 0 or sig.decode_wait_requests > 0)
        price = 1.0 / sig.gpu_cache_tokens if busy and sig is not None and sig.gpu_cache_tokens else 0.0
        return dist.best_ttl(self.reload_cost_s(tokens) + queue_s, price, tokens, self.tau_max_s)

    # -------------------------------------------------------------- control
    def pinned(self, uid: int, now_s: float) -> bool:
        until = self.pinned_until.get(uid)
        return until is not None and now_s <= until

    def control(self, signals: Signals, parked: Sequence[int]) -> ControlDecision:
        self.signals = signals
        return ControlDecision(release=tuple(parked), order_by_priority=True, next_tick_s=self.tick_s)

    def priority_key(self, uid: int) -> float | None:
        """Program age, with sessions whose pin was live when their call was
        issued first (the engine asks right after :meth:`on_call_issued`)."""
        key = self.keys.get(uid)
        if key is not None:
            return key
        arrival = self.arrival.get(uid)
        return arrival
