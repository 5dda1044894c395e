"""The run figures are written and have the panels they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from basin.experiments.plots import TIMESERIES_PANELS, plot_cliff, plot_run_timeseries
from basin.metrics import cache_cliff_points
from test_metrics_builders import make_timeseries

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _trapped_timeseries(n: int = 120) -> dict[str, np.ndarray]:
    minute = np.arange(n)
    surge = (minute >= 15) & (minute < 25)
    hit = np.where(minute < 20, 0.95, 0.3)
    return make_timeseries(
        n,
        active_sessions=40.0 + np.cumsum(surge * 3.0 + (minute >= 25) * 0.5),
        active_base=40.0 + np.cumsum((minute >= 25) * 0.5),
        active_burst=np.cumsum(surge * 3.0),
        working_set_tokens=np.linspace(0.5e6, 3e6, n),
        cached_tokens=np.round(hit * 1000), loaded_tokens=0, uncached_tokens=np.round((1 - hit) * 1000),
        ttft_p50_s=np.where(minute < 20, 0.2, 60.0),
    )


def _assert_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_single_run_timeseries_splits_active_sessions_by_tag(tmp_path: Path) -> None:
    out = tmp_path / "figs" / "run.png"
    fig = plot_run_timeseries({"hicache": _trapped_timeseries()}, out, shade_windows=[(15, 25)], title="x5 surge")
    _assert_png(out)
    assert len(fig.axes) == len(TIMESERIES_PANELS) == 5
    ax_active, ax_hit, ax_ttft, _, ax_kv = fig.axes
    labels = [line.get_label() for line in ax_active.get_lines()]
    assert labels == ["all", "base", "burst"]
    assert ax_ttft.get_yscale() == "log"
    assert "surge" in ax_active.get_legend_handles_labels()[1]
    assert ax_kv.get_xlabel() == "time (min)"
    assert all(ax.get_ylabel() for ax in fig.axes)
    # The hit-rate line carries the per-minute rate: 0.95 before minute 20, 0.3 after.
    y = ax_hit.get_lines()[0].get_ydata()
    assert y[0] == 0.95 and y[-1] == 0.3


def test_several_systems_get_one_line_each(tmp_path: Path) -> None:
    runs = {"hicache": _trapped_timeseries(), "basin": make_timeseries(120), "continuum": make_timeseries(120)}
    fig = plot_run_timeseries(runs, tmp_path / "cmp.png")
    _assert_png(tmp_path / "cmp.png")
    ax_active, ax_hit, _, _, ax_kv = fig.axes
    assert [line.get_label() for line in ax_active.get_lines()] == list(runs)
    assert len(ax_hit.get_lines()) == 3
    assert len(ax_kv.get_lines()) == 6  # decoding and reserved-idle per system


def test_cliff_plot_accepts_points_or_timeseries(tmp_path: Path) -> None:
    ts = _trapped_timeseries()
    fig = plot_cliff({"run A": ts, "run B": cache_cliff_points(make_timeseries(60))}, tmp_path / "cliff.png")
    _assert_png(tmp_path / "cliff.png")
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert len(ax.collections) == 2                      # one scatter per run
    assert ax.collections[0].get_offsets().shape[0] == 60  # 120 minutes in 2-minute windows
    labels = ax.get_legend_handles_labels()[1]
    assert "working set = cache" in labels and any(label.startswith("binned median") for label in labels)
    assert "working set" in ax.get_xlabel() and "hit rate" in ax.get_ylabel()


def test_importing_plots_does_not_import_matplotlib() -> None:
    code = "import sys, basin.experiments.plots; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_interventions_are_labelled_lines_on_every_panel(tmp_path: Path) -> None:
    from basin.experiments.plots import intervention_marks
    from basin.experiments.scenario import InterventionSpec

    marks = intervention_marks([InterventionSpec(at_min=30, switch_policy="basin"),
                                InterventionSpec(at_min=60, terminate_tag="burst")])
    assert marks == [(30.0, "switch to basin"), (60.0, "terminate burst")]
    fig = plot_run_timeseries({"hicache": _trapped_timeseries()}, tmp_path / "iv.png", interventions=marks)
    for ax in fig.axes:
        assert {30.0, 60.0} <= {line.get_xdata()[0] for line in ax.get_lines() if len(set(line.get_xdata())) == 1}
    assert [t.get_text() for t in fig.axes[0].texts] == ["switch to basin", "terminate burst"]


def test_eight_systems_get_distinct_colours_and_one_legend_outside(tmp_path: Path) -> None:
    runs = {f"system-{i}": make_timeseries(60) for i in range(8)}
    fig = plot_run_timeseries(runs, tmp_path / "eight.png")
    _assert_png(tmp_path / "eight.png")
    ax_hit = fig.axes[1]
    assert len({line.get_color() for line in ax_hit.get_lines()}) == 8
    assert len(fig.legends) == 1 and [t.get_text() for t in fig.legends[0].get_texts()] == list(runs)
    fig.canvas.draw()
    legend_box = fig.legends[0].get_window_extent()
    assert all(legend_box.x0 >= ax.get_window_extent().x1 for ax in fig.axes)
    assert len(fig.axes[-1].get_legend().get_texts()) == 2  # decoding / reserved, not one per system


def test_cliff_axis_names_the_capacity_it_divides_by(tmp_path: Path) -> None:
    fig = plot_cliff({"run": _trapped_timeseries()}, tmp_path / "cliff.png")
    assert "GPU prefix cache" in fig.axes[0].get_xlabel() and "no host tier" in fig.axes[0].get_xlabel()


def test_nine_systems_differ_in_colour_line_style_and_marker(tmp_path: Path) -> None:
    """With every registered system on one plot, neighbours (basin, basin-paper)
    differ in all three, and no two systems share a look."""
    runs = {f"system {i}": make_timeseries(30) for i in range(9)}
    fig = plot_run_timeseries(runs, tmp_path / "nine.png")
    looks = [(line.get_color(), line.get_linestyle(), line.get_marker()) for line in fig.axes[1].get_lines()]
    assert len(looks) == 9 and len(set(looks)) == 9
    assert all(a[k] != b[k] for a, b in zip(looks, looks[1:]) for k in range(3))


def test_binned_median_is_drawn_only_across_bins_with_samples(tmp_path: Path) -> None:
    from basin.metrics import CliffPoints

    # Windows near 0.5 and near 1.5 of the cache, none between: no line over the empty range.
    x = np.array([0.51, 0.52, 0.53, 0.61, 0.62, 0.63, 1.51, 1.52, 1.53])
    points = CliffPoints(np.arange(x.size, dtype=float), x, np.full(x.size, 0.5))
    fig = plot_cliff({"run": points}, tmp_path / "gap.png")
    (median,) = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("binned median")]
    xs = np.asarray(median.get_xdata(), dtype=float)
    assert np.isnan(xs).sum() == 1  # one break, between 0.65 and 1.55
    left, right = xs[: int(np.flatnonzero(np.isnan(xs))[0])], xs[int(np.flatnonzero(np.isnan(xs))[0]) + 1:]
    assert left.max() < 0.7 and right.min() > 1.5
