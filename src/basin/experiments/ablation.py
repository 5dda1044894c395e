"""BASIN's ablations (the paper's Fig. 23-24): each mechanism removed in turn,
the earlier arrival-time controller, and the predictor swapped for exact or
noisy peaks, each reported as goodput relative to full BASIN in the same
scenario."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from basin.errors import BasinInputError
from basin.experiments.pool import run_jobs

#: name -> (system, parameters)
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "basin": ("basin", {}),
    "w/o priority order": ("basin", {"priority": False}),
    "w/o admission": ("basin", {"admission": False}),
    "w/o lending": ("basin", {"lending": False}),
    "w/o shedding": ("basin", {"shedding": False}),
    "lending only": ("basin", {"priority": False, "admission": False, "shedding": False}),
    "prior": ("basin-prior", {}),
    "paper algorithm": ("basin-paper", {}),
    "true peaks": ("basin", {"predictor": "oracle"}),
    "noisy peaks 0.5": ("basin", {"predictor": "noisy:0.5"}),
    "noisy peaks 1.0": ("basin", {"predictor": "noisy:1.0"}),
}


@dataclass(frozen=True, slots=True)
class AblationRow:
    scenario: str
    variant: str
    goodput_per_h: float
    relative_goodput: float
    completed_fraction: float
    shed_fraction: float
    first_call_wait_p90_s: float
    ttft_p90_s: float
    state: str


def _run_one(job: tuple[str, list[str], str]) -> tuple[str, str, dict[str, object]]:
    # Lazy: this import loads pydantic (314 modules); only this path uses it.
    from basin.experiments.runner import run_scenario

    # Lazy: this import loads pydantic (276 modules); only this path uses it.
    from basin.experiments.scenario import load_scenario

    scenario, overrides, variant = job
    system, params = VARIANTS[variant]
    run = run_scenario(load_scenario(scenario, overrides), system, params=dict(params))
    s = run.summary
    return scenario, variant, {
        "goodput_per_h": s.goodput_per_h, "completed_fraction": s.completed_fraction,
        "shed_fraction": s.shed_fraction, "first_call_wait_p90_s": s.first_call_wait_p90_s,
        "ttft_p90_s": s.ttft_p90_s, "state": s.state.value,
    }


def run_ablation(scenarios: Sequence[str], variants: Sequence[str] | None = None,
                 overrides: Sequence[str] = (), workers: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> list[AblationRow]:
    """Run every variant on every scenario (in parallel) and relate each
    goodput to full BASIN's in the same scenario."""
    chosen = list(variants or VARIANTS)
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise BasinInputError(f"unknown ablation variant(s) {', '.join(unknown)}: use {', '.join(VARIANTS)}")
    if "basin" not in chosen:
        chosen.insert(0, "basin")
    jobs = [(sc, list(overrides), v) for sc in scenarios for v in chosen]
    results = {(sc, v): figures for sc, v, figures in run_jobs(_run_one, jobs, workers, progress)}
    rows = []
    for sc in scenarios:
        full = float(results[(sc, "basin")]["goodput_per_h"])  # type: ignore[arg-type]
        for v in chosen:
            r = results[(sc, v)]
            g = float(r["goodput_per_h"])  # type: ignore[arg-type]
            rows.append(AblationRow(sc, v, g, g / full if full > 0 else float("nan"),
                                    float(r["completed_fraction"]), float(r["shed_fraction"]),  # type: ignore[arg-type]
                                    float(r["first_call_wait_p90_s"]), float(r["ttft_p90_s"]),  # type: ignore[arg-type]
                                    str(r["state"])))
    return rows


def plot_ablation(rows: Sequence[AblationRow], out_png: str) -> None:
    """Goodput relative to full BASIN, one group of bars per variant."""
    # Lazy: matplotlib takes 0.1-0.3 s to import; only this path uses it.
    from matplotlib.figure import Figure

    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    variants = [v for v in dict.fromkeys(r.variant for r in rows) if v != "basin"]
    fig = Figure(figsize=(max(6.0, 1.1 * len(variants) + 2), 4.0), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(len(scenarios), 1)
    lookup = {(r.scenario, r.variant): r.relative_goodput for r in rows}
    for i, sc in enumerate(scenarios):
        xs = [j + (i - (len(scenarios) - 1) / 2) * width for j in range(len(variants))]
        ax.bar(xs, [lookup.get((sc, v), float("nan")) for v in variants], width, label=sc)
    ax.axhline(1.0, color="black", lw=1, ls="--")
    ax.set_xticks(range(len(variants)), variants, rotation=25, ha="right")
    ax.set_ylabel("goodput / full BASIN")
    ax.legend(fontsize=8)
    fig.savefig(out_png, dpi=120)
