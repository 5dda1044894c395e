"""``basin report`` pages opened in a real headless browser (Debian's Chromium through
Playwright; ``make browser`` installs it): no console or page errors, nothing fetched
from outside the page, every image decoded and shown, every table rendered."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright
from tests.cli_helpers import run_basin
from tests.test_report import SHORT, sweep_report

CHROMIUM = os.environ.get("BASIN_CHROMIUM", "/usr/bin/chromium")


def _browser_path() -> str:
    path = shutil.which(CHROMIUM) or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if path is None:
        pytest.fail(f"no Chromium at {CHROMIUM}: run `make browser` (Debian's chromium) or set BASIN_CHROMIUM")
    return path


def open_page(page_file: Path, screenshot: Path | None = None) -> dict[str, Any]:
    """What a browser makes of the page: errors, outside requests, images and
    tables, where the summary and the plots sit; with ``screenshot``, the
    first screen as a PNG."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_browser_path(), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            console_errors: list[str] = []
            page_errors: list[str] = []
            outside: list[str] = []
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))

            def route(r: Any) -> None:
                url = r.request.url
                if url.startswith(("file:", "data:")):
                    r.continue_()
                else:
                    outside.append(url)
                    r.abort()

            page.route("**/*", route)
            page.goto(page_file.as_uri(), wait_until="load")
            images = page.evaluate(
                "[...document.images].map(i => ({ok: i.complete && i.naturalWidth > 0, w: i.naturalWidth,"
                " shown: i.getBoundingClientRect().width, alt: i.alt}))")
            tables = page.evaluate("[...document.querySelectorAll('table')].map(t => t.rows.length)")
            title = page.title()
            layout = page.evaluate(
                "(() => { const s = document.querySelector('table.summary'), i = document.images[0];"
                " const raw = [...document.querySelectorAll('details table')];"
                " return {summary_top: s ? s.getBoundingClientRect().top : null,"
                " summary_visible: s ? s.getBoundingClientRect().height > 0 : false,"
                " image_top: i ? i.getBoundingClientRect().top : null,"
                " raw_hidden: raw.length > 0 && raw.every(t => !t.checkVisibility() && !t.closest('details').open),"
                " headers: s ? [...s.tHead.rows[0].cells].map(c => c.textContent) : [],"
                " viewport: window.innerHeight}; })()")
            if screenshot is not None:
                page.set_viewport_size({"width": 1280, "height": 900})
                page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    return {"console": console_errors, "errors": page_errors, "outside": outside, "images": images,
            "tables": tables, "title": title, "layout": layout}


def _assert_clean(seen: dict[str, Any], images: int) -> None:
    assert seen["console"] == [] and seen["errors"] == [] and seen["outside"] == []
    assert len(seen["images"]) == images
    for img in seen["images"]:
        assert img["ok"] and img["w"] > 100 and img["shown"] > 0 and img["alt"], img
    assert seen["tables"] and all(rows >= 2 for rows in seen["tables"])  # a header and at least one row
    assert seen["title"]


def test_run_report_in_a_browser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    code, _, err = run_basin(capsys, "report", str(tmp_path / "run"), "--out", str(tmp_path / "run.html"))
    assert code == 0, err
    _assert_clean(open_page(tmp_path / "run.html"), images=2)


def test_sweep_report_in_a_browser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _assert_clean(open_page(sweep_report(tmp_path, capsys)), images=1)


def test_the_check_sees_a_broken_page(tmp_path: Path) -> None:
    """The browser check itself fails on what it guards against."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><head><title>x</title></head><body>"
                    "<img alt='a' src='data:image/png;base64,AAAA'>"
                    "<img alt='b' src='https://example.invalid/x.png'>"
                    "<script>console.error('boom')</script></body></html>")
    seen = open_page(page)
    assert "boom" in seen["console"]
    assert seen["outside"] == ["https://example.invalid/x.png"]
    assert not any(img["ok"] for img in seen["images"])


def test_a_two_system_report_reads_like_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The summary the terminal prints is on the first screen, above the
    plots; the raw columns are folded away. The screenshot is kept where
    BASIN_SCREENSHOT_DIR says (to be looked at), else with the test."""
    code, _, err = run_basin(capsys, "run", "trap-1p1d", *SHORT, "--system", "hicache", "--system", "basin",
                             "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    code, _, err = run_basin(capsys, "report", str(tmp_path / "run"))
    assert code == 0, err
    shots = Path(os.environ.get("BASIN_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    seen = open_page(tmp_path / "run" / "report.html", screenshot=shots / "report-run.png")
    _assert_clean(seen, images=2)
    layout = seen["layout"]
    assert layout["summary_visible"] and layout["summary_top"] < layout["viewport"]
    assert layout["summary_top"] < layout["image_top"]
    assert layout["raw_hidden"]
    assert layout["headers"][:5] == ["system", "goodput/h", "completed", "shed", "state"]
    shot = (shots / "report-run.png").read_bytes()
    assert shot.startswith(b"\x89PNG") and len(shot) > 10_000
