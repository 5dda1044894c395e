"""BASIN: the session controller of the paper (section 6, Algorithm 1).

Four mechanisms, each engaged only when its condition holds:

* a fixed session priority ``p = arrival + predicted peak / r``, assigned at
  the first call and used by the parked queue, the prefill queue and the
  decode-memory queue alike (smaller, earlier sessions first; later arrivals
  stop overtaking a session after ``predicted peak / r`` seconds);
* admission by predicted peak context (Denning's working set): while the
  working set ``W = N c`` is at the reference budget ``B0`` (a margin below
  the profiled cache cliff, capped by the effective cache), a first call
  enters only if the residents' predicted peaks plus its own fit the adapted
  budget ``B``, or no resident remains;
* decode memory lent as a cache tier once ``W`` nears the cliff;
* shedding of the lowest-priority parked session when long-run arrivals
  exceed the profiled peak departure rate and admission has stalled.

``B`` adapts to the hit rate in the manner of page-fault-frequency control:
raised while reuse stays on its healthy plateau and sessions wait, lowered
when reuse falls, within a bounded range around ``B0`` whose upper end is
lifted while the engine has headroom: the working set short of the profiled
cliff margin and no backlog persisting (``budget_past_cap_with_headroom``).
Controls are released only after their condition has stayed clear for a
cool-down.

``basin-prior`` is the earlier arrival-time controller the hardware prototype
ran: arrival-order priority and admission by current context.

``basin`` carries a few additions to the paper's Algorithm 1, each an option of
:class:`BasinParams` (:data:`PAPER_BEHAVIOUR` names them with the value that
restores the paper's rule); ``basin-paper`` (:class:`BasinPaperPolicy`) is
BASIN with every one of them switched to the paper's behaviour.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from basin.cliff import X_KNEE
from basin.policy.base import Admission, ControlDecision, EngineNeeds, Handed, Policy, SessionInfo, Signals
from basin.policy.params import PolicyParamError, PolicyParams

if TYPE_CHECKING:
    from typing import Self

_INF = float("inf")
#: Upper ends of the duration parameters' ranges, in seconds.
DAY_S = 86_400.0
WEEK_S = 7 * DAY_S


class PeakPredictor(Protocol):
    """What BASIN asks of a peak-context predictor (it is handed a fitted one)."""

    def predict_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None) -> float: ...


@runtime_checkable
class ReservingPeakPredictor(PeakPredictor, Protocol):
    """A predictor that also states what to reserve (an upper quantile of the
    peak); BASIN then orders by the point prediction and reserves this."""

    def reserve_peak_tokens(self, task_text: str | None, first_prompt_tokens: int, session_id: str,
                            oracle_peak_tokens: int | None) -> float: ...


@dataclass(frozen=True, slots=True)
class GrowthCorrection:
    """The online revision of a resident's reservation from its observed growth.

    After a resident's ``k``-th call ends with context ``c`` (tokens), its
    reservation becomes::

        max(c, exp(intercept + coef_context log(1 + c) + coef_calls log(1 + k)
                   + coef_initial log(W0) + offset))

    with ``W0`` the point prediction made at the first call. The coefficients
    are fitted offline (:mod:`basin.predict.growth`) and handed in: the policy
    reads no file. ``offset`` lifts the revision to the predictor's stated
    quantile (0 for the median). The priority is not revised.
    """

    intercept: float
    coef_context: float
    coef_calls: float
    coef_initial: float
    offset: float = 0.0

    def reservation(self, initial_tokens: float, context_tokens: int, calls_done: int) -> float:
        log_r = (self.intercept + self.coef_context * math.log1p(context_tokens)
                 + self.coef_calls * math.log1p(calls_done)
                 + self.coef_initial * math.log(max(initial_tokens, 1.0)) + self.offset)
        return max(math.exp(min(log_r, 700.0)), float(context_tokens))


@dataclass(frozen=True, slots=True)
class BasinParams(PolicyParams):
    """Section 6.6's parameters, the implementation settings (section 7.9),
    and our additions to Algorithm 1, each a flag whose paper value
    :data:`PAPER_BEHAVIOUR` gives (``basin-paper`` runs with all of them)."""

    policy = "basin"

    interval_s: float = 30.0
    busy_interval_s: float = 5.0
    margin: float = 0.9
    alpha_lend: float = 0.8
    alpha_order: float = 0.9
    alpha_release: float = 0.8
    lend_cap: float = 0.5
    shed_horizon_s: float = 15 * 60.0
    priority_rate_tokens_per_s: float = 30.0
    # implementation settings
    cooldown_s: float = 120.0
    backlog_ticks: int = 2
    backlog_tokens: int = 16_384
    context_smoothing_s: float = 600.0
    budget_low: float = 0.5
    budget_high: float = 2.0
    #: Let ``B`` rise past ``budget_high * B0`` while the engine has headroom:
    #: ``W`` below the cliff margin ``m W_c`` and no prefill backlog or
    #: decode-memory wait for ``backlog_ticks`` ticks. ``B`` counts reserved
    #: peaks, which sum to well above the live contexts ``B0`` is measured in,
    #: so a fixed cap can park sessions a healthy engine could serve; the cap
    #: returns at once when either sign of saturation appears (docs/basin.md).
    #: False: the paper's fixed range, "a bounded range around B0" (section
    #: 6.6). ``basin-prior`` always keeps the cap.
    budget_past_cap_with_headroom: bool = True
    budget_step: float = 0.1
    plateau_drop: float = 0.05
    plateau_smoothing_s: float = 600.0
    # mechanisms, each removable for ablations (Fig. 23)
    priority: bool = True
    admission: bool = True
    lending: bool = True
    shedding: bool = True
    # additions to the paper's Algorithm 1 (PAPER_BEHAVIOUR; docs/basin.md)
    #: Beyond the paper: revise each resident's reservation after every call
    #: from its observed growth (calls and context so far) with the fitted
    #: :class:`GrowthCorrection` the policy is handed; its priority stays the
    #: one fixed at the first call. False: the paper's fixed reservation.
    online_correction: bool = False
    #: The paper reserves the point prediction ``W_hat_i`` (section 6.4: the
    #: sum of residents' predicted peaks against ``B``). True: when the
    #: predictor also states an upper quantile of the peak
    #: (``reserve_peak_tokens``, a calibrated predictor such as
    #: ``ridge:q=0.9``), the session reserves that quantile instead, since the
    #: point prediction covers only about half of the peaks; its priority keeps
    #: the point prediction. A predictor without a quantile (the default
    #: ``ridge``, ``oracle``) reserves its point prediction either way.
    #: False: the paper's point reservation with any predictor.
    reserve_quantile: bool = True
    #: The paper uses the predictor's ``W_hat_i`` as it comes. True: the
    #: prediction (and the quantile reserved) is raised to at least the first
    #: prompt, since a session's peak context can never be below a prompt it
    #: has already sent; this guards predictors that do not floor themselves
    #: (``noisy:SIGMA``, ``growth:FACTOR`` with a factor below 1; ``ridge`` and
    #: the calibrated ones floor their own answers, so there it changes
    #: nothing). False: the prediction unchanged, for priority and reservation.
    floor_peak_at_first_prompt: bool = True
    #: The paper keeps one queue of parked and new sessions whose heads enter
    #: only while they fit ``B``, and ``B`` stays finite while any session is
    #: parked (it grows gradually after admission is released, Algorithm 1
    #: lines 9-10). True: once admission is released (``W`` below
    #: ``alpha_R B0`` for the cool-down) a new session that no parked one
    #: precedes enters without the budget test; the gradual growth then paces
    #: the parked sessions' return only, as the released condition says the
    #: engine is clear of the cliff (our reading of the rule's intent; no
    #: measurement of it is recorded). While admission is engaged both rules
    #: are the same. False: the paper's budget test for every head.
    arrivals_bypass_budget_while_draining: bool = True

    def check(self) -> None:
        # Durations and rates are finite (PolicyParams) and within a stated range: a control
        # interval of 1e400 s would leave parked sessions waiting for a step that never comes.
        for name, most in (("interval_s", DAY_S), ("busy_interval_s", DAY_S), ("cooldown_s", DAY_S),
                           ("context_smoothing_s", WEEK_S), ("plateau_smoothing_s", WEEK_S),
                           ("priority_rate_tokens_per_s", 1e9)):
            self.require(0 < getattr(self, name) <= most, name, f"must be in (0, {most:g}]")
        self.require(self.shed_horizon_s <= WEEK_S, "shed_horizon_s", f"must be <= {WEEK_S:g}")
        for name in ("margin", "alpha_lend", "alpha_order", "alpha_release", "lend_cap"):
            self.require(0 < getattr(self, name) <= 1, name, "must be in (0, 1]")
        for name in ("budget_step", "plateau_drop"):
            self.require(0 < getattr(self, name) < 1, name, "must be in (0, 1)")
        self.require(self.shed_horizon_s >= 0, "shed_horizon_s", "must be >= 0")
        self.require(self.backlog_ticks >= 1, "backlog_ticks", "must be >= 1")
        self.require(self.backlog_tokens >= 0, "backlog_tokens", "must be >= 0")
        self.require(self.budget_low > 0, "budget_low", "must be > 0")
        self.require(self.budget_high >= self.budget_low, "budget_high", "must be >= budget_low")


#: Each addition of ``basin`` to the paper's Algorithm 1 (a field of
#: :class:`BasinParams`) and the value that restores the paper's behaviour;
#: ``basin-paper`` runs with all of them.
PAPER_BEHAVIOUR: dict[str, bool] = {
    "budget_past_cap_with_headroom": False,
    "online_correction": False,
    "reserve_quantile": False,
    "floor_peak_at_first_prompt": False,
    "arrivals_bypass_budget_while_draining": False,
}


@dataclass(frozen=True, slots=True)
class BasinPaperParams(BasinParams):
    """:class:`BasinParams` with every addition to the paper's Algorithm 1
    switched to the paper's behaviour (:data:`PAPER_BEHAVIOUR`); every
    setting, these included, can still be changed as for ``basin``."""

    policy = "basin-paper"

    budget_past_cap_with_headroom: bool = False
    online_correction: bool = False
    reserve_quantile: bool = False
    floor_peak_at_first_prompt: bool = False
    arrivals_bypass_budget_while_draining: bool = False


@dataclass(frozen=True, slots=True)
class CliffSummary:
    """What the controller needs of the offline profile."""

    kappa: float = 1.0
    x_knee: float = X_KNEE
    lambda_c_per_min: float = _INF
    origin: str = "reference curve (no profile)"


@dataclass(slots=True)
class _Session:
    arrival_s: float
    peak_hat: float
    prio: float
    context: int = 0
    admitted: bool = False
    #: What the session holds against the budget: its peak prediction, an
    #: upper quantile of it, or the online revision of either.
    reserve: float = 0.0
    calls_done: int = 0


@dataclass(slots=True)
class ControllerState:
    """Everything the controller carries between ticks (exposed for tests and
    the gateway's state endpoint)."""

    admit: bool = False
    order: bool = False
    lend: bool = False
    budget: float = _INF
    b0: float = _INF
    #: The cliff margin ``m W_c`` (working-set units) for the current C_eff.
    cliff_margin: float = _INF
    working_set: float = 0.0
    context_mean: float = 0.0
    plateau: float = math.nan
    reserved: float = 0.0
    residents: int = 0
    last_admit_cond_s: float = -_INF
    last_order_cond_s: float = -_INF
    last_lend_cond_s: float = -_INF
    backlog_ticks: int = 0
    clear_ticks: int = 0
    caught_up: bool = True
    last_tick_s: float | None = None
    shed: int = 0


class BasinPolicy(Policy):
    name = "basin"
    #: The arrival-time controller orders by arrival and admits by current context.
    prior = False

    Params = BasinParams
    params: BasinParams

    HANDED = frozenset({"cliff", "predictor"})

    def __init__(self, params: BasinParams | None = None, *, predictor: PeakPredictor | None = None,
                 cliff: CliffSummary | None = None, correction: GrowthCorrection | None = None):
        super().__init__(params)
        self.cliff = cliff or CliffSummary()
        self.predictor = predictor
        #: What the predictor reserves, when it states it: checked once, as a
        #: runtime protocol check walks the protocol's attributes (made at
        #: every arrival, it cost a surge-1p3d run 6% of its event loop).
        self._reserve_peak = (predictor.reserve_peak_tokens if isinstance(predictor, ReservingPeakPredictor)
                              else None)
        self.correction = correction
        self.sessions: dict[int, _Session] = {}
        #: Sessions registered and not admitted, by priority (stale entries,
        #: admitted, finished or shed since, are dropped when they surface).
        self._waiting: list[tuple[float, int, _Session]] = []
        self.state = ControllerState()

    @classmethod
    def build(cls, params: PolicyParams, handed: Handed) -> Self:
        """Handed the cliff profile and, unless it is the arrival-time
        controller, the fitted predictor and (``online_correction``) the
        predictor's growth model."""
        if cls.prior:
            return cls(params, cliff=handed.cliff)  # type: ignore[arg-type]  # _own refuses a wrong class
        correction = None
        if getattr(params, "online_correction", False):
            coefficients = getattr(handed.predictor, "growth_coefficients", None)
            if coefficients is None:
                raise PolicyParamError(
                    cls.name, "online_correction",
                    f"the predictor '{handed.predictor_spec}' carries no fitted growth model; use a calibrated "
                    "predictor such as policy_params.predictor=ridge:q=0.9 (or gbt, quantile, auto), "
                    "or leave online_correction off")
            correction = GrowthCorrection(**coefficients())
        return cls(params, predictor=handed.predictor, cliff=handed.cliff,  # type: ignore[arg-type]  # _own refuses a wrong class
                   correction=correction)

    def describe(self) -> dict[str, object]:
        return {"cliff_profile": dataclasses.asdict(self.cliff)}

    @property
    def needs(self) -> EngineNeeds:
        return EngineNeeds(
            reserve_decode_at_prefill_completion=True,
            decode_memory_lending=self.params.lending,
            lend_cap_fraction=self.params.lend_cap,
        )

    # ------------------------------------------------------------ sessions
    def _predict(self, info: SessionInfo) -> float:
        if self.prior or self.predictor is None:
            return float(info.first_prompt_tokens)
        return float(self.predictor.predict_peak_tokens(
            info.task_text, info.first_prompt_tokens, info.session_id, info.oracle_peak_tokens))

    def _reserve(self, info: SessionInfo, peak: float) -> float:
        reserve = self._reserve_peak if self.params.reserve_quantile else None
        if self.prior or reserve is None:
            return peak
        quantile = float(reserve(info.task_text, info.first_prompt_tokens, info.session_id,
                                 info.oracle_peak_tokens))
        if not self.params.floor_peak_at_first_prompt:
            return quantile
        return max(quantile, float(info.first_prompt_tokens))

    def _register(self, info: SessionInfo) -> _Session:
        peak = self._predict(info)
        if self.params.floor_peak_at_first_prompt:
            peak = max(peak, float(info.first_prompt_tokens))
        prio = info.arrival_s if self.prior else info.arrival_s + peak / self.params.priority_rate_tokens_per_s
        sess = _Session(info.arrival_s, peak, prio, context=info.first_prompt_tokens,
                        reserve=self._reserve(info, peak))
        self.sessions[info.uid] = sess
        return sess

    def _admit(self, sess: _Session) -> None:
        sess.admitted = True
        self.state.residents += 1
        if not self.prior:  # the prior controller counts current contexts, not reservations
            self.state.reserved += sess.reserve

    def _fits(self, sess: _Session, signals: Signals | None, admitted_now: int = 0) -> bool:
        st = self.state
        if st.residents == 0 or st.budget == _INF:
            return True
        if self.prior:
            live = (signals.working_set_tokens if signals is not None else st.working_set)
            return live + (admitted_now + 1) * max(st.context_mean, sess.context) <= st.budget
        return st.reserved + sess.reserve <= st.budget

    def on_session_arrival(self, info: SessionInfo, signals: Signals) -> Admission:
        sess = self._register(info)
        st = self.state
        # A waiting session of higher or equal priority keeps its place.
        ahead = self._first_waiting_prio() <= sess.prio
        # Admission released: past the budget, unless the paper's single queue is asked for.
        bypass = not st.admit and self.params.arrivals_bypass_budget_while_draining
        if not ahead and (bypass or self._fits(sess, signals)):
            self._admit(sess)
            return Admission.ADMIT
        heapq.heappush(self._waiting, (sess.prio, info.uid, sess))
        return Admission.PARK

    def _first_waiting_prio(self) -> float:
        heap = self._waiting
        while heap:
            _, uid, sess = heap[0]
            if not sess.admitted and self.sessions.get(uid) is sess:
                return sess.prio
            heapq.heappop(heap)
        return _INF

    def attach(self, active: Sequence[SessionInfo], now_s: float) -> None:
        for info in active:
            self._admit(self._register(info))

    def on_prompt_counted(self, info: SessionInfo) -> None:
        """The engine's count of the first prompt replaces the host's estimate
        (a gateway's body bytes / 4, images included): the peak prediction,
        the reservation and the priority are made again from it, whatever the
        correction option, and stay fixed from then on. A count of 0 (the
        engine refused the call) releases the reservation until a count comes."""
        sess = self.sessions.get(info.uid)
        if sess is None:
            return
        if info.first_prompt_tokens > 0:
            peak = self._predict(info)
            if self.params.floor_peak_at_first_prompt:
                peak = max(peak, float(info.first_prompt_tokens))
            reserve = self._reserve(info, peak)
            sess.peak_hat = peak
            if sess.admitted:  # a parked session keeps its place in the queue's heap
                rate = self.params.priority_rate_tokens_per_s
                sess.prio = info.arrival_s if self.prior else info.arrival_s + peak / rate
        else:
            reserve = 0.0
        if sess.admitted and not self.prior:
            self.state.reserved += reserve - sess.reserve
        sess.reserve = reserve

    def on_call_issued(self, uid: int, prompt_tokens: int, now_s: float) -> None:
        sess = self.sessions.get(uid)
        if sess is not None:
            sess.context = prompt_tokens

    def on_call_finished(self, uid: int, context_tokens: int, last_call: bool, now_s: float) -> float:
        sess = self.sessions.get(uid)
        if sess is not None:
            sess.context = context_tokens
            sess.calls_done += 1
            if (self.params.online_correction and self.correction is not None and sess.admitted
                    and not last_call and not self.prior):
                revised = self.correction.reservation(sess.peak_hat, context_tokens, sess.calls_done)
                self.state.reserved += revised - sess.reserve
                sess.reserve = revised
        return 0.0

    def on_session_finished(self, uid: int, now_s: float) -> None:
        sess = self.sessions.pop(uid, None)
        if sess is not None and sess.admitted:
            self.state.residents -= 1
            if not self.prior:
                self.state.reserved -= sess.reserve

    def priority_key(self, uid: int) -> float | None:
        sess = self.sessions.get(uid)
        return sess.prio if sess is not None and self.params.priority else None

    # ------------------------------------------------------------ restarts
    def persisted_state(self) -> dict[str, object] | None:
        return dataclasses.asdict(self.state)

    def persisted_session(self, uid: int) -> dict[str, object] | None:
        sess = self.sessions.get(uid)
        return None if sess is None else {f: getattr(sess, f) for f in _Session.__slots__}

    def restore(self, state: Mapping[str, Any], sessions: Mapping[int, Mapping[str, Any]]) -> None:
        """The controller and its sessions as kept; the residents and their
        reservations are summed again from the sessions, so the budget test
        holds exactly what was admitted."""
        self.state = ControllerState(**state)
        self.sessions = {uid: _Session(**fields) for uid, fields in sessions.items()}
        admitted = [s for s in self.sessions.values() if s.admitted]
        self.state.residents = len(admitted)
        self.state.reserved = 0.0 if self.prior else math.fsum(s.reserve for s in admitted)
        self._waiting = [(s.prio, uid, s) for uid, s in self.sessions.items() if not s.admitted]
        heapq.heapify(self._waiting)

    def limiting_admission(self) -> bool:
        """Admission by predicted peak is active (``W`` reached ``B0``; released after the cool-down)."""
        return self.state.admit

    # -------------------------------------------------------------- control
    def _budgets(self, signals: Signals) -> tuple[float, float, float]:
        """(the prefill tiers' reference budget, ``B0`` with lent capacity, the cliff margin ``m W_c``)."""
        p = self.params
        kx = p.margin * self.cliff.kappa * self.cliff.x_knee
        C = signals.effective_cache_tokens
        b00 = min(kx * C, C)
        # Lent decode memory extends the GPU tier (Algorithm 1), up to phi of decode memory.
        lent = min(signals.lent_cache_tokens, p.lend_cap * signals.decode_kv_tokens)
        c_eff = max(C, signals.gpu_cache_tokens + lent)
        return b00, min(kx * c_eff, c_eff), kx * c_eff

    def between_steps(self, signals: Signals, parked: Collection[int]) -> tuple[int, ...]:
        """The entry rule of :meth:`control` applied as a change happens: admission
        engages once the live working set (every admitted session's context, the
        first prompts of sessions admitted since the last step included) reaches
        ``B0``, so a burst of first calls between two steps is held to the budget;
        then the parked heads that fit the budget are released. The budget is not
        adapted and nothing is released from engagement: those stay the step's."""
        p, st = self.params, self.state
        if p.admission and not st.admit:
            _, b0, margin = self._budgets(signals)
            if signals.working_set_tokens >= b0:
                st.admit = True
                st.last_admit_cond_s = signals.now_s
                st.b0, st.cliff_margin, st.budget = b0, margin, b0
        release: list[int] = []
        while parked and self._first_waiting_prio() < _INF:
            _, uid, sess = self._waiting[0]
            if uid not in parked or not self._fits(sess, signals, len(release)):
                break
            heapq.heappop(self._waiting)
            self._admit(sess)
            release.append(uid)
        return tuple(release)

    def control(self, signals: Signals, parked: Sequence[int]) -> ControlDecision:
        p, st, now = self.params, self.state, signals.now_s
        dt = 0.0 if st.last_tick_s is None else max(now - st.last_tick_s, 0.0)
        st.last_tick_s = now
        # Working set W = N c, with a smoothed mean context.
        c_now = signals.mean_context_tokens
        if c_now > 0:
            w = 1.0 if st.context_mean == 0 else 1.0 - math.exp(-dt / p.context_smoothing_s)
            st.context_mean += w * (c_now - st.context_mean)
        st.working_set = signals.active_sessions * st.context_mean
        W = st.working_set
        b00, b0, st.cliff_margin = self._budgets(signals)
        st.b0 = b0
        # A prefill backlog or a wait for decode memory. Computation keeps up
        # (``caught_up``) once none has been seen for as many ticks as make a
        # backlog persistent, and stops keeping up once a backlog persists.
        backlog = signals.prefill_backlog_tokens > p.backlog_tokens or signals.decode_wait_requests > 0
        st.backlog_ticks = st.backlog_ticks + 1 if backlog else 0
        st.clear_ticks = 0 if backlog else st.clear_ticks + 1
        if st.backlog_ticks >= p.backlog_ticks:
            st.caught_up = False
        elif st.clear_ticks >= p.backlog_ticks:
            st.caught_up = True
        # Entry: activation at B0, release below alpha_R B0 after a cool-down.
        if p.admission and (W >= b0 or (st.admit and W >= p.alpha_release * b0)):
            st.last_admit_cond_s = now
        was_admitting = st.admit
        st.admit = (now - st.last_admit_cond_s) < p.cooldown_s if st.admit else (p.admission and W >= b0)
        h = signals.hit_rate
        lo, hi = p.budget_low * b0, p.budget_high * b0
        if p.budget_past_cap_with_headroom and not self.prior and W < st.cliff_margin and st.caught_up:
            hi = _INF  # headroom: the hit-rate feedback alone bounds B
        if st.admit:
            if not was_admitting or st.budget == _INF:
                st.budget = b0
            elif not math.isnan(h) and not math.isnan(st.plateau):
                if h >= st.plateau - p.plateau_drop and parked:
                    st.budget = min(st.budget * (1 + p.budget_step), hi)
                elif h < st.plateau - 2 * p.plateau_drop:
                    st.budget = min(st.budget * (1 - p.budget_step), max(st.reserved, lo))
            st.budget = min(max(st.budget, lo), hi)
        elif parked:
            st.budget = b0 if st.budget == _INF else min(st.budget * (1 + p.budget_step), hi)
        else:
            st.budget = _INF
            if math.isnan(st.plateau):
                st.plateau = h
            elif not math.isnan(h):
                st.plateau += (1.0 - math.exp(-dt / p.plateau_smoothing_s)) * (h - st.plateau)
        # Ordering: a persistent backlog, W near the cliff, or admission active.
        if st.backlog_ticks >= p.backlog_ticks or W >= p.alpha_order * b0 or st.admit:
            st.last_order_cond_s = now
        st.order = p.priority and (now - st.last_order_cond_s) < p.cooldown_s
        # Lending: near the cliff of the prefill tiers, or while admitting.
        if W >= p.alpha_lend * b00 or st.admit:
            st.last_lend_cond_s = now
        st.lend = p.lending and (now - st.last_lend_cond_s) < p.cooldown_s
        # Admission of the parked queue's heads, in priority order.
        queue = sorted((u for u in parked if u in self.sessions), key=lambda u: self.sessions[u].prio)
        release: list[int] = []
        for uid in queue:
            sess = self.sessions[uid]
            if not self._fits(sess, signals, len(release)):
                break
            self._admit(sess)
            release.append(uid)
        # Shedding: persistent excess demand, one session per interval.
        shed: tuple[int, ...] = ()
        waiting = queue[len(release):]
        if (p.shedding and waiting and signals.arrival_rate_per_min > self.cliff.lambda_c_per_min
                and now - self.sessions[waiting[0]].arrival_s > p.shed_horizon_s):
            shed = (waiting[-1],)
            self.sessions.pop(waiting[-1], None)
            st.shed += 1
        busy = st.admit or st.order or st.lend or bool(waiting) or backlog
        return ControlDecision(
            release=tuple(release), shed=shed, order_by_priority=st.order, lend_decode_memory=st.lend,
            next_tick_s=p.busy_interval_s if busy else p.interval_s,
        )


class BasinPriorPolicy(BasinPolicy):
    """The arrival-time controller of the hardware prototype."""

    name = "basin-prior"
    prior = True
    HANDED = frozenset({"cliff"})


class BasinPaperPolicy(BasinPolicy):
    """BASIN as section 6 of the paper specifies it: the predictor-driven
    controller with every addition of ``basin`` switched to the paper's
    behaviour (:class:`BasinPaperParams`); built with the same predictor and
    cliff profile as ``basin``."""

    name = "basin-paper"

    Params = BasinPaperParams
    params: BasinPaperParams
