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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from basin.errors import BasinInputError

ReportKind = Literal["run", "compare", "sweep"]
REPORT_FILE = "report.html"
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
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; } dt { font-weight: 600; }
"""


def detect_kind(directory: Path) -> ReportKind:
    """Which command wrote ``directory``, from the files it leaves."""
    if not directory.is_dir():
        raise BasinInputError(f"{directory}: no such folder; give the --out folder of basin run, compare or sweep")
    if (directory / "sweep.json").is_file() or (directory / "sweep.parquet").is_file():
        return "sweep"
    if (directory / "compare.json").is_file():
        return "compare"
    if (directory / "summary.csv").is_file():
        return "run"
    raise BasinInputError(f"{directory}: not an output folder of basin run, compare or sweep (it has no "
                          "summary.csv, compare.json or sweep.parquet); give the folder a command's --out named")


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


def _csv_table(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        rows = list(reader)
    if not rows:
        return f"<p>{html.escape(path.name)} is empty.</p>"
    converted = [[float(c) if _is_number(c) else c for c in r] for r in rows[1:]]
    return html_table(rows[0], converted)


def _parquet_table(path: Path) -> str:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    columns = table.column_names
    data = table.to_pylist()
    return html_table(columns, [[r[c] for c in columns] for r in data])


def _image(path: Path, base: Path) -> str:
    mime = _IMAGE_TYPES[path.suffix.lower()]
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    name = os.path.relpath(path, base)
    return (f'<figure><img src="data:{mime};base64,{data}" alt="{html.escape(name)}">'
            f"<figcaption>{html.escape(name)}</figcaption></figure>")


def _images(directory: Path, provenance: dict[str, Any]) -> list[Path]:
    """The folder's images, and any its provenance names elsewhere (a compare --doc's)."""
    found = [p for p in sorted(directory.iterdir()) if p.suffix.lower() in _IMAGE_TYPES and p.is_file()]
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


def render(directory: Path) -> str:
    """The HTML page of one output folder."""
    kind = detect_kind(directory)
    prov_path = directory / "provenance.json"
    provenance: dict[str, Any] = {}
    if prov_path.is_file():
        try:
            provenance = json.loads(prov_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise BasinInputError(f"{prov_path}: not valid JSON ({exc}); the folder's provenance is damaged") from None
    title = f"basin {kind}: {directory.name}"
    if kind == "sweep":
        name = (provenance.get("sweep") or {}).get("name")
        title = f"basin sweep {name or directory.name}"
    parts = [f"<h1>{html.escape(title)}</h1>"]
    facts = [("folder", str(directory.resolve())), ("command", provenance.get("command")),
             ("basin-serve", provenance.get("basin_serve_version")), ("created (UTC)", provenance.get("created_utc"))]
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
    images = _images(directory, provenance)
    if images:
        parts.append("<h2>Plots</h2>" + "".join(_image(p, directory) for p in images))
    parts.append("<h2>Table</h2>")
    if kind == "sweep":
        table = directory / "sweep.parquet"
        parts.append(_parquet_table(table) if table.is_file()
                     else "<p>No sweep.parquet (the sweep did not finish).</p>")
        parts.append("<p>Each run's tables, summary and provenance are in the result store, "
                     f"<code>{html.escape(str(directory / 'runs'))}/&lt;run&gt;/</code>.</p>")
    elif kind == "compare":
        table = directory / "compare.csv"
        parts.append(_csv_table(table) if table.is_file() else "<p>No compare.csv.</p>")
    else:
        parts.append(_csv_table(directory / "summary.csv"))
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
