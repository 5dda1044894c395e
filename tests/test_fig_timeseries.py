"""The figure families (paper Fig. 15 and 21): the policy's per-minute action
columns, the family figure with its action bands and session CDFs, and
``basin compare --switch-on / --family / --bands``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from basin.experiments.plots import ACTION_BANDS, action_band_spans, plot_family
from basin.experiments.runner import ScenarioRun, run_scenario
from basin.experiments.scenario import load_scenario
from basin.metrics.actions import ACTION_COLUMNS, action_columns, derived_action_columns, with_action_columns
from basin.policy.driver import ActionLog, PolicyDriver, capture_drivers

#: Long enough for BASIN to act on the x5 surge (minutes 15-35): it parks new sessions from minute 33.
SHORT = ["duration_min=40", "measure_end_min=40"]


def _run(system: str, overrides: list[str] | None = None) -> tuple[ScenarioRun, dict[str, np.ndarray]]:
    with capture_drivers() as drivers:
        run = run_scenario(load_scenario("surge-1p3d", overrides or SHORT), system)
    assert len(drivers) == 1
    log = drivers[0].actions
    assert log is not None
    return run, with_action_columns(run.result.timeseries, log.changes, log.shed_s)


@pytest.fixture(scope="module")
def hicache() -> tuple[ScenarioRun, dict[str, np.ndarray]]:
    return _run("hicache")


@pytest.fixture(scope="module")
def basin() -> tuple[ScenarioRun, dict[str, np.ndarray]]:
    return _run("basin")


# ------------------------------------------------------------ the columns
def test_shares_of_each_minute_follow_the_log() -> None:
    # Lending on from 30 s to 150 s, ordering from 90 s to the end, never limited.
    changes = [(0.0, False, False, False), (30.0, True, False, False), (90.0, True, True, False),
               (150.0, False, True, False)]
    cols = action_columns(changes, shed_s=[10.0, 59.9, 61.0, 400.0], n_minutes=4)
    assert set(cols) == set(ACTION_COLUMNS)
    np.testing.assert_allclose(cols["policy_lending"], [0.5, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(cols["policy_ordering"], [0.0, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(cols["policy_admission_limited"], 0.0)
    np.testing.assert_array_equal(cols["sessions_shed"], [2, 1, 0, 0])  # 400 s is past the last row


def test_the_log_records_changes_only() -> None:
    log = ActionLog()
    log.note(1.0, False, False, False)
    log.note(2.0, True, False, False)
    log.note(3.0, True, False, False)
    assert log.changes == [(0.0, False, False, False), (2.0, True, False, False)]


def test_a_driver_outside_a_capture_keeps_no_log() -> None:
    """The gateway's driver runs for days: only a captured run records its actions."""
    from basin.policy.basin import BasinPolicy

    outside = PolicyDriver(BasinPolicy(), object())  # type: ignore[arg-type]
    assert outside.actions is None
    with capture_drivers() as drivers:
        inside = PolicyDriver(BasinPolicy(), object())  # type: ignore[arg-type]
    assert drivers == [inside] and inside.actions is not None


def test_a_policy_that_never_acts_reports_zeros(hicache) -> None:
    run, ts = hicache
    for col in ACTION_COLUMNS:
        assert col in ts and len(ts[col]) == len(ts["minute"])
        assert np.all(ts[col] == 0), col


def test_basin_actions_are_recorded_and_consistent(basin) -> None:
    run, ts = basin
    for col in ACTION_COLUMNS[:3]:
        assert np.all((ts[col] >= 0) & (ts[col] <= 1)), col
    assert ts["policy_lending"].max() > 0 and ts["policy_ordering"].max() > 0
    assert ts["policy_admission_limited"].max() > 0
    # A session parked at a minute's end means admission was limited in that minute.
    parked = ts["parked_sessions"] > 0
    assert parked.any() and np.all(ts["policy_admission_limited"][parked] > 0)
    # Memory lent at a minute's end was lent on the policy's word in that minute or before.
    lent = np.flatnonzero(ts["decode_kv_lent_tokens"] > 0)
    assert lent.size and ts["policy_lending"][: lent[0] + 1].max() > 0
    # Nothing before the surge: the controls engage only when their conditions hold.
    assert ts["policy_admission_limited"][:10].max() == 0
    # Sheds counted per minute add up to the sessions shed in the run (within its minutes).
    assert ts["sessions_shed"].sum() == run.result.sessions["shed"].sum()


def test_capturing_the_driver_leaves_the_run_unchanged(basin) -> None:
    run, _ = basin
    plain = run_scenario(load_scenario("surge-1p3d", SHORT), "basin")
    for name in ("calls", "sessions", "timeseries"):
        a, b = getattr(plain.result, name), getattr(run.result, name)
        assert list(a) == list(b)
        for col in a:
            np.testing.assert_array_equal(a[col], b[col], err_msg=f"{name}.{col}")


def test_derived_columns_of_a_table_without_them() -> None:
    ts = {"minute": np.arange(4), "decode_kv_lent_tokens": np.array([0, 5, 0, 1.0]),
          "parked_sessions": np.array([0, 0, 3, 0.0])}
    d = derived_action_columns(ts)
    np.testing.assert_array_equal(d["policy_lending"], [0, 1, 0, 1])
    np.testing.assert_array_equal(d["policy_admission_limited"], [0, 0, 1, 0])
    assert "policy_ordering" not in d
    assert derived_action_columns({**ts, "policy_lending": np.zeros(4)}).keys() == {"policy_admission_limited"}


# ------------------------------------------------------------ the figure
def test_band_spans_merge_consecutive_minutes() -> None:
    ts = {"minute": np.arange(6), "policy_lending": np.array([0, 0.2, 1, 0, 0.5, 0]),
          "policy_ordering": np.zeros(6)}
    spans = action_band_spans(ts)
    assert spans == {"policy_lending": [(1.0, 3.0), (4.0, 5.0)], "policy_ordering": []}


def _band_labels(fig) -> list[str]:
    ax = fig.axes[0]
    return [p.get_label() for p in ax.patches if not p.get_label().startswith("_") and p.get_label() != "surge"]


def test_the_family_figure_draws_bands_when_the_columns_say_so(tmp_path: Path, hicache, basin) -> None:
    runs = {"hicache": [(hicache[0].result.calls, hicache[0].result.sessions, hicache[1])],
            "basin": [(basin[0].result.calls, basin[0].result.sessions, basin[1])]}
    out = tmp_path / "fam.png"
    fig = plot_family(runs, out, measure_end_s=1800.0, run_end_s=1800.0, shade_windows=[(15, 35)],
                      bands_of="basin", goodput_per_h={"hicache": 1.0, "basin": 2.0})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(fig.axes) == 4
    labels = _band_labels(fig)
    assert "basin lends decode memory" in labels and "basin limits admission" in labels
    assert "basin sheds" not in labels  # nothing shed in 30 minutes
    ax_n, _, ax_s, ax_w = fig.axes
    assert ax_s.get_xscale() == "log" and ax_w.get_xscale() == "log"
    # The sessions curve counts parked sessions.
    y = np.asarray(ax_n.get_lines()[1].get_ydata(), dtype=float)
    np.testing.assert_allclose(y, basin[1]["active_sessions"] + basin[1]["parked_sessions"])
    # Legend entries carry the goodput.
    assert "basin (2/h)" in fig.legends[0].get_texts()[1].get_text()
    # Each CDF ends at 1: sessions that never completed jump in at the right edge.
    for line in ax_s.get_lines()[:2]:
        assert np.asarray(line.get_ydata(), dtype=float)[-1] == pytest.approx(1.0)


def test_bands_of_a_policy_that_never_acts_draw_nothing(tmp_path: Path, hicache) -> None:
    runs = {"hicache": [(hicache[0].result.calls, hicache[0].result.sessions, hicache[1])]}
    fig = plot_family(runs, tmp_path / "h.png", measure_end_s=1800.0, run_end_s=1800.0, bands_of="hicache")
    assert _band_labels(fig) == []
    with pytest.raises(ValueError, match="no run of 'basin'"):
        plot_family(runs, tmp_path / "x.png", measure_end_s=1800.0, run_end_s=1800.0, bands_of="basin")


def test_band_rows_are_the_action_columns() -> None:
    assert tuple(c for c, _, _ in ACTION_BANDS) == ACTION_COLUMNS


# ------------------------------------------------------------ switching on
def test_switch_on_starts_under_hicache_or_crossflow() -> None:
    from basin.experiments.plan import switch_on_start, switched_scenario

    assert switch_on_start("hicache") is None and switch_on_start("crossflow") is None
    assert switch_on_start("basin") == switch_on_start("continuum") == "hicache"
    assert switch_on_start("composition") == "crossflow"
    sc = load_scenario("fig21-switch-on")
    assert [iv.switch_policy for iv in sc.interventions] == ["basin"]
    to_cont, start = switched_scenario(sc, "continuum", 45.0)
    assert start == "hicache" and [(iv.at_min, iv.switch_policy) for iv in to_cont.interventions] == [
        (45.0, "continuum")]
    plain, start = switched_scenario(sc, "hicache", 45.0)
    assert start == "hicache" and plain.interventions == ()


def test_a_switched_run_acts_only_after_the_switch(tmp_path: Path) -> None:
    from basin.experiments.compare import compare_plan, result_row
    from basin.experiments.runner import execute_plan
    from basin.metrics.io import read_run

    row = result_row("surge-1p3d", execute_plan(compare_plan("surge-1p3d", SHORT, "basin", 0, str(tmp_path / "run"),
                                                             20.0)))
    assert row["system"] == "basin"
    _, _, ts = read_run(tmp_path / "run")
    assert ts["policy_lending"][:20].max() == 0 and ts["policy_ordering"][:20].max() == 0
    assert ts["policy_lending"][20:].max() > 0


def test_compare_refuses_bands_without_family_and_family_without_tables(capsys, monkeypatch) -> None:
    from tests.cli_helpers import run_basin

    import basin.experiments.compare as compare_mod

    monkeypatch.setattr(compare_mod, "run_compare", None)  # a run would fail loudly
    code, _, err = run_basin(capsys, "compare", "surge-1p3d", "--system", "basin", "--bands", "basin")
    assert code == 2 and "--bands draws on the --family figure" in err
    code, _, err = run_basin(capsys, "compare", "surge-1p3d", "--system", "basin", "--family", "f.png",
                             "--no-tables")
    assert code == 2 and "--family draws from the runs' tables" in err
    code, _, err = run_basin(capsys, "compare", "surge-1p3d", "--system", "hicache", "--family", "f.png",
                             "--bands", "basin")
    assert code == 2 and "--bands basin: not a system of this run" in err


def test_the_run_timeseries_draws_bands_and_parked_sessions(tmp_path: Path, hicache, basin) -> None:
    from basin.experiments.plots import plot_run_timeseries

    runs = {"hicache": hicache[1], "basin": basin[1]}
    fig = plot_run_timeseries(runs, tmp_path / "ts.png", bands_of="basin", include_parked=True)
    assert "basin orders queues by priority" in _band_labels(fig)
    y = np.asarray(fig.axes[0].get_lines()[1].get_ydata(), dtype=float)
    np.testing.assert_allclose(y, basin[1]["active_sessions"] + basin[1]["parked_sessions"])
    plain = plot_run_timeseries(runs, tmp_path / "plain.png")
    assert _band_labels(plain) == []
    assert plain.axes[0].get_ylabel() == "active sessions"


def test_compare_switch_on_draws_the_family_figure(tmp_path: Path, capsys) -> None:
    import json

    from tests.cli_helpers import run_basin

    fam = tmp_path / "fam.png"
    code, _, err = run_basin(capsys, "compare", "fig21-switch-on", "--system", "hicache", "--system", "basin",
                             "--switch-on", "10", "--set", "duration_min=20", "--set", "measure_end_min=20",
                             "--jobs", "1", "--out", str(tmp_path / "out"), "--family", str(fam),
                             "--bands", "basin", "--csv")
    assert code == 0, err
    assert fam.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert prov["outputs"]["switch_on_min"] == 10.0
    assert prov["outputs"]["family_plots"] == {"fig21-switch-on": str(fam)}
    from basin.metrics.io import read_run

    _, _, ts = read_run(tmp_path / "out" / "runs" / "fig21-switch-on" / "basin" / "seed-0")
    assert ts["policy_ordering"][:10].max() == 0  # HiCache until the switch
    _, _, ts = read_run(tmp_path / "out" / "runs" / "fig21-switch-on" / "hicache" / "seed-0")
    assert all(ts[c].max() == 0 for c in ACTION_COLUMNS)  # the scenario's own switch to basin is replaced
