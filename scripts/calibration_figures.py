"""Regenerate the figures of docs/calibration.md.

    .venv/bin/python scripts/calibration_figures.py

Runs trap-1p1d without a surge, with +33% and with +100%, and surge-1p3d
under hicache, then writes the time series and the cache-cliff scatter.
"""

from __future__ import annotations

from pathlib import Path

from basin.experiments.plots import plot_cliff, plot_run_timeseries
from basin.experiments.runner import run_scenario
from basin.experiments.scenario import load_scenario

OUT = Path(__file__).resolve().parents[1] / "docs" / "img"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    trap = {}
    for factor, label in ((1.0, "no surge"), (1.33, "+33%"), (2.0, "+100%")):
        run = run_scenario(load_scenario("trap-1p1d", [f"surge.factor={factor}"]))
        trap[label] = run.result.timeseries
        s = run.summary
        print(f"trap-1p1d {label:8s} state={s.state.value:10s} hit pre={s.hit_rate_pre:.2f} "
              f"final={s.hit_rate_final:.2f} TTFT end={s.ttft_p50_final_s:.2f}s goodput={s.goodput_per_h:.0f}/h "
              f"active end={s.active_sessions_final:.0f}")
    plot_run_timeseries(trap, OUT / "trap-1p1d-timeseries.png", shade_windows=[(15, 25)],
                        title="trap-1p1d: H100 1P1D, GPU-only cache, 3.3 sessions/min, 10-min surge")
    plot_cliff(trap, OUT / "trap-1p1d-cliff.png", title="Hit rate against working set / cache (2-min windows)")
    run = run_scenario(load_scenario("surge-1p3d"))
    s = run.summary
    print(f"surge-1p3d hicache state={s.state.value} hit pre={s.hit_rate_pre:.2f} final={s.hit_rate_final:.2f} "
          f"goodput={s.goodput_per_h:.0f}/h completed={s.completed_fraction:.2f}")
    plot_run_timeseries({"hicache": run.result.timeseries}, OUT / "surge-1p3d-timeseries.png",
                        shade_windows=[(15, 35)], title="surge-1p3d: H200 1P3D, host tier 2x, x5 surge")


if __name__ == "__main__":
    main()
