"""The run tables' schema: every column a run is recorded in, with its dtype.

A run is three tables (``calls``, ``sessions``, ``timeseries``), each a
``dict[str, numpy.ndarray]`` of equal-length 1-D columns; NaN marks an event
that did not happen. Two writers make them, the simulator's recorder
(:mod:`basin.sim.recorder`) and the replay client against a real engine
(:mod:`basin.gateway.replay`), and :mod:`basin.metrics` reads them. This base
module is the one place the columns are named and typed, so the writers
cannot drift apart: each builds its tables through :meth:`Schema.build`,
which refuses a column the schema does not name and casts every column to
the schema's dtype. The simulator may not import ``metrics`` (docs/architecture.md),
hence a base module both may import (numpy only).

Each table has the columns both writers fill (:attr:`Schema.shared`, what
the metrics read) and those only one writer can fill (``SIM_*`` and
``REPLAY_*``): the engine's instance indices, a client's HTTP outcome. The
``timeseries`` is one schema for both: what a client cannot see of the
engine (its queues, decode memory) it writes as NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

#: One columnar table: column name -> 1-D array, all of one length.
Table = Mapping[str, np.ndarray]

#: Prefix of the timeseries' per-tag active-session columns (``active_<tag>``, float64).
ACTIVE_TAG_PREFIX = "active_"

SECONDS_PER_MINUTE = 60.0

_INT = np.dtype(np.int64)
_FLOAT = np.dtype(np.float64)
_BOOL = np.dtype(np.bool_)
_OBJECT = np.dtype(object)


@dataclass(frozen=True)
class Schema:
    """A table's columns in order, each with its dtype.

    The first ``required`` columns are those :mod:`basin.metrics` reads (a
    table without one is refused there); the first ``shared`` are filled by
    every writer of the table, the rest by one writer (:meth:`extended`).
    ``tag_columns`` allows the per-tag ``active_<tag>`` columns (float64)
    after the named ones.
    """

    table: str
    columns: tuple[tuple[str, np.dtype], ...]
    required: int
    tag_columns: bool = False
    shared: int = -1  # -1: all of ``columns``

    def __post_init__(self) -> None:
        if self.shared < 0:
            object.__setattr__(self, "shared", len(self.columns))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    @property
    def required_names(self) -> tuple[str, ...]:
        return self.names[:self.required]

    @property
    def shared_names(self) -> tuple[str, ...]:
        return self.names[:self.shared]

    def extended(self, *columns: tuple[str, np.dtype]) -> Schema:
        """This schema with one writer's own ``columns`` after the shared ones."""
        return Schema(self.table, self.columns[:self.shared] + columns, self.required, self.tag_columns,
                      self.shared)

    def dtype(self, name: str) -> np.dtype:
        """The dtype of column ``name``; a column the schema does not name is a bug in its writer."""
        for column, kind in self.columns:
            if column == name:
                return kind
        if self.tag_columns and name.startswith(ACTIVE_TAG_PREFIX):
            return _FLOAT
        raise KeyError(f"{self.table} table: column '{name}' is not in the run-table schema (basin.runtables)")

    def build(self, values: Mapping[str, Iterable[object]]) -> dict[str, np.ndarray]:
        """The table of ``values`` (column -> its values), in the schema's order
        (tag columns last, in the order given), each column cast to its dtype.

        Every named column must be given and nothing else: a writer that forgets
        one or invents one fails here, not in a reader later."""
        missing = [name for name in self.names if name not in values]
        if missing:
            raise KeyError(f"{self.table} table: the writer left out column(s) {', '.join(missing)}")
        table = {name: _column(values[name], kind) for name, kind in self.columns}
        for name, given in values.items():
            if name not in table:
                table[name] = _column(given, self.dtype(name))
        return table


def _column(values: Iterable[object], kind: np.dtype) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values.astype(kind, copy=False)
    if kind == _OBJECT:
        return np.array(list(values), dtype=object)
    # fromiter: no search of each value's shape, as np.array makes
    items = values if isinstance(values, (list, tuple)) else list(values)
    return np.fromiter(items, dtype=kind, count=len(items))


#: One row per finished call (a replay: per call sent, answered or not).
CALLS = Schema("calls", (
    ("session_uid", _INT), ("tag", _OBJECT), ("call_index", _INT), ("issued_s", _FLOAT),
    ("admitted_s", _FLOAT), ("prefill_start_s", _FLOAT), ("first_token_s", _FLOAT), ("finished_s", _FLOAT),
    ("prompt_tokens", _INT), ("cached_tokens", _INT), ("loaded_tokens", _INT), ("uncached_tokens", _INT),
    ("output_tokens", _INT), ("decode_steps", _INT), ("itl_violations", _INT), ("retractions", _INT),
), required=16)
#: The simulator's calls: which prefill and decode instance served each.
SIM_CALLS = CALLS.extended(("prefill_instance", _INT), ("decode_instance", _INT))
#: The replay client's calls: the HTTP status, ``ok``/``error``/... and the error's text.
REPLAY_CALLS = CALLS.extended(("status", _INT), ("outcome", _OBJECT), ("error", _OBJECT))

#: One row per session that arrived (finished or not, shed or not).
SESSIONS = Schema("sessions", (
    ("session_uid", _INT), ("session_id", _OBJECT), ("tag", _OBJECT), ("warm", _BOOL), ("arrival_s", _FLOAT),
    ("first_admitted_s", _FLOAT), ("finished_s", _FLOAT), ("shed", _BOOL), ("n_calls", _INT),
    ("calls_done", _INT), ("reference_s", _FLOAT), ("decode_steps", _INT), ("itl_violations", _INT),
), required=13)
SIM_SESSIONS = SESSIONS
#: The replay client's sessions: how each ended (``completed``, ``shed``, ``failed``, ...) and when.
REPLAY_SESSIONS = SESSIONS.extended(("outcome", _OBJECT), ("ended_s", _FLOAT))

#: One row per minute ``m`` (values for ``[m, m+1)``), then ``active_<tag>`` per tag.
TIMESERIES = Schema("timeseries", (
    ("minute", _INT), ("arrivals", _FLOAT), ("sessions_completed", _FLOAT), ("calls_completed", _FLOAT),
    ("active_sessions", _FLOAT), ("parked_sessions", _FLOAT), ("working_set_tokens", _FLOAT),
    ("cache_capacity_tokens", _FLOAT), ("prompt_tokens", _FLOAT), ("cached_tokens", _FLOAT),
    ("loaded_tokens", _FLOAT), ("uncached_tokens", _FLOAT), ("ttft_p50_s", _FLOAT),
    ("decode_kv_decoding_tokens", _FLOAT), ("decode_kv_reserved_idle_tokens", _FLOAT),
    ("decode_kv_capacity_tokens", _FLOAT), ("prefill_queue_len", _FLOAT), ("decode_wait_len", _FLOAT),
    ("first_call_wait_p50_s", _FLOAT),
    # the engine's own gauges, not read by the metrics
    ("host_capacity_tokens", _FLOAT), ("decode_kv_lent_tokens", _FLOAT), ("decode_running", _FLOAT),
), required=19, tag_columns=True)

#: The engine-side timeseries columns a client cannot see (the replay writes NaN).
ENGINE_ONLY_TIMESERIES = ("host_capacity_tokens", "decode_kv_decoding_tokens", "decode_kv_reserved_idle_tokens",
                          "decode_kv_capacity_tokens", "decode_kv_lent_tokens", "prefill_queue_len",
                          "decode_wait_len", "decode_running")
