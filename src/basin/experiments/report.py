"""One self-contained HTML page from a ``basin run``, ``compare`` or ``sweep``
output folder: its plots (embedded as base64, so the page is one file that
can be mailed or attached to an issue), its table and its provenance.

Nothing is fetched from elsewhere (no scripts, style sheets or fonts), so the
page looks the same offline and years later.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from basin.errors import BasinInputError

ReportKind = Literal["run", "compare", "sweep", "replay", "ablation"]
REPORT_FILE = "report.html"
#: What `basin replay --scenario` writes beside a run's tables.
REPLAY_FILE = "replay.json"
_IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
                ".gif": "image/gif", ".webp": "image/webp"}

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; position: sticky; top: 0; } td.text { text-align: left; }
.scroll { overflow-x: auto; max-height: 70vh; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.8em; }
p.description { font-size: 1.05em; color: #333; max-width: 60em; }
table.summary { font-size: 0.95em; } table.summary th { text-align: center; }
td.why { white-space: normal; min-width: 16em; max-width: 28em; }
td.state { font-weight: 600; } td.state-healthy { color: #1a7f37; } td.state-recovering { color: #9a6700; }
td.state-overloaded { color: #bc4c00; } td.state-trapped { color: #cf222e; } td.state-undetermined { color: #57606a; }
details > summary { cursor: pointer; margin: 0.5em 0; color: #0550ae; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; } dt { font-weight: 600; }
"""


def detect_kind(directory: Path) -> ReportKind:
    """Which command wrote ``directory``, from the files it leaves."""
    if not directory.is_dir():
        raise BasinInputError(f"{directory}: no such folder; give the --out folder of basin run, compare, sweep, "
                              "replay or ablate")
    if (directory / "sweep.json").is_file() or (directory / "sweep.parquet").is_file():
        return "sweep"
    if (directory / "compare.json").is_file():
        return "compare"
    if (directory / "summary.csv").is_file():
        return "run"
    if (directory / REPLAY_FILE).is_file() or _replay_folders(directory):
        return "replay"
    if (directory / "ablation.json").is_file():
        return "ablation"
    raise BasinInputError(f"{directory}: not an output folder of basin run, compare, sweep, replay or ablate (it "
                          "has no summary.csv, compare.json, sweep.parquet, replay.json or ablation.json); give the "
                          "folder a command's --out named")


def _replay_folders(directory: Path) -> list[Path]:
    """The per-system folders of a ``basin replay --scenario`` output folder."""
    return [p for p in sorted(directory.iterdir()) if p.is_dir() and (p / REPLAY_FILE).is_file()]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def html_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table of every row (none left out), numbers right-aligned."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for value in row:
            text = _fmt(value)
            cls = "" if isinstance(value, (int, float)) or _is_number(text) or text == "-" else ' class="text"'
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>' + "".join(body)
            + "</tbody></table></div>")


def _csv_rows(path: Path) -> tuple[list[str], list[list[Any]]]:
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        return [], []
    return rows[0], [[float(c) if _is_number(c) else c for c in r] for r in rows[1:]]


def _parquet_rows(path: Path) -> tuple[list[str], list[list[Any]]]:
    # Lazy: pyarrow takes 60-70 ms to import; only this path uses it.
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    columns = table.column_names
    return columns, [[r[c] for c in columns] for r in table.to_pylist()]


# ---------------------------------------------------------------- the CLI's summary
#: (heading, field, format) of the summary table, as the CLI prints it: a
#: run's (``basin run``, each system of ``basin replay``), then the others'.
#: Formats: text, state, why (the state's reason, wrapped), fN (N digits),
#: pct (a fraction as %), pct_given (already a percentage), sN (seconds).
RUN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("system", "system", "text"), ("goodput/h", "goodput_per_h", "f1"), ("completed", "completed_fraction", "pct"),
    ("shed", "shed_fraction", "pct"), ("state", "state", "state"), ("why", "state_reason", "why"),
    ("hit pre", "hit_rate_pre", "f2"), ("hit end", "hit_rate_final", "f2"), ("TTFT end", "ttft_p50_final_s", "s2"),
    ("active end", "active_sessions_final", "f0"), ("L_late", "l_late_s", "s1"))
COMPARE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("scenario", "scenario", "text"), ("system", "system", "text"), ("goodput/h", "goodput_per_h", "f1"),
    ("% of best", "goodput_pct_of_best", "pct_given"), ("state", "state", "state"),
    ("completed", "completed_fraction", "pct"), ("hit pre", "hit_rate_pre", "f2"), ("hit end", "hit_rate_final", "f2"),
    ("wait p50", "first_call_wait_p50_s", "s0"), ("first token p50", "first_token_wait_p50_s", "s0"),
    ("slowdown p50", "slowdown_p50", "f2"), ("% of lowest", "slowdown_pct_of_lowest", "pct_given"))
#: A sweep's summary: its coordinates first (the table's columns before ``run``), then these.
SWEEP_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("state", "state", "state"), ("goodput/h", "goodput_per_h", "f1"), ("completed", "completed_fraction", "pct"),
    ("shed", "shed_fraction", "pct"), ("hit pre", "hit_rate_pre", "f2"), ("hit end", "hit_rate_final", "f2"),
    ("TTFT end", "ttft_p50_final_s", "s2"), ("active end", "active_sessions_final", "f0"))
ABLATION_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("scenario", "scenario", "text"), ("variant", "variant", "text"), ("goodput/h", "goodput_per_h", "f0"),
    ("relative", "relative_goodput", "f2"), ("completed", "completed_fraction", "pct"),
    ("shed", "shed_fraction", "pct"), ("wait p90", "first_call_wait_p90_s", "s0"), ("TTFT p90", "ttft_p90_s", "s1"),
    ("state", "state", "state"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _summary_cell(value: Any, kind: str) -> str:
    if kind in ("text", "state", "why"):
        text = "-" if value in (None, "") else str(value)
        cls = {"state": f' class="text state state-{html.escape(text)}"', "why": ' class="text why"'}.get(kind,
                                                                                                      ' class="text"')
        return f"<td{cls}>{html.escape(text)}</td>"
    x = _number(value)
    if x is None:
        return "<td>-</td>"
    if kind == "pct":
        text = f"{100 * x:.1f}%"
    elif kind == "pct_given":
        text = f"{x:.0f}%"
    elif kind.startswith("s"):
        text = f"{x:.{int(kind[1:])}f} s"
    else:
        text = f"{x:,.{int(kind[1:])}f}"
    return f"<td>{html.escape(text)}</td>"


def summary_table(columns: Sequence[tuple[str, str, str]], rows: Sequence[dict[str, Any]],
                  leading: Sequence[str] = ()) -> str:
    """The CLI's view of ``rows``: the ``leading`` columns as they are (a
    sweep's coordinates), then ``columns`` formatted as the terminal shows them."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in leading) + "".join(
        f"<th>{html.escape(h)}</th>" for h, _, _ in columns)
    body = []
    for row in rows:
        cells = [_summary_cell(row.get(c), "text") if isinstance(row.get(c), str)
                 else f"<td>{html.escape(_fmt(row.get(c)))}</td>" for c in leading]
        cells += [_summary_cell(row.get(field), kind) for _, field, kind in columns]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table class="summary"><thead><tr>{head}</tr></thead><tbody>' + "".join(body)
            + "</tbody></table></div>")


def _raw(label: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Every column of the folder's table, folded away behind the summary."""
    return (f"<details><summary>All {len(columns)} columns of {html.escape(label)} ({len(rows)} "
            f"row{'s' if len(rows) != 1 else ''})</summary>{html_table(columns, rows)}</details>")


def _image(path: Path, base: Path) -> str:
    mime = _IMAGE_TYPES[path.suffix.lower()]
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    name = os.path.relpath(path, base)
    return (f'<figure><img src="data:{mime};base64,{data}" alt="{html.escape(name)}">'
            f"<figcaption>{html.escape(name)}</figcaption></figure>")


def _images(directory: Path, provenance: dict[str, Any]) -> list[Path]:
    """The folder's images, and any its provenance names elsewhere (a compare --doc's)."""
    # The time series first: it is what a run is read by.
    found = [p for p in sorted(directory.iterdir(), key=lambda p: (not p.name.startswith("timeseries"), p.name))
             if p.suffix.lower() in _IMAGE_TYPES and p.is_file()]
    outputs = provenance.get("outputs") or {}
    named: list[str] = []
    for value in outputs.values() if isinstance(outputs, dict) else []:
        if isinstance(value, str):
            named.append(value)
        elif isinstance(value, dict):
            named += [v for v in value.values() if isinstance(v, str)]
    for text in named:
        for candidate in (Path(text), directory / text):
            if candidate.suffix.lower() in _IMAGE_TYPES and candidate.is_file() \
                    and candidate.resolve() not in {p.resolve() for p in found}:
                found.append(candidate)
                break
    return found


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BasinInputError(f"{path}: not valid JSON ({exc}); the folder's {what} is damaged") from None


def _description(kind: ReportKind, provenance: dict[str, Any]) -> str:
    """What the folder is about, in the words its scenario or sweep file uses."""
    if kind == "sweep":
        # Lazy: PyYAML takes about 14 ms to import; only this path uses it.
        import yaml

        try:
            spec = yaml.safe_load((provenance.get("sweep") or {}).get("text") or "")
        except yaml.YAMLError:
            spec = None
        return str(spec.get("description") or "") if isinstance(spec, dict) else ""
    texts = []
    for sc in provenance.get("scenarios") or []:
        resolved = sc.get("resolved") if isinstance(sc, dict) else None
        if isinstance(resolved, dict) and resolved.get("description"):
            name = resolved.get("name") or sc.get("argument")
            texts.append(f"{name}: {resolved['description']}" if len(provenance["scenarios"]) > 1
                         else str(resolved["description"]))
    return " ".join(" ".join(t.split()) for t in texts)


def _replay_parts(directory: Path) -> tuple[list[dict[str, Any]], dict[str, Any], list[Path]]:
    """A replay folder's rows (one per system, its summary and meta), its
    first replay.json and the system folders."""
    folders = [directory] if (directory / REPLAY_FILE).is_file() else _replay_folders(directory)
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    for folder in folders:
        info = _read_json(folder / REPLAY_FILE, "replay record")
        meta = meta or info
        summary_path = folder / "summary.json"
        summary = _read_json(summary_path, "run summary") if summary_path.is_file() else {}
        summary.pop("windows", None)
        rows.append({"system": info.get("system") or folder.name, **summary})
    return rows, meta, folders


def _replay_plots(folders: Sequence[Path], rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The run plots of a replay (it writes tables only), drawn for the page."""
    # Lazy: this import loads 126 modules; only this path uses it.
    from basin.experiments.plots import plot_cliff, plot_run_timeseries

    # Lazy: this import loads 123 modules; only this path uses it.
    from basin.metrics.io import read_table

    series = {str(row["system"]): read_table(folder / "timeseries.parquet")
              for folder, row in zip(folders, rows) if (folder / "timeseries.parquet").is_file()}
    if not series:
        return []
    found = meta.get("scenario")
    scenario: dict[str, Any] = found if isinstance(found, dict) else {}
    found = scenario.get("surge")
    surge: dict[str, Any] = found if isinstance(found, dict) else {}
    shade = [(float(surge["start_min"]), float(surge["end_min"]))] \
        if surge.get("factor", 1.0) != 1.0 and "start_min" in surge and "end_min" in surge else []
    name = scenario.get("name") or "replay"
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / "timeseries.png", Path(tmp) / "cliff.png"]
        plot_run_timeseries(series, paths[0], shade_windows=shade, title=f"{name} over HTTP")
        plot_cliff(series, paths[1], title=f"{name} over HTTP: hit rate against working set")
        return [_image(p, Path(tmp)) for p in paths]


def render(directory: Path) -> str:
    """The HTML page of one output folder: what it is, the CLI's summary
    table, the plots, then every column and the provenance folded away."""
    kind = detect_kind(directory)
    prov_path = directory / "provenance.json"
    provenance: dict[str, Any] = _read_json(prov_path, "provenance") if prov_path.is_file() else {}
    title = f"basin {kind}: {directory.name}"
    if kind == "sweep":
        name = (provenance.get("sweep") or {}).get("name")
        title = f"basin sweep {name or directory.name}"
    summary = ""
    raw = ""
    plots: list[str] = []
    if kind == "replay":
        rows, meta, folders = _replay_parts(directory)
        provenance = provenance or {"command": meta.get("command"), "notes": meta.get("notes") or []}
        if not provenance.get("scenarios") and isinstance(meta.get("scenario"), dict):
            provenance["scenarios"] = [{"resolved": meta["scenario"]}]
        summary = summary_table(RUN_COLUMNS, rows)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        raw = _raw("the summaries", columns, [[r.get(c) for c in columns] for r in rows])
        plots = _replay_plots(folders, rows, meta)
        facts_extra = [("target", meta.get("target")), ("speed", meta.get("speed")),
                       ("ran to the end", meta.get("complete")), ("sessions arrived", meta.get("sessions_arrived")),
                       ("calls", meta.get("calls")), ("call errors", ", ".join(meta.get("errors") or []) or None)]
    else:
        facts_extra = []
    if kind == "sweep":
        table = directory / "sweep.parquet"
        if table.is_file():
            columns, data = _parquet_rows(table)
            leading = columns[:columns.index("run")] if "run" in columns else []
            summary = summary_table(SWEEP_COLUMNS, [dict(zip(columns, r)) for r in data], leading)
            raw = _raw("sweep.parquet", columns, data)
        else:
            summary = "<p>No sweep.parquet (the sweep did not finish).</p>"
        raw += ("<p>Each run's tables, summary and provenance are in the result store, "
                f"<code>{html.escape(str(directory / 'runs'))}/&lt;run&gt;/</code>.</p>")
    elif kind in ("compare", "run"):
        table = directory / ("compare.csv" if kind == "compare" else "summary.csv")
        if table.is_file():
            columns, data = _csv_rows(table)
            summary = summary_table(COMPARE_COLUMNS if kind == "compare" else RUN_COLUMNS,
                                    [dict(zip(columns, r)) for r in data])
            raw = _raw(table.name, columns, data)
        else:
            summary = f"<p>No {table.name}.</p>"
    elif kind == "ablation":
        rows = _read_json(directory / "ablation.json", "ablation table")
        rows = rows if isinstance(rows, list) else []
        summary = summary_table(ABLATION_COLUMNS, rows)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        raw = _raw("ablation.json", columns, [[r.get(c) for c in columns] for r in rows])
    parts = [f"<h1>{html.escape(title)}</h1>"]
    description = _description(kind, provenance)
    if description:
        parts.append(f'<p class="description">{html.escape(description)}</p>')
    facts = [("folder", str(directory.resolve())), ("command", provenance.get("command")),
             ("basin-serve", provenance.get("basin_serve_version")), ("created (UTC)", provenance.get("created_utc")),
             *facts_extra]
    if kind == "sweep":
        facts += [(k.replace("_", " "), provenance.get(k)) for k in ("runs_total", "runs_computed", "runs_reused")]
        facts.append(("executor", provenance.get("executor")))
    parts.append("<dl>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(_fmt(v))}</dd>"
                                  for k, v in facts if v is not None) + "</dl>")
    for label in ("warnings", "notes"):
        lines = provenance.get(label) or []
        if lines:
            parts.append(f"<h2>{label.capitalize()}</h2><ul>"
                         + "".join(f"<li>{html.escape(str(x))}</li>" for x in lines) + "</ul>")
    parts.append("<h2>Summary</h2>" + summary)
    plots += [_image(p, directory) for p in _images(directory, provenance)]
    if plots:
        parts.append("<h2>Plots</h2>" + "".join(plots))
    if raw:
        parts.append("<h2>Every column</h2>" + raw)
    if provenance:
        parts.append("<h2>Provenance</h2><details><summary>provenance.json</summary><pre>"
                     + html.escape(json.dumps(provenance, indent=1)) + "</pre></details>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")


def write_report(directory: Path, out: Path | None = None) -> Path:
    """Render ``directory`` to ``out`` (default: DIR/report.html), written whole."""
    page = render(directory)
    target = out if out is not None else directory / REPORT_FILE
    if target.is_dir():
        raise BasinInputError(f"--out {target}: is a folder; name an .html file")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)
    return target
