"""One run-table schema (basin.runtables) for both writers: the simulator's
recorder and the replay client write the same shared columns with the same
dtypes, and each writes exactly its schema."""

from __future__ import annotations

import numpy as np
import pytest
from tests.gateway.test_replay_tables import SHORT, _log

from basin import runtables
from basin.experiments.runner import run_scenario
from basin.experiments.scenario import load_scenario
from basin.gateway.replay import run_tables
from basin.metrics import CALLS_COLUMNS, SESSIONS_COLUMNS, TIMESERIES_COLUMNS


@pytest.fixture(scope="module")
def both() -> dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    sim = run_scenario(load_scenario("surge-1p3d", SHORT), "basin").result
    calls, sessions, ts = run_tables(_log(), 180.0, capacity_tokens=5000.0)
    return {"calls": (sim.calls, calls), "sessions": (sim.sessions, sessions), "timeseries": (sim.timeseries, ts)}


def _kinds(table: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    return [(name, str(np.asarray(column).dtype)) for name, column in table.items()]


@pytest.mark.parametrize("name, sim_schema, replay_schema", [
    ("calls", runtables.SIM_CALLS, runtables.REPLAY_CALLS),
    ("sessions", runtables.SIM_SESSIONS, runtables.REPLAY_SESSIONS),
    ("timeseries", runtables.TIMESERIES, runtables.TIMESERIES),
])
def test_both_writers_write_their_schema_and_share_its_columns(both, name, sim_schema, replay_schema):
    sim, replay = both[name]
    for table, schema in ((sim, sim_schema), (replay, replay_schema)):
        named = [(c, str(k)) for c, k in schema.columns]
        tags = [(c, "float64") for c in table if c.startswith(runtables.ACTIVE_TAG_PREFIX)
                and c not in schema.names]
        assert _kinds(table) == named + tags
    shared = sim_schema.shared_names
    assert shared == replay_schema.shared_names
    assert [(c, sim[c].dtype) for c in shared] == [(c, replay[c].dtype) for c in shared]


def test_the_metrics_require_the_schemas_leading_columns():
    assert CALLS_COLUMNS == runtables.CALLS.names[:16] == runtables.SIM_CALLS.required_names
    assert SESSIONS_COLUMNS == runtables.SESSIONS.names
    assert set(TIMESERIES_COLUMNS) < set(runtables.TIMESERIES.names)


def test_a_writer_that_forgets_or_invents_a_column_fails_at_once():
    good = {name: [] for name in runtables.SESSIONS.names}
    assert all(len(c) == 0 for c in runtables.SESSIONS.build(good).values())
    with pytest.raises(KeyError, match="left out column.*reference_s"):
        runtables.SESSIONS.build({k: v for k, v in good.items() if k != "reference_s"})
    with pytest.raises(KeyError, match="'status' is not in the run-table schema"):
        runtables.SESSIONS.build({**good, "status": []})
    with pytest.raises(KeyError, match="'active_base' is not"):
        runtables.SESSIONS.build({**good, "active_base": []})  # tag columns only in the timeseries


def test_columns_are_cast_to_the_schemas_dtype():
    values = {name: [1] for name in runtables.CALLS.names}
    table = runtables.CALLS.build(values)
    assert table["issued_s"].dtype == np.float64 and table["prompt_tokens"].dtype == np.int64
    assert table["tag"].dtype == object
