"""Small builders for the simulator's unit tests: sessions, requests, instances."""

from __future__ import annotations

from basin.catalog import load_hardware
from basin.sim.cache import RadixCache
from basin.sim.events import EventLoop
from basin.sim.prefill import PrefillInstance
from basin.sim.requests import Request
from basin.sim.sessions import SessionState
from basin.workload.records import Call, Session

HW = load_hardware("h200")


def request(uid: int, prompt: int, output: int = 10, seq: int | None = None, key=None) -> Request:
    """A first call of a one-call session ``uid``; its key is one private chunk
    unless given."""
    session = Session(f"s{uid}", (Call(prompt, prompt, output),))
    state = SessionState(uid, session, "base", 0.0, 0, None)
    return state.request(0, list(key) if key is not None else state.prompt_key(0), uid if seq is None else seq, 0.0)


def prefill(index: int, cache_tokens: int = 1 << 20, loop: EventLoop | None = None,
            on_done=None, page_tokens: int = 64, loads: list[int] | None = None) -> PrefillInstance:
    return PrefillInstance(index, HW.prefill, RadixCache(cache_tokens, page_tokens=page_tokens),
                           loop or EventLoop(), on_done or (lambda r: None), loads)


def prefills(n: int, **kw) -> list[PrefillInstance]:
    """``n`` prefill instances posting their loads to one list (``[0].loads``), as an engine's do."""
    loads = [0] * n
    return [prefill(i, loads=loads, **kw) for i in range(n)]
