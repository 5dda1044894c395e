"""The offered arrival rate of sweeps/fig18-trace-shaped.yaml at its three mean loads
(docs/img/fig18-trace-shaped-rate.png): the ServeGen m-large shape from trace minute
6920, scaled to 0.9, 1.0 and 1.1 of the 1P3D catalogue critical rate.

    .venv/bin/python scripts/plot_trace_shape.py [--out docs/img/fig18-trace-shaped-rate.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from basin.plotting import new_figure, save_figure
from basin.workload.arrivals import shaped_schedule

ROOT = Path(__file__).resolve().parents[1]
SHAPE, OFFSET_MIN, CRITICAL_PER_MIN, DURATION_S, MEASURE_END_MIN = "servegen-m-large", 6920, 18.5, 7200.0, 90


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "fig18-trace-shaped-rate.png")
    args = parser.parse_args()
    fig = new_figure(7, 3.4)
    ax = fig.add_subplot(1, 1, 1)
    t = np.arange(0, DURATION_S, 10.0)
    for frac, color in ((0.9, "tab:blue"), (1.0, "tab:orange"), (1.1, "tab:red")):
        mean = frac * CRITICAL_PER_MIN
        schedule = shaped_schedule(SHAPE, mean, DURATION_S, offset_min=OFFSET_MIN)
        ax.step(t / 60, [schedule.rate_at(x) for x in t], where="post", color=color,
                label=f"mean {mean:.2f}/min ({frac:g} x {CRITICAL_PER_MIN:g})")
    ax.axhline(CRITICAL_PER_MIN, color="k", ls="--", lw=1, label=f"catalogue critical rate {CRITICAL_PER_MIN:g}/min")
    ax.axvline(MEASURE_END_MIN, color="gray", lw=0.8)
    ax.text(MEASURE_END_MIN + 1, ax.get_ylim()[0] + 1, "measure end", fontsize=8, color="gray")
    ax.set_xlabel("run time (min)")
    ax.set_ylabel("offered sessions / min")
    ax.set_title(f"fig18: ServeGen {SHAPE.removeprefix('servegen-')} shape from trace minute {OFFSET_MIN}, 1P3D H200")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    print(f"wrote {save_figure(fig, args.out)}")


if __name__ == "__main__":
    main()
