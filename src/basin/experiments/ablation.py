"""BASIN's ablations (the paper's Fig. 23-24): each mechanism removed in turn,
the earlier arrival-time controller, and the predictor swapped for exact or
noisy peaks, each reported as goodput relative to full BASIN in the same
scenario."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from basin.errors import BasinInputError
from basin.experiments.plan import RunPlan, resolve_plan
from basin.experiments.runner import run_plans
from basin.experiments.scenario import load_scenario

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


def variant_plan(scenario: str, overrides: Sequence[str], variant: str) -> RunPlan:
    """The plan of one variant on ``scenario`` (a name or a path)."""
    system, params = VARIANTS[variant]
    return resolve_plan(load_scenario(scenario, list(overrides)), system, dict(params), argument=scenario,
                        overrides=tuple(overrides))


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
    cells = [(sc, v) for sc in scenarios for v in chosen]
    plans = [variant_plan(sc, overrides, v) for sc, v in cells]
    results = dict(zip(cells, (r.summary for r in run_plans(plans, workers=workers, progress=progress))))
    rows = []
    for sc in scenarios:
        full = results[(sc, "basin")].goodput_per_h
        for v in chosen:
            s = results[(sc, v)]
            g = s.goodput_per_h
            rows.append(AblationRow(sc, v, g, g / full if full > 0 else float("nan"), s.completed_fraction,
                                    s.shed_fraction, s.first_call_wait_p90_s, s.ttft_p90_s, s.state.value))
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
