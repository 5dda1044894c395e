"""``basin report``: one self-contained, well-formed HTML page from a run,
compare or sweep folder (parsed here; tests/test_report_browser.py opens them in Chromium)."""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from pathlib import Path

import pytest
from tests.cli_helpers import run_basin
from tests.test_sweep import write_sweep

from basin.experiments.report import render

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "source", "wbr"}
SHORT = ["--set", "duration_min=10", "--set", "measure_end_min=8", "--set", "surge.start_min=2",
         "--set", "surge.end_min=5"]


class PageCheck(HTMLParser):
    """Nesting, images and references of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.images: list[bytes] = []
        self.tables = 0
        self.seen: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.add(tag)
        values = dict(attrs)
        if tag == "table":
            self.tables += 1
        if tag == "img":
            src = values.get("src") or ""
            if not src.startswith("data:image/") or ";base64," not in src:
                self.problems.append(f"img without embedded data: {src[:40]}")
            else:
                self.images.append(base64.b64decode(src.split(",", 1)[1], validate=True))
            if not values.get("alt"):
                self.problems.append("img without alt")
        for name in ("href", "src"):
            ref = values.get(name)
            if ref is not None and not (ref.startswith("data:") or ref.startswith("#")):
                self.problems.append(f"<{tag} {name}={ref!r}> refers outside the page")
        if tag in ("script", "link", "iframe"):
            self.problems.append(f"<{tag}> in a self-contained page")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1] if self.stack else '(nothing)'}>")
            return
        self.stack.pop()


def check_page(text: str) -> PageCheck:
    assert text.startswith("<!DOCTYPE html>")
    page = PageCheck()
    page.feed(text)
    page.close()
    assert page.problems == []
    assert page.stack == [], f"unclosed: {page.stack}"
    assert {"html", "head", "body", "title"} <= page.seen
    return page


PNG = b"\x89PNG\r\n\x1a\n"


def sweep_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The report page of a two-run sweep with one line plot (also opened in a browser, test_report_browser)."""
    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 2.0]\n  seed: [0]\n"
                                 "plot: {kind: line, x: surge.factor}\n")
    code, _, err = run_basin(capsys, "sweep", str(path), "--out", str(tmp_path / "out"))
    assert code == 0, err
    code, _, err = run_basin(capsys, "report", str(tmp_path / "out"), "--out", str(tmp_path / "page.html"))
    assert code == 0, err
    return tmp_path / "page.html"


def assert_reads_like_the_cli(text: str) -> None:
    """The CLI's summary (state, goodput, completed, hit rates) comes first;
    the raw snake_case columns follow, folded behind a toggle."""
    summary = text.index("<h2>Summary")
    head = text[summary:text.index("</thead>", summary)]
    assert all(f"<th>{h}</th>" in head for h in ("state", "goodput/h", "completed", "hit pre", "hit end"))
    assert "goodput_per_h" not in head
    assert text.index("<details><summary>All ") > summary
    assert "td class=\"text state state-" in text


def test_sweep_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = sweep_report(tmp_path, capsys).read_text(encoding="utf-8")
    page = check_page(text)
    assert len(page.images) == 1 and page.images[0].startswith(PNG)
    assert page.tables == 2  # the CLI's summary, and every column folded away
    assert "surge.factor" in text and "goodput_per_h" in text and "basin sweep tiny" in text
    assert "runs_total" in text  # the provenance, in full
    assert_reads_like_the_cli(text)


def test_run_and_compare_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    text = render(tmp_path / "run")
    page = check_page(text)
    assert len(page.images) == 2 and all(i.startswith(PNG) for i in page.images)  # timeseries and cliff
    assert_reads_like_the_cli(text)
    # The scenario's own description at the top, before the summary.
    assert text.index('class="description"') < text.index("<h2>Summary") and "hardware trap" in text
    code, _, err = run_basin(capsys, "compare", "trap-1p1d", "--system", "hicache", *SHORT,
                             "--out", str(tmp_path / "cmp"), "--no-tables", "--json")
    assert code == 0, err
    text = render(tmp_path / "cmp")
    page = check_page(text)
    assert len(page.images) == 2 and page.tables == 2 and "goodput_pct_of_best" in text
    assert_reads_like_the_cli(text)
    assert "% of best" in text


def test_report_of_another_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_basin(capsys, "report", str(tmp_path))
    assert code == 2 and "not an output folder of basin run, compare, sweep, replay or ablate" in err
    code, _, err = run_basin(capsys, "report", str(tmp_path / "nowhere"))
    assert code == 2 and "no such folder" in err


def test_replay_and_ablation_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A replay's folder (one per system, as `basin replay --scenario` writes)
    and an ablation's render too: summary first, the replay's plots drawn."""
    import json
    import shutil

    from basin.experiments.report import write_report

    code, _, err = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--system", "hicache", "--system", "basin",
                             "--out", str(tmp_path / "run"), "--json", "--no-plots")
    assert code == 0, err
    replay = tmp_path / "replay"
    for system in ("hicache", "basin"):  # a replay writes the simulator's tables, plus replay.json
        shutil.copytree(tmp_path / "run" / system, replay / system)
        (replay / system / "replay.json").write_text(json.dumps({
            "system": system, "target": "http://127.0.0.1:8400", "speed": 30, "complete": True,
            "scenario": {"name": "trap-1p1d", "description": "The paper's hardware trap",
                         "surge": {"start_min": 2, "end_min": 5, "factor": 2.0}}}))
    for folder in (replay, replay / "basin"):
        text = write_report(folder).read_text(encoding="utf-8")
        page = check_page(text)
        assert len(page.images) == 2 and all(i.startswith(PNG) for i in page.images)  # drawn from the tables
        assert_reads_like_the_cli(text)
        assert "basin replay" in text and "The paper&#x27;s hardware trap" in text
    assert (replay / "report.html").is_file() and not list(replay.glob("*.png"))  # nothing but the page written
    ablation = tmp_path / "ablation"
    ablation.mkdir()
    (ablation / "ablation.json").write_text(json.dumps([
        {"scenario": "trap-1p1d", "variant": "full", "goodput_per_h": 90.0, "relative_goodput": 1.0,
         "completed_fraction": 0.9, "shed_fraction": 0.0, "first_call_wait_p90_s": 12.0, "ttft_p90_s": 1.5,
         "state": "healthy"}]))
    text = write_report(ablation).read_text(encoding="utf-8")
    check_page(text)
    assert "<th>relative</th>" in text and "state-healthy" in text
