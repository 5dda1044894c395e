"""A tuning's results reduced: the run table, the selection of each
system's best setting (:func:`select`) and ``best.csv``."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basin.errors import BasinInputError
from basin.experiments.store import RunStore
from basin.experiments.sweep_spec import is_finite
from basin.experiments.tune_spec import Setting, Tuning

TABLE_FILE = "tune.parquet"


BEST_FILE = "best.csv"


#: The selection rule, as the output and the docs state it.
RULE = ("best = the one parameter setting per system that maximises the mean, over scenarios, of its goodput "
        "(mean over seeds) relative to the best goodput any system and setting reached in that scenario; "
        "oracle = the setting best in one scenario alone (not deployable)")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One run as the selection sees it."""

    system: str
    #: The setting's identity (its label).
    setting: str
    scenario: str
    seed: int
    default: bool
    goodput_per_h: float


@dataclass(frozen=True, slots=True)
class ScenarioChoice:
    """A system in one scenario: at its defaults, at its best setting, and at
    the setting best in this scenario alone (the oracle). Goodputs are means
    over seeds."""

    scenario: str
    default_goodput: float
    best_goodput: float
    oracle_setting: str
    oracle_goodput: float
    #: The best goodput any system and setting reached here.
    reference_goodput: float

    @property
    def ratio(self) -> float:
        return self.best_goodput / self.default_goodput if self.default_goodput > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Choice:
    """A system's default and best setting, with their scores (the mean
    relative goodput of the selection rule) and the per-scenario figures."""

    system: str
    default_setting: str
    best_setting: str
    default_score: float
    best_score: float
    scenarios: tuple[ScenarioChoice, ...]
    settings_tried: int


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if is_finite(v)]
    return sum(kept) / len(kept) if kept else math.nan


def select(outcomes: Sequence[Outcome]) -> dict[str, Choice]:
    """Each system's best setting by the rule of this module (:data:`RULE`).

    The reference of a scenario is the highest seed-mean goodput of any
    system and setting there; a scenario whose reference is not positive
    (nothing was served by anyone) is left out of every mean. A setting is
    eligible only if it ran on every scenario its system ran on. Ties go to
    the defaults, then to the setting seen first, so a setting that only
    equals the defaults never replaces them."""
    cells: dict[tuple[str, str, str], list[float]] = {}
    order: dict[str, list[str]] = {}
    defaults: dict[str, str] = {}
    scenarios: list[str] = []
    for o in outcomes:
        cells.setdefault((o.system, o.setting, o.scenario), []).append(o.goodput_per_h)
        mine = order.setdefault(o.system, [])
        if o.setting not in mine:
            mine.append(o.setting)
        if o.default:
            defaults.setdefault(o.system, o.setting)
        if o.scenario not in scenarios:
            scenarios.append(o.scenario)
    for system in order:
        if system not in defaults:
            raise BasinInputError(f"system '{system}': no run is marked as its defaults")
    goodput = {cell: _mean(values) for cell, values in cells.items()}
    reference = {sc: max((g for (_, _, s), g in goodput.items() if s == sc and is_finite(g)), default=math.nan)
                 for sc in scenarios}
    scored = [sc for sc in scenarios if is_finite(reference[sc]) and reference[sc] > 0]

    out: dict[str, Choice] = {}
    for system, names in order.items():
        own = [sc for sc in scenarios if any((system, n, sc) in goodput for n in names)]
        eligible = [n for n in names if all((system, n, sc) in goodput for sc in own)]

        def score(name: str, system: str = system, own: list[str] = own) -> float:
            return _mean([goodput[(system, name, sc)] / reference[sc] for sc in own if sc in scored])

        default = defaults[system]
        best, best_score = default, score(default)
        for name in [default, *[n for n in eligible if n != default]]:
            value = score(name)
            if is_finite(value) and (not is_finite(best_score) or value > best_score):
                best, best_score = name, value
        per: list[ScenarioChoice] = []
        for sc in own:
            oracle, top = default, -math.inf
            for name in [default, *[n for n in names if n != default]]:
                g = goodput.get((system, name, sc), math.nan)
                if is_finite(g) and g > top:
                    oracle, top = name, g
            per.append(ScenarioChoice(sc, goodput.get((system, default, sc), math.nan),
                                      goodput.get((system, best, sc), math.nan), oracle,
                                      goodput.get((system, oracle, sc), math.nan), reference[sc]))
        out[system] = Choice(system, default, best, score(default), best_score, tuple(per), len(names))
    return out


def table_rows(tuning: Tuning, store: RunStore) -> list[dict[str, Any]]:
    """One row per run: its system, each grid parameter's value, scenario,
    seed, the default flag, the setting's label, its store key and its run
    summary (without the windows; the state by name)."""
    rows = []
    for r in tuning.runs:
        summary = store.summary(r.key).to_dict()
        summary.pop("windows", None)
        summary.pop("system", None)
        params = r.setting.params()
        rows.append({"system": r.system, **{c: params.get(c) for c in tuning.param_columns},
                     "scenario": r.scenario, "seed": r.seed, "default": r.setting.default,
                     "setting": r.setting.label, "run": r.key, **summary})
    return rows


def _states(rows: Sequence[Mapping[str, Any]]) -> str:
    return "/".join(str(r["state"]) for r in rows)


def best_rows(tuning: Tuning, rows: Sequence[Mapping[str, Any]], choices: Mapping[str, Choice],
              by_label: Mapping[tuple[str, str], Setting]) -> list[dict[str, Any]]:
    """A row per system and scenario: goodput at the defaults and at the best
    setting, their ratio, the best setting's values, the scores and the
    scenario's oracle."""
    out = []
    for c in choices.values():
        best = by_label[(c.system, c.best_setting)]
        for sc in c.scenarios:
            at = {name: [r for r in rows if r["system"] == c.system and r["scenario"] == sc.scenario
                         and r["setting"] == label] for name, label in (("default", c.default_setting),
                                                                        ("best", c.best_setting))}
            out.append({
                "system": c.system, "scenario": sc.scenario,
                "goodput_default": sc.default_goodput, "goodput_best": sc.best_goodput,
                "ratio_best_default": sc.ratio, "best_setting": c.best_setting,
                **{f"best.{k}": v for k, v in best.values},
                "state_default": _states(at["default"]), "state_best": _states(at["best"]),
                "completed_default": _mean([r["completed_fraction"] for r in at["default"]]),
                "completed_best": _mean([r["completed_fraction"] for r in at["best"]]),
                "score_default": c.default_score, "score_best": c.best_score,
                "oracle_setting": sc.oracle_setting, "goodput_oracle": sc.oracle_goodput,
                "goodput_reference": sc.reference_goodput, "settings_tried": c.settings_tried,
            })
    return out


def write_best(tuning: Tuning, rows: Sequence[Mapping[str, Any]], choices: Mapping[str, Choice],
               by_label: Mapping[tuple[str, str], Setting], path: Path) -> Path:
    """``best.csv``, written whole or not at all."""
    data = best_rows(tuning, rows, choices, by_label)
    names = list(dict.fromkeys(k for r in data for k in r))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=names)
            writer.writeheader()
            for r in data:
                writer.writerow({k: _csv_cell(r.get(k)) for k in names})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _csv_cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.6g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return "" if value is None else value
