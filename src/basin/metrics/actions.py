"""What the control policy did, minute by minute: the action columns of a run's
time series.

Every policy reports the same four columns (zeros for one that never acts), so
a figure can draw any system's actions the same way:

=============================  ===================================================
``policy_lending``             share of the minute decode memory was lent as cache
``policy_ordering``            share of the minute both queues were ordered by the
                               policy's priority
``policy_admission_limited``   share of the minute the policy's admission gate was
                               engaged or a session was parked
``sessions_shed``              sessions shed in the minute (at arrival or from the
                               parked queue)
=============================  ===================================================

The shares come from the driver's :class:`~basin.policy.driver.ActionLog`
(a step function of time); :func:`derived_action_columns` reads what an
older run's or a replay's table holds instead (lent memory, parked sessions),
and has no ordering column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from basin.metrics._tables import SECONDS_PER_MINUTE, Table, floats, table_length

#: The action columns, in the order a figure draws their bands (top first).
ACTION_COLUMNS: tuple[str, ...] = ("policy_lending", "policy_ordering", "policy_admission_limited",
                                   "sessions_shed")
#: The three step-function columns (shares of a minute, 0..1).
ACTION_SHARE_COLUMNS: tuple[str, ...] = ACTION_COLUMNS[:3]


def _share_per_minute(changes: Sequence[tuple[float, bool]], n_minutes: int) -> np.ndarray:
    """Share of each minute ``[m, m+1)`` that a step function was on.
    ``changes`` holds ``(time_s, on)`` in time order, the first at time 0 or
    before (the state before it is off)."""
    on_time = np.zeros(n_minutes)
    end = n_minutes * SECONDS_PER_MINUTE
    for i, (start, on) in enumerate(changes):
        if not on:
            continue
        stop = changes[i + 1][0] if i + 1 < len(changes) else end
        lo, hi = max(start, 0.0), min(stop, end)
        if hi <= lo:
            continue
        first, last = int(lo // SECONDS_PER_MINUTE), int(min(np.ceil(hi / SECONDS_PER_MINUTE), n_minutes))
        for m in range(first, last):
            m_lo, m_hi = m * SECONDS_PER_MINUTE, (m + 1) * SECONDS_PER_MINUTE
            on_time[m] += max(0.0, min(hi, m_hi) - max(lo, m_lo))
    return np.clip(on_time / SECONDS_PER_MINUTE, 0.0, 1.0)


def action_columns(changes: Sequence[tuple[float, bool, bool, bool]], shed_s: Sequence[float],
                   n_minutes: int) -> dict[str, np.ndarray]:
    """The four action columns for ``n_minutes`` rows, from an action log's
    ``changes`` (``(time_s, lending, ordering, admission_limited)``, time
    ordered) and shed times."""
    out = {}
    for k, name in enumerate(ACTION_SHARE_COLUMNS):
        out[name] = _share_per_minute([(c[0], bool(c[k + 1])) for c in changes], n_minutes)
    shed = np.asarray(shed_s, dtype=np.float64)
    counts = np.zeros(n_minutes)
    if shed.size:
        idx = (shed // SECONDS_PER_MINUTE).astype(np.int64)
        idx = idx[(idx >= 0) & (idx < n_minutes)]
        np.add.at(counts, idx, 1.0)
    out["sessions_shed"] = counts
    return out


def with_action_columns(timeseries: Table, changes: Sequence[tuple[float, bool, bool, bool]],
                        shed_s: Sequence[float]) -> dict[str, np.ndarray]:
    """``timeseries`` with the action columns added (row ``m`` is minute ``m``)."""
    n = table_length(timeseries, "timeseries")
    return {**timeseries, **action_columns(changes, shed_s, n)}


def derived_action_columns(timeseries: Table) -> dict[str, np.ndarray]:
    """The action columns a table lacks, read from what it holds: lending where
    decode memory is lent (``decode_kv_lent_tokens``), admission limited where
    a session is parked at the minute's end. Ordering cannot be read back and
    is left out; columns already present are kept as they are."""
    out: dict[str, np.ndarray] = {}
    if "policy_lending" not in timeseries and "decode_kv_lent_tokens" in timeseries:
        out["policy_lending"] = (np.nan_to_num(floats(timeseries, "decode_kv_lent_tokens")) > 0).astype(float)
    if "policy_admission_limited" not in timeseries and "parked_sessions" in timeseries:
        out["policy_admission_limited"] = (np.nan_to_num(floats(timeseries, "parked_sessions")) > 0).astype(float)
    return out
