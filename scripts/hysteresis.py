"""Cache hysteresis from sweep folders (the paper's Fig. 10b): the hit rate of each
run's 2-minute windows against the working set, split by whether the run's cache
had already collapsed (a window's hit rate below --collapsed-below after the surge
began) or never had. Prints a markdown table of binned medians and draws the
windows as a scatter.

    .venv/bin/python scripts/hysteresis.py results/figs/fig10-post-surge-gpuonly \\
        [more sweep folders] [--from-min 40] [--png docs/img/fig10-hysteresis.png]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from basin.plotting import new_figure, save_figure

WINDOW_MIN = 2


def windows(run_dir: Path, surge_start_min: float, collapsed_below: float, from_min: float
            ) -> list[tuple[float, float, bool]]:
    """(working set / GPU cache, hit rate, collapsed before) for each window from ``from_min``."""
    ts = pq.read_table(run_dir / "timeseries.parquet").to_pydict()
    out, collapsed = [], False
    minutes = ts["minute"]
    for i in range(0, len(minutes) - WINDOW_MIN + 1, WINDOW_MIN):
        rows = range(i, i + WINDOW_MIN)
        prompt = sum(ts["prompt_tokens"][j] for j in rows)
        if prompt <= 0:
            continue
        hit = sum(ts["cached_tokens"][j] + ts["loaded_tokens"][j] for j in rows) / prompt
        working_set = sum(ts["working_set_tokens"][j] for j in rows) / WINDOW_MIN / ts["cache_capacity_tokens"][i]
        if minutes[i] >= from_min:
            out.append((working_set, hit, collapsed))
        if minutes[i] >= surge_start_min and hit < collapsed_below:
            collapsed = True
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep output folders (sweep.parquet and runs/)")
    parser.add_argument("--from-min", type=float, default=40.0, help="first scenario minute counted")
    parser.add_argument("--surge-start-min", type=float, default=15.0)
    parser.add_argument("--collapsed-below", type=float, default=0.3)
    parser.add_argument("--bin", type=float, default=0.2, help="working-set bin width (x GPU cache)")
    parser.add_argument("--png", type=Path, help="also draw the windows as a scatter here")
    args = parser.parse_args()
    points: list[tuple[float, float, bool]] = []
    for folder in args.sweeps:
        for row in pq.read_table(folder / "sweep.parquet").to_pylist():
            points += windows(folder / "runs" / row["run"], args.surge_start_min, args.collapsed_below, args.from_min)
    bins: dict[float, dict[bool, list[float]]] = defaultdict(lambda: {True: [], False: []})
    for ws, hit, collapsed in points:
        bins[round(ws / args.bin) * args.bin][collapsed].append(hit)

    def cell(values: list[float]) -> str:
        if not values:
            return "-"
        return f"{len(values)}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    print("| working set / GPU cache | after a collapse: windows: median hit (range) | never collapsed |")
    print("| --- | --- | --- |")
    for b in sorted(bins):
        print(f"| {b:.1f} | {cell(bins[b][True])} | {cell(bins[b][False])} |")
    if args.png:
        fig = new_figure(6.5, 4.0)
        ax = fig.add_subplot(1, 1, 1)
        for collapsed, color, label in ((False, "tab:blue", "never collapsed"), (True, "tab:red", "after a collapse")):
            xs = [ws for ws, _, c in points if c is collapsed]
            ys = [h for _, h, c in points if c is collapsed]
            ax.scatter(xs, ys, s=6, alpha=0.4, color=color, label=f"{label} ({len(xs)} windows)")
        ax.set_xlabel("working set / GPU prefix cache")
        ax.set_ylabel("hit rate (GPU + host) per 2-minute window")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"cache hysteresis: windows from minute {args.from_min:g}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        print(f"wrote {save_figure(fig, args.png)}")


if __name__ == "__main__":
    main()
