"""``basin predict ...``: evaluate and fit BASIN's peak-context predictor (docs/predictor.md)."""

from __future__ import annotations

import enum
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from basin.errors import BasinInputError
from basin.jsonvalues import json_values

app = typer.Typer(help="Peak-context predictor: cross-fitted evaluation and fitting.", no_args_is_help=True)


class Model(str, enum.Enum):
    """The regression of log peak (docs/predictor.md)."""

    RIDGE = "ridge"
    RIDGE_TEXT = "ridge-text"
    KNN = "knn"
    GBT = "gbt"
    QUANTILE = "quantile"
    AUTO = "auto"


class GroupBy(str, enum.Enum):
    """What a cross-fitting fold holds out whole."""

    TASK = "task"
    SESSION = "session"


_WORKLOAD = typer.Argument(..., metavar="NAME|FILE", help="A workload preset name or a workload file.")
_FOLDS = typer.Option(10, "--folds",
                      help="Cross-fitting folds of whole tasks (more than the tasks: leave-one-task-out).")
_FOLD_SEED = typer.Option(0, "--fold-seed", help="Seed of the task-to-fold assignment.")
_SESSIONS = typer.Option(None, "--sessions", help="Synthetic size, or a seeded sample (default: all).")
_SEED = typer.Option(0, "--seed", help="Seed for synthetic presets and sampling.")



def _print_table(title: str, rows: dict[str, object]) -> None:
    table = Table(title=title)
    table.add_column("field")
    table.add_column("value", justify="right")
    for key, value in rows.items():
        if value is None:
            text = "-"
        elif isinstance(value, float):
            text = f"{value:.3f}" if abs(value) < 100 else f"{value:,.0f}"
        else:
            text = str(value)
        table.add_row(key, text)
    Console().print(table)


@app.command("eval")
def eval_cmd(
    spec: str = _WORKLOAD,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    folds: int = _FOLDS,
    fold_seed: int = _FOLD_SEED,
    group_by: GroupBy = typer.Option(GroupBy.TASK, "--group-by",
                                     help="Hold out whole tasks (honest) or single sessions (leaks reruns)."),
    lengths_only: bool = typer.Option(False, "--lengths-only", help="Drop the TF-IDF text features (ablation)."),
    model: Model = typer.Option(Model.RIDGE, "--model",
                                help="ridge (the paper's), ridge-text (task length the one free length), knn "
                                     "(nearest tasks), gbt, quantile, or auto (chosen by grouped inner CV)."),
    quantile: float | None = typer.Option(None, "--quantile", "-q",
                                          help="Reservation level: report the split-conformal quantile's "
                                               "coverage and over/under-shoot (e.g. 0.9)."),
    sessions: int | None = _SESSIONS,
    seed: int = _SEED,
) -> None:
    """Cross-fitted accuracy of the ridge peak predictor on a workload.

    Every session is predicted by a model fitted without its task (all reruns
    of a task text sit in one fold; vocabulary, IDF, centring and the ridge
    penalty come from the training folds only). Prints the Spearman rank
    correlation of prediction and peak context, the standard deviation of
    the log error, the coverage and over/under-shoot of the point prediction
    and (with --quantile) of the conformal reservation, and the same figures
    under the other fold protocol (`other_protocol`), so both are reported.

    Example:

        basin predict eval terminal-bench --model ridge --quantile 0.9 --json
    """
    from basin.predict.peak import evaluate
    from basin.workload.presets import resolve_workload

    w = resolve_workload(spec, seed=seed, n_sessions=sessions)
    ev = evaluate(w, folds=folds, seed=fold_seed, use_text=not lengths_only, group_by=group_by.value,
                  model=model.value, level=quantile)
    other = GroupBy.SESSION if group_by is GroupBy.TASK else GroupBy.TASK
    contrast = evaluate(w, folds=folds, seed=fold_seed, use_text=not lengths_only, group_by=other.value,
                        model=model.value, level=quantile).to_dict()
    out = json_values({**ev.to_dict(), "other_protocol": {k: contrast[k] for k in (
        "group_by", "protocol", "groups", "spearman", "log_error_sd", "log_error_mean", "point", "reservation")}})
    if as_json:
        typer.echo(json.dumps(out))
        return
    print_evaluation(out, Console())


#: The evaluation's figures as rows of the table: (label, key path, format).
_EVAL_ROWS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("Spearman: prediction vs peak", ("spearman",), "num"),
    ("log error: sd", ("log_error_sd",), "num"),
    ("log error: mean (bias)", ("log_error_mean",), "num"),
    ("point: peaks covered", ("point", "coverage"), "pct"),
    ("point: over-reservation, mean", ("point", "over_reservation_mean"), "pct"),
    ("point: under-reservation, mean", ("point", "under_reservation_mean"), "pct"),
    ("point: reserved / peak, total", ("point", "reserved_over_peak"), "num"),
    ("reservation: peaks covered", ("reservation", "coverage"), "pct"),
    ("reservation: over-reservation, mean", ("reservation", "over_reservation_mean"), "pct"),
    ("reservation: under-reservation, mean", ("reservation", "under_reservation_mean"), "pct"),
    ("reservation: reserved / peak, total", ("reservation", "reserved_over_peak"), "num"),
)


def print_evaluation(out: dict[str, object], console: Console) -> None:
    """A cross-fitted evaluation as the reader asks of it: what was fitted on
    what, both fold protocols side by side (the honest one first), and the
    one-feature baselines beneath."""

    def get(data: object, path: tuple[str, ...]) -> object:
        for key in path:
            data = data.get(key) if isinstance(data, dict) else None
        return data

    def cell(value: object, kind: str) -> str:
        if not isinstance(value, (int, float)):
            return "-"
        if kind == "int":
            return f"{value:,.0f}"
        return f"{100 * value:.1f}%" if kind == "pct" else f"{value:.3f}"

    other = out.get("other_protocol") or {}
    assert isinstance(other, dict)
    level = out.get("level")
    console.print(f"peak predictor [bold]{out.get('model')}[/] on [bold]{out.get('workload')}[/]: "
                  f"{out.get('sessions')} sessions, {out.get('folds')} folds (fold seed {out.get('fold_seed')}), "
                  f"text features {'on' if out.get('use_text') else 'off'}"
                  + (f", reservation at the {level:g} quantile" if isinstance(level, float) else ""),
                  highlight=False)
    table = Table()
    table.add_column("figure", no_wrap=True)
    for protocol in (out, other):
        held = "tasks" if protocol.get("group_by") == "task" else "sessions"
        table.add_column(f"held out by {protocol.get('group_by')}\n({protocol.get('groups')} {held})",
                         justify="right")
    for label, path, kind in _EVAL_ROWS:
        if path[0] == "reservation" and out.get("reservation") is None:
            continue
        table.add_row(label, cell(get(out, path), kind), cell(get(other, path), kind))
    console.print(table)
    for protocol in (out, other):
        console.print(f"{protocol.get('group_by')}: {protocol.get('protocol')}", highlight=False)
    console.print(f"baselines (Spearman with the peak): first prompt {cell(out.get('spearman_first_prompt'), 'num')}, "
                  f"task text length {cell(out.get('spearman_task_chars'), 'num')}; median ridge alpha "
                  f"{cell(out.get('alpha_median'), 'num')}, median text terms "
                  f"{cell(out.get('text_terms_median'), 'int')}; "
                  f"{cell(out.get('seconds'), 'num')} s. --json prints every figure.", highlight=False)


@app.command("fit")
def fit_cmd(
    spec: str = _WORKLOAD,
    out: Path | None = typer.Option(None, "--out", help="Model file to write (default: the cache runs read)."),
    as_json: bool = typer.Option(False, "--json", help="Print the model's metadata as JSON."),
    folds: int = _FOLDS,
    fold_seed: int = _FOLD_SEED,
    sessions: int | None = _SESSIONS,
    seed: int = _SEED,
) -> None:
    """Fit the ridge peak predictor of a workload and save it (joblib).

    Saves the all-data model and the cross-fitted fold models (a session of
    a task seen in fitting is answered by the fold model that held it out).
    Without --out the model goes to the cache that the "ridge" predictor spec
    reads ($BASIN_CACHE_DIR/predict, default ~/.cache/basin-serve/predict);
    runs use it when it was fitted on the workload's default draw with the
    default folds and fold seed. Load another file with the spec ridge:FILE.

    Example:

        basin predict fit swebench-deepseek --out models/swebench-deepseek.joblib
    """
    from basin.predict.peak import DEFAULT_FOLDS, DEFAULT_SEED, RidgePeakPredictor, default_model_path
    from basin.workload.presets import resolve_workload

    if out is not None and out.is_dir():
        raise BasinInputError(f"--out {out}: is a directory; name a file, e.g. {out / (spec + '.joblib')}")
    from basin.cli.outputs import check_out_file

    check_out_file(out)
    w = resolve_workload(spec, seed=seed, n_sessions=sessions)
    predictor = RidgePeakPredictor.fit(w, folds=folds, seed=fold_seed)
    path = predictor.save(out if out is not None else default_model_path(w, folds=folds, seed=fold_seed))
    meta = json_values({**predictor.meta, "path": str(path)})
    if as_json:
        typer.echo(json.dumps(meta))
        return
    _print_table(f"peak predictor of {spec}", {k: v for k, v in meta.items() if k != "fingerprint"})
    default_draw = sessions is None and seed == 0
    if out is None and default_draw and folds == DEFAULT_FOLDS and fold_seed == DEFAULT_SEED:
        typer.echo(f"the 'ridge' predictor of {spec} will load {path}")
    else:
        typer.echo(f"wrote {path}; use it with the predictor spec ridge:{path}")
