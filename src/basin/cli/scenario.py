"""``basin scenario``: the shipped scenarios, and what a scenario resolves to."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Scenarios: list the shipped ones, show one with overrides applied.", no_args_is_help=True)


@app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Print a JSON array of objects.")) -> None:
    """The shipped scenarios: name, deployment, workload and what each is for.

    Example: basin scenario list
    """
    from basin.experiments.scenario import load_scenario, scenario_names
    from basin.paths import SCENARIO_DIR

    rows: list[dict[str, Any]] = []
    for name in scenario_names():
        sc = load_scenario(name)
        rows.append({"name": name, "deployment": sc.deployment, "workload": sc.workload.name,
                     "surge_factor": sc.surge.factor, "duration_min": sc.duration_min,
                     "description": " ".join(sc.description.split())})
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title=f"scenarios in {SCENARIO_DIR}")
    for col in ("name", "deployment", "workload", "surge", "minutes", "description"):
        table.add_column(col, no_wrap=col in ("name", "deployment", "workload"),
                         justify="right" if col in ("surge", "minutes") else "left")
    for r in rows:
        table.add_row(r["name"], r["deployment"], r["workload"], f"x{r['surge_factor']:g}",
                      f"{r['duration_min']:g}", r["description"])
    Console(width=max(Console().width, 140)).print(table)


@app.command("show")
def show_cmd(
    scenario: str = typer.Argument(..., help="Scenario name (basin scenario list) or a YAML file."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a field, e.g. --set surge.factor=2.0"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of YAML."),
) -> None:
    """Print a scenario with every default filled in and the overrides
    applied: exactly what `basin run` would simulate.

    Example: basin scenario show trap-1p1d --set surge.factor=1.33
    """
    import yaml

    from basin.experiments.scenario import load_scenario, scenario_dict

    data = scenario_dict(load_scenario(scenario, list(set_ or [])))
    print(json.dumps(data, indent=1) if as_json else yaml.safe_dump(data, sort_keys=False), end="\n" if as_json else "")
