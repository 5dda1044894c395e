"""Decode memory lent as prefix cache (BASIN's engine change, section 6.2).

After a call, its decode instance may keep the prompt's KV, already delivered
by the PD transfer, as a *unit* for the session, while it has headroom beyond
queued and running decode demand. On the session's next call the prefill
instance fetches the unit when it covers more than the local cache match, at
a transfer cost, instead of recomputing. Decode allocations always come
first: they reclaim units (those the prefill cache still holds anyway first,
then the least recently used) before any running request is retracted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LendingConfig:
    """Headroom rules. Fractions are of the decode instance's KV capacity."""

    #: Lent memory never exceeds this share of decode memory (phi).
    cap_fraction: float = 0.5
    #: A unit is adopted only if this much stays free beyond decode demand.
    adopt_margin_fraction: float = 0.10
    #: Units are reclaimed once free memory beyond demand falls below this.
    reclaim_margin_fraction: float = 0.05
    #: Unit transfer to prefill: fixed setup plus tokens at this rate (NVLink).
    fetch_setup_s: float = 0.002
    fetch_tokens_per_s: float = 2.5e6


class LentMemory:
    """The units one decode instance holds, in least-recently-used order."""

    def __init__(self, capacity_tokens: int, config: LendingConfig,
                 on_change: Callable[[], None] | None = None):
        self.capacity = capacity_tokens
        self.config = config
        #: Told after every change of ``lent`` (its decode instance lists
        #: itself for a refresh of the router's view, DecodeRoom).
        self.on_change = on_change
        self.units: OrderedDict[int, int] = OrderedDict()  # session uid -> tokens
        self.lent = 0
        self.adopted = 0
        self.reclaimed = 0

    def covered(self, uid: int) -> int:
        return self.units.get(uid, 0)

    def touch(self, uid: int) -> None:
        if uid in self.units:
            self.units.move_to_end(uid)

    def drop(self, uid: int) -> None:
        tokens = self.units.pop(uid, 0)
        if tokens:
            self.lent -= tokens
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def adopt(self, uid: int, tokens: int, free_beyond_demand: int) -> bool:
        """Keep a session's prompt as a unit if the headroom rules allow."""
        self.drop(uid)
        cfg = self.config
        if tokens <= 0:
            return False
        if self.lent + tokens > cfg.cap_fraction * self.capacity:
            return False
        if free_beyond_demand - tokens < cfg.adopt_margin_fraction * self.capacity:
            return False
        self.units[uid] = tokens
        self.lent += tokens
        self.adopted += 1
        self._changed()
        return True

    def reclaim(self, tokens: int, held_by_prefill: Callable[[int, int], bool]) -> int:
        """Free at least ``tokens`` if possible: units the prefill cache also
        holds go first, then the least recently used. Returns tokens freed."""
        freed = 0
        if tokens <= 0 or not self.units:
            return 0
        redundant = [uid for uid, n in self.units.items() if held_by_prefill(uid, n)]
        for uid in redundant + list(self.units):
            if freed >= tokens:
                break
            n = self.units.pop(uid, 0)
            if n:
                self.lent -= n
                freed += n
                self.reclaimed += 1
        if freed:
            self._changed()
        return freed

    def maintain(self, free_beyond_demand: int, held_by_prefill: Callable[[int, int], bool]) -> int:
        """Start reclaiming when the headroom falls under the lower margin."""
        floor = self.config.reclaim_margin_fraction * self.capacity
        if free_beyond_demand >= floor:
            return 0
        return self.reclaim(int(floor - free_beyond_demand) + 1, held_by_prefill)


class LentTier:
    """The prefill side's view of every decode instance's units (a
    :class:`basin.sim.prefill.LowerTier`): a per-session index of the latest
    unit's decode instance."""

    def __init__(self, memories: Sequence[LentMemory], config: LendingConfig):
        self.memories = list(memories)
        self.config = config
        self.where: dict[int, int] = {}
        self.fetched_tokens = 0

    def record(self, uid: int, decode_index: int) -> None:
        old = self.where.get(uid)
        if old is not None and old != decode_index:
            self.memories[old].drop(uid)
        self.where[uid] = decode_index

    def forget(self, uid: int) -> None:
        index = self.where.pop(uid, None)
        if index is not None:
            self.memories[index].drop(uid)

    def covered_tokens(self, session_uid: int, prompt_tokens: int) -> int:
        index = self.where.get(session_uid)
        return self.memories[index].covered(session_uid) if index is not None else 0

    def fetch(self, session_uid: int, tokens: int, now: float) -> float:
        index = self.where.get(session_uid)
        if index is not None:
            self.memories[index].touch(session_uid)
        self.fetched_tokens += tokens
        return self.config.fetch_setup_s + tokens / self.config.fetch_tokens_per_s

    @property
    def lent_tokens(self) -> int:
        return sum(m.lent for m in self.memories)
