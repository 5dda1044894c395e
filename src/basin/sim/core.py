"""What every engine core shares, whatever its topology.

An engine core is a deployment's instances on one event loop, taking calls
from its owner and telling it of each call's first token and finish:
:class:`basin.sim.cluster.Cluster` (prefill and decode disaggregated) and
:class:`basin.sim.colocated.ColocatedCluster` (colocated servers).
:class:`EngineCore` is the part of both that does not depend on how the
instances are arranged: the loop and its time, the owner's two callbacks,
how a call becomes a :class:`~basin.sim.requests.Request`, each instance's
prefix cache by index (TTL pins, cache counters), the window of recent
hits, and the stop at the end of a run. A topology adds its instances,
where a call goes, its call path and its figures.

Compiled with the rest of the simulator (``basin.accel``): both cores are
native subclasses of this one, so what they inherit costs the call path
nothing more than their own methods.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import NoReturn

from basin.catalog import HardwareProfile
from basin.sim.cache import MatchResult, RadixCache
from basin.sim.events import EventLoop
from basin.sim.requests import Callbacks, CallListener, Piece, Request, Route


def stopped(*_: object) -> NoReturn:
    """What a stopped core's instances report to (see :meth:`EngineCore.stop`)."""
    raise RuntimeError("the engine was stopped: its run is over")


class EngineCore:
    """The base of every engine core (see the module's docstring)."""

    def __init__(self, hardware: HardwareProfile, caches: list[RadixCache], listener: CallListener,
                 hit_window_calls: int) -> None:
        """``caches``: the prefix cache of each instance a call is prefilled
        on, by its index. ``listener``: the owner, told of each call's first
        token and finish. ``hit_window_calls``: keep each instance's last
        calls for :meth:`recent_hit_rate` (0: none kept, the rate reads 0)."""
        self.hardware = hardware
        self.loop = EventLoop()
        self.listener = listener
        self.caches = caches
        self._seq = 0
        #: Each instance's last calls (prompt tokens, of them found cached), when kept.
        self._recent: list[deque[tuple[int, int]]] = (
            [deque(maxlen=hit_window_calls) for _ in caches] if hit_window_calls > 0 else [])

    # ------------------------------------------------------------------ time
    @property
    def now(self) -> float:
        return self.loop.now

    def advance(self, sim_s: float) -> None:
        """Run up to simulated time ``sim_s`` (never backwards)."""
        self.loop.run(max(sim_s, self.loop.now))

    @property
    def next_due_s(self) -> float | None:
        """When the core next has something to do (a wall-clock driver sleeps until then)."""
        return self.loop.next_event_s

    def stop(self) -> None:
        """End the run: pending events and timers are dropped, and the
        instances let go of the core's handlers and the core of its owner.
        The state stays readable; any further call raises."""
        self.loop.discard_pending()
        self._let_go()
        self.listener = Callbacks(stopped, stopped)

    def _let_go(self) -> None:
        """The topology's part of :meth:`stop`: its instances let go of the
        core's handlers, and the core of those it bound once."""

    # ----------------------------------------------------------------- calls
    def _request(self, session: int, key: list[Piece], prompt_tokens: int, new_tokens: int, output_tokens: int,
                 priority: float | None, route: Route | None, call_index: int) -> Request:
        """A call of session ``session`` issued now, not yet placed (see
        the topologies' ``submit``); a call without a ``route`` is on its own."""
        r = route if route is not None else Route(session)
        r.take_key(key)
        self._seq += 1
        req = Request(session, r, call_index, key, self._seq, self.loop.now, prompt_tokens, new_tokens,
                      output_tokens)
        req.prio = priority
        return req

    def preload(self, route: Route, key: list[Piece], last_touch_s: float) -> int:
        """Cache ``key`` as the session's context at ``last_touch_s`` (a warm
        start) on the instance its uid picks; that instance's index."""
        route.take_key(key)
        home = route.uid % len(self.caches)
        cache = self.caches[home]
        route.placed_on |= 1 << home
        route.keep_cursor(cache, cache.insert(key, last_touch_s, 0))
        return home

    # ------------------------------------------------------------ TTL pins
    def pin(self, req: Request) -> MatchResult:
        """Lock the prompt of a finished call in its prefill cache; ``unpin`` releases it."""
        cache = self.caches[req.prefill]
        m = cache.match(req.key, self.loop.now, req.route.cursor_for(req.key, cache), req.prompt)
        cache.lock(m)
        return m

    # --------------------------------------------------------------- figures
    def _note_hit(self, instance: int, prompt_tokens: int, hit_tokens: int) -> None:
        """A call's prompt was served on ``instance``, ``hit_tokens`` of it from cache."""
        if self._recent:
            self._recent[instance].append((prompt_tokens, hit_tokens))

    def recent_hit_rate(self, instance: int) -> float:
        """Cached share of the prompt tokens of the instance's last calls (0
        before any, or when none are kept)."""
        if not self._recent:
            return 0.0
        asked = hit = 0
        for prompt, cached in self._recent[instance]:
            asked += prompt
            hit += cached
        return hit / asked if asked else 0.0

    def cache_stats(self) -> list[dict[str, int]]:
        """Each instance's cache counters (a run's ``cache_stats``)."""
        return [dataclasses.asdict(cache.stats) for cache in self.caches]
