"""Run records: one row per finished call, per session, per simulated minute.

Rows are appended to plain lists and turned into numpy columns once at the
end, in the run-table schema of :mod:`basin.runtables` (the contract with
:mod:`basin.metrics` and the replay client).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from basin.runtables import ACTIVE_TAG_PREFIX, SIM_CALLS, SIM_SESSIONS, TIMESERIES
from basin.sim.requests import Request
from basin.sim.sessions import SessionState

#: The order of a row of :attr:`Recorder.calls`: the simulator's calls columns.
CALL_COLUMNS: Final = SIM_CALLS.names
#: One finished call, in :data:`CALL_COLUMNS` order: the session's key, its
#: tag, the call's index, five times (s), eight token and step counts, and
#: the indices of its prefill and decode instances.
CallRow = tuple[int, str, int, float, float, float, float, float, int, int, int, int, int, int, int, int, int, int]


def median(values: list[float]) -> float:
    """``numpy.median`` of a minute's values, NaN when there are none (a sort
    of a few hundred numbers; numpy's call overhead was most of a minute's
    close). NaN anywhere gives NaN, as in numpy, and the middle values are
    summed from 0.0 as numpy's mean sums them (so -0.0 comes out as 0.0)."""
    n = len(values)
    if n == 0 or any(v != v for v in values):
        return float("nan")
    ordered = sorted(values)
    half = n // 2
    if n % 2:
        return 0.0 + ordered[half]
    return (0.0 + ordered[half - 1] + ordered[half]) / 2.0


#: The engine's cumulative prompt tokens prefilled: all, cached on the
#: device, loaded back, computed (:meth:`basin.sim.cluster.Cluster.prefill_totals`).
PrefillTotals = tuple[int, int, int, int]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[CallRow] = []
        self.minutes: list[dict[str, float]] = []
        # running sums for the current minute
        self._arrivals = 0
        self._sessions_done = 0
        self._calls_done = 0
        self._ttfts: list[float] = []
        self._first_waits: list[float] = []
        #: The engine's prefill totals when the current minute began.
        self._base: PrefillTotals = (0, 0, 0, 0)
        # sliding hit-rate signal (the last two minutes)
        self._prev_prompt = 0
        self._prev_hit = 0

    # ------------------------------------------------------------- events
    def arrival(self) -> None:
        self._arrivals += 1

    def first_admitted(self, wait_s: float) -> None:
        self._first_waits.append(wait_s)

    def first_token(self, req: Request) -> None:
        self._ttfts.append(req.first_token_s - req.admitted_s)

    def call_done(self, req: Request, tag: str, viol: int) -> None:
        self._calls_done += 1
        self.calls.append((
            req.session, tag, req.call_index, req.issued_s, req.admitted_s, req.prefill_start_s,
            req.first_token_s, req.finished_s, req.prompt, req.cached, req.loaded, req.uncached,
            req.output, req.decode_steps, viol, req.retractions,
            req.prefill, req.decode,
        ))

    def session_done(self) -> None:
        self._sessions_done += 1

    def recent_hit_rate(self, totals: PrefillTotals) -> float:
        """Hit rate of the prompts prefilled this minute and the last, the
        engine's totals now being ``totals``."""
        base = self._base
        prompt = totals[0] - base[0] + self._prev_prompt
        if prompt == 0:
            return float("nan")
        return (totals[1] - base[1] + totals[2] - base[2] + self._prev_hit) / prompt

    # ------------------------------------------------------------ per minute
    def close_minute(self, minute: int, gauges: Mapping[str, float], active_by_tag: Counter[str],
                     totals: PrefillTotals) -> None:
        """Close minute ``minute``; the engine's prefill totals are ``totals`` now."""
        base = self._base
        prompt, cached, loaded, uncached = (totals[0] - base[0], totals[1] - base[1], totals[2] - base[2],
                                            totals[3] - base[3])
        row: dict[str, float] = {
            "minute": minute,
            "arrivals": self._arrivals,
            "sessions_completed": self._sessions_done,
            "calls_completed": self._calls_done,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "loaded_tokens": loaded,
            "uncached_tokens": uncached,
            "ttft_p50_s": median(self._ttfts),
            "first_call_wait_p50_s": median(self._first_waits),
        }
        row.update(gauges)
        for tag, n in active_by_tag.items():
            row[f"active_{tag}"] = n
        self.minutes.append(row)
        self._prev_prompt = prompt
        self._prev_hit = cached + loaded
        self._base = totals
        self._arrivals = self._sessions_done = self._calls_done = 0
        self._ttfts = []
        self._first_waits = []

    # ---------------------------------------------------------------- tables
    def calls_table(self) -> dict[str, np.ndarray]:
        cols: list[Sequence[object]] = list(zip(*self.calls)) if self.calls else [[] for _ in CALL_COLUMNS]
        return SIM_CALLS.build(dict(zip(CALL_COLUMNS, cols)))

    def timeseries_table(self) -> dict[str, np.ndarray]:
        names = list(TIMESERIES.names)
        for row in self.minutes:
            for key in row:
                if key not in names:
                    names.append(key)
        nan = float("nan")
        return TIMESERIES.build({
            name: [row.get(name, 0 if name.startswith(ACTIVE_TAG_PREFIX) else nan) for row in self.minutes]
            for name in names})

    @staticmethod
    def sessions_table(sessions: list[SessionState]) -> dict[str, np.ndarray]:
        return SIM_SESSIONS.build({
            "session_uid": [s.uid for s in sessions],
            "session_id": [s.record.session_id for s in sessions],
            "tag": [s.tag for s in sessions],
            "warm": [s.warm for s in sessions],
            "arrival_s": [s.arrival_s for s in sessions],
            "first_admitted_s": [s.admitted_s for s in sessions],
            "finished_s": [s.finished_s for s in sessions],
            "shed": [s.shed for s in sessions],
            "n_calls": [len(s.calls) for s in sessions],
            "calls_done": [s.calls_done for s in sessions],
            "reference_s": [s.reference_s for s in sessions],
            "decode_steps": [s.decode_steps for s in sessions],
            "itl_violations": [s.itl_violations_total() for s in sessions],
        })
