"""The simulator's engine core, taking HTTP calls one at a time.

The engine is :class:`basin.sim.cluster.Cluster` itself (instances, routers,
cache capacities, the call path, decode-memory lending), built from the
catalogue's calibrated costs; this module only turns a chat call into a
submission and the core's two reports into a call's times. What the
simulator gets from a session's trajectory (prompt, output, cache key) comes
here from the request (:mod:`basin.emulate.calls`). The emulator sees calls,
not sessions: each call is submitted on its own (the core keeps no route of
its session between calls), under its routing key's session number.

Decode-memory lending (BASIN's engine change, :mod:`basin.sim.lending`) is
switched from outside (:meth:`EmulatedEngine.lending`, the server's
``POST /emulator/lending``): after a call, its decode instance may keep the
prompt as a unit for the session's next call.

No clock and no I/O: the driver advances the model to a simulated time and
asks when the next event is due; the same calls at the same simulated times
give the same timings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from basin.catalog import Deployment, HardwareProfile
from basin.emulate.calls import ChatCall, RequestError, affinity_uid
from basin.sim.cluster import Cluster, DecodeFigures, PDTopology, PrefillFigures
from basin.sim.colocated import ColocatedCluster, ColocatedTopology
from basin.sim.requests import Callbacks, Piece, Request

__all__ = ["HIT_WINDOW_CALLS", "DecodeFigures", "EmulatedCall", "EmulatedEngine", "LendingState", "PrefillFigures"]

#: Calls per prefill instance behind its ``cache_hit_rate`` gauge.
HIT_WINDOW_CALLS = 64


class EmulatedCall:
    """One call in the model; its times are simulated seconds (NaN until reached)."""

    __slots__ = ("call", "req", "arrival_s", "first_token_s", "finished_s", "cached_tokens", "listener",
                 "withdrawn")

    def __init__(self, call: ChatCall, req: Request, arrival_s: float):
        self.call = call
        self.req = req
        self.arrival_s = arrival_s
        self.first_token_s = math.nan
        self.finished_s = math.nan
        self.cached_tokens = 0
        #: Told of the first token and of the finish (the driver wakes its client).
        self.listener: Callable[[EmulatedCall], None] | None = None
        self.withdrawn = False

    @property
    def started(self) -> bool:
        return not math.isnan(self.req.prefill_start_s)

    @property
    def finished(self) -> bool:
        return not math.isnan(self.finished_s)

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> float:
        return self.finished_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class LendingState:
    """Decode-memory lending as the engine now runs it."""

    on: bool
    #: Lent memory never exceeds this share of a decode instance's KV (phi).
    cap_fraction: float
    lent_tokens: int
    decode_kv_tokens: int


class EmulatedEngine:
    """A deployment's engine core, driven call by call."""

    def __init__(self, hardware: HardwareProfile, deployment: Deployment, *,
                 reserve_at_prefill_completion: bool = False):
        self.hardware = hardware
        self.deployment = deployment
        self.cluster: Cluster | ColocatedCluster
        listener = Callbacks(self._first_token, self._finished)
        if deployment.topology == "colocated":
            self.cluster = ColocatedCluster(hardware, ColocatedTopology.of(deployment, hardware), listener,
                                            hit_window_calls=HIT_WINDOW_CALLS)
        else:
            self.cluster = Cluster(hardware, PDTopology.of(deployment, hardware), listener,
                                   reserve_at_prefill_completion=reserve_at_prefill_completion,
                                   hit_window_calls=HIT_WINDOW_CALLS)
        # The engine runs with priority scheduling on: equal priorities keep arrival order.
        self.cluster.set_ordered(True)
        self._calls: dict[int, EmulatedCall] = {}
        self.generation_tokens_total = 0
        self.calls_finished = 0

    # ------------------------------------------------------------------ time
    @property
    def now(self) -> float:
        return self.cluster.now

    def advance(self, sim_s: float) -> None:
        """Run the model up to simulated time ``sim_s`` (never backwards)."""
        self.cluster.advance(sim_s)

    @property
    def next_due_s(self) -> float | None:
        """When the model next has something to do (a driver sleeps until then)."""
        return self.cluster.next_due_s

    # ----------------------------------------------------------------- calls
    def check_fits(self, call: ChatCall) -> None:
        """Refuse, as an engine does, a call that no instance could ever hold."""
        pool = self.cluster.smallest_pool_tokens
        if call.prompt_tokens > pool:
            raise RequestError("messages", f"the prompt is about {call.prompt_tokens} tokens, more than the "
                               f"{pool}-token prefill pool of {self.deployment.name}; shorten the conversation")
        kv = self.cluster.smallest_kv_tokens
        need = call.prompt_tokens + call.output_tokens + self.hardware.decode.reserve_output_tokens
        if need > kv:
            room = kv - call.prompt_tokens - self.hardware.decode.reserve_output_tokens
            raise RequestError("max_tokens", f"prompt ({call.prompt_tokens}) plus output ({call.output_tokens}) "
                               f"exceeds the {kv}-token decode memory of {self.deployment.name}; "
                               f"ask for at most {max(room, 0)} tokens")

    def submit(self, call: ChatCall, queue_key: float, now_s: float) -> EmulatedCall:
        """Issue ``call`` at simulated time ``now_s``; ``queue_key`` orders it in the queues (lower first)."""
        self.check_fits(call)
        self.advance(now_s)
        uid = affinity_uid(call.affinity)
        key: list[Piece] = list(call.key)
        self.cluster.drop_unit_unless_extended(uid, key)
        req = self.cluster.submit(uid, key, call.prompt_tokens, call.prompt_tokens, call.output_tokens, queue_key)
        handle = EmulatedCall(call, req, req.admitted_s)
        self._calls[req.seq] = handle
        return handle

    def withdraw(self, handle: EmulatedCall) -> bool:
        """Take back a call whose client left, if its prefill has not started
        (as the simulator withdraws a terminated session's call); a started
        call runs to its end. True when withdrawn."""
        if handle.withdrawn or not self.cluster.withdraw(handle.req):
            return False
        handle.withdrawn = True
        self._calls.pop(handle.req.seq, None)
        return True

    def generated(self, handle: EmulatedCall) -> int:
        """Output tokens produced so far (the first with the first token; the
        rest at the decode instance's current step cost, the last at the finish)."""
        return self.cluster.generated_tokens(handle.req)

    def step_s(self, handle: EmulatedCall) -> float:
        """The current decode step time of the call's decode instance."""
        return self.cluster.step_s(handle.req)

    # ---------------------------------------------------- the core's reports
    def _first_token(self, req: Request) -> None:
        handle = self._calls.get(req.seq)
        if handle is not None:
            handle.cached_tokens = req.cached + req.loaded
            handle.first_token_s = req.first_token_s
            if handle.listener is not None:
                handle.listener(handle)

    def _finished(self, req: Request) -> None:
        self.generation_tokens_total += req.output
        self.calls_finished += 1
        handle = self._calls.pop(req.seq, None)
        if handle is not None:
            handle.finished_s = req.finished_s
            if handle.listener is not None:
                handle.listener(handle)

    # -------------------------------------------------------------- lending
    def lending(self, on: bool, cap_fraction: float | None = None) -> LendingState:
        """Lend idle decode memory as prefix cache from the next call's finish on, or stop, as the
        simulator's policies switch it: switching off adopts no more units and reclaims below
        the margin; units already lent go when decode needs the memory or the session moves on.
        ``cap_fraction`` (phi) replaces the cap of lent memory, now and for later units."""
        cluster = self.cluster
        if cap_fraction is not None:
            if not 0.0 < cap_fraction <= 1.0:
                raise ValueError(f"cap_fraction must be in (0, 1], got {cap_fraction!r}")
            cluster.set_lend_cap(cap_fraction)
        if on:
            cluster.wire_lending(cluster.lend_cap_fraction)
        cluster.set_lending(on)
        return self.lending_state()

    def lending_state(self) -> LendingState:
        return LendingState(on=self.lending_on, cap_fraction=self.lend_cap_fraction, lent_tokens=self.lent_tokens,
                            decode_kv_tokens=self.cluster.decode_kv_tokens)

    @property
    def lending_on(self) -> bool:
        return self.cluster.lending_on

    @property
    def lend_cap_fraction(self) -> float:
        return self.cluster.lend_cap_fraction

    @property
    def lent_tokens(self) -> int:
        return self.cluster.lent_tokens

    # --------------------------------------------------------------- figures
    def prefill_figures(self) -> list[PrefillFigures]:
        return self.cluster.prefill_figures()

    def decode_figures(self) -> list[DecodeFigures]:
        return self.cluster.decode_figures()

    @property
    def calls_in_flight(self) -> int:
        return len(self._calls)
