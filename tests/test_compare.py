"""``basin compare`` and ``--system all``: expansion, relative figures, the
Markdown the doc receives, and one short end-to-end run of the command."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import pytest
from typer.testing import CliRunner

from basin.cli.app import app
from basin.errors import BasinInputError
from basin.experiments.compare import (
    DOC_BEGIN,
    DOC_END,
    ScenarioInfo,
    aggregate,
    fill_doc,
    markdown,
)
from basin.policy.registry import policy_names
from basin.systems import PAPER_ORDER, expand_systems

SHORT = ["--set", "duration_min=8", "--set", "measure_end_min=6", "--set", "arrivals.base_fraction_of_critical=0.2",
         "--set", "surge.start_min=2", "--set", "surge.end_min=4"]


def test_all_expands_to_every_registered_policy_in_paper_order():
    systems = expand_systems(["all"])
    assert sorted(systems) == policy_names()
    known = [s for s in PAPER_ORDER if s in systems]
    assert systems[: len(known)] == known
    assert expand_systems(["continuum", "all", "continuum"])[0] == "continuum"
    assert len(expand_systems(["continuum", "all"])) == len(policy_names())
    with pytest.raises(BasinInputError):
        expand_systems(["no-such-system"])


def _result(sc, system, seed, goodput, slowdown, state="healthy"):
    return {"scenario": sc, "system": system, "seed": seed, "goodput_per_h": goodput, "completed_fraction": 0.9,
            "shed_fraction": 0.0, "state": state, "hit_rate_pre": 0.9, "hit_rate_final": 0.8,
            "first_call_wait_p50_s": 0.0, "first_call_wait_p90_s": 10.0, "first_token_wait_p50_s": 1.0,
            "first_token_wait_p90_s": 30.0, "slowdown_p50": slowdown, "ttft_p90_s": 2.0,
            "itl_violating_share": 0.0, "active_sessions_final": 50.0, "borrowed_tokens": 0,
            "bins": [(0.0, 0.9, 1.0), (5.0, 0.8, float("nan"))]}


def test_relative_figures_are_per_scenario_and_seed_averaged():
    infos = {"a": ScenarioInfo("a", "1P3D", "x5 surge", 120, (15, 35)),
             "b": ScenarioInfo("b", "1P1D", "GPU only", 120, (15, 35))}
    results = [_result("a", "hicache", 0, 100.0, 8.0, "trapped"), _result("a", "hicache", 1, 200.0, 6.0),
               _result("a", "continuum", 0, 300.0, 3.0), _result("a", "continuum", 1, 300.0, 3.0),
               _result("b", "hicache", 0, 50.0, float("nan")), _result("b", "continuum", 0, 25.0, 5.0)]
    rows = aggregate(results, infos, ["hicache", "continuum"])
    by = {(r.scenario, r.system): r for r in rows}
    assert by[("a", "hicache")].goodput_per_h == 150.0
    assert by[("a", "hicache")].goodput_pct_of_best == 50.0
    assert by[("a", "hicache")].state == "trapped/healthy"
    assert by[("a", "continuum")].goodput_pct_of_best == 100.0
    assert by[("a", "hicache")].slowdown_pct_of_lowest == pytest.approx(100 * 7.0 / 3.0)
    assert by[("b", "hicache")].goodput_pct_of_best == 100.0
    assert math.isnan(by[("b", "hicache")].slowdown_pct_of_lowest)
    assert by[("b", "continuum")].slowdown_pct_of_lowest == 100.0
    text = markdown(rows, infos, "basin compare a b")
    assert "| continuum | 300 (100%) | 25 (50%) |" in text
    assert "basin compare a b" in text


def test_fill_doc_replaces_only_the_marked_part(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text(f"# Results\n\nbefore\n{DOC_BEGIN}\nold table\n{DOC_END}\nafter\n")
    fill_doc(doc, "new table\n")
    text = doc.read_text()
    assert "old table" not in text and "new table" in text
    assert text.startswith("# Results\n\nbefore\n") and text.endswith("after\n")
    fill_doc(doc, "newer\n")
    assert doc.read_text().count(DOC_BEGIN) == 1 and "newer" in doc.read_text()
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    with pytest.raises(BasinInputError):
        fill_doc(bare, "x")


def test_compare_command_runs_systems_over_scenarios(tmp_path):
    doc = tmp_path / "docs" / "results.md"
    doc.parent.mkdir()
    doc.write_text(f"# Results\n{DOC_BEGIN}\n{DOC_END}\n")
    res = CliRunner().invoke(app, ["compare", "main-1p3d-x5", "main-1p1d-gpuonly", "--system", "hicache",
                                   "--system", "continuum", "--jobs", "2", "--json", "--out", str(tmp_path / "out"),
                                   "--doc", str(doc), *SHORT])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    assert {(r["scenario"], r["system"]) for r in rows} == {
        (sc, s) for sc in ("main-1p3d-x5", "main-1p1d-gpuonly") for s in ("hicache", "continuum")}
    for sc in ("main-1p3d-x5", "main-1p1d-gpuonly"):
        assert max(r["goodput_pct_of_best"] for r in rows if r["scenario"] == sc) == pytest.approx(100.0)
    assert (doc.parent / "img" / "results-main.png").stat().st_size > 0
    assert (doc.parent / "img" / "results-main-1p3d-x5.png").stat().st_size > 0
    assert "| hicache |" in doc.read_text()
    assert (tmp_path / "out" / "compare.json").exists()


def test_unknown_system_fails_before_running():
    res = CliRunner().invoke(app, ["compare", "main-1p3d-x5", "--system", "nope"])
    assert res.exit_code != 0


def test_doc_without_markers_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    from tests.cli_helpers import run_basin

    import basin.experiments.compare as compare_mod

    monkeypatch.setattr(compare_mod, "run_compare", None)  # a run would fail loudly
    doc = tmp_path / "notes.md"
    doc.write_text("# my notes, no markers\n")
    code, _, err = run_basin(capsys, "compare", "main-1p3d-x5", "--system", "hicache", "--doc", str(doc))
    assert code == 2 and f"--doc {doc}: no '{DOC_BEGIN}'" in err
    assert doc.read_text() == "# my notes, no markers\n"


def test_compare_of_a_scenario_file_keeps_tables_labels_bins_and_records_provenance(tmp_path, monkeypatch, capsys):
    from tests.cli_helpers import run_basin

    from basin.experiments.compare import CompareBin
    from basin.paths import SCENARIO_DIR

    mine = tmp_path / "studies" / "my.yaml"
    mine.parent.mkdir()
    mine.write_text((SCENARIO_DIR / "main-1p1d-gpuonly.yaml").read_text().replace("name: main-1p1d-gpuonly",
                                                                                  "name: mine"))
    out = tmp_path / "out"
    (out / "runs" / "old" / "hicache" / "seed-0").mkdir(parents=True)
    (out / "runs" / "old" / "hicache" / "seed-0" / "summary.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run_basin(capsys, "compare", str(mine), "--system", "hicache", "--system", "basin-prior",
                                  "--jobs", "-1", "--out", str(out), "--plot", str(out / "fig14.svg"), "--csv",
                                  *SHORT, "--set", "duration_min=15", "--set", "measure_end_min=10")
    assert code == 0, err
    # stderr is not a terminal: progress as plain lines, ending with every run done.
    assert "compare: 2/2 runs (100%)" in err
    # Per-run tables, and none of the earlier compare's.
    for system in ("hicache", "basin-prior"):
        assert (out / "runs" / "mine" / system / "seed-0" / "calls.parquet").is_file()
    assert not (out / "runs" / "old").exists()
    # Bins labelled, rows as CSV (printed and written).
    rows = json.loads((out / "compare.json").read_text())
    assert set(rows[0]["bins"][0]) == {f.name for f in dataclasses.fields(CompareBin)}
    assert rows[0]["scenario"] == str(mine)
    assert stdout.splitlines()[0].startswith("scenario,system,") and len(stdout.strip().splitlines()) == 3
    assert (out / "compare.csv").read_text() == stdout
    # The Fig. 14 plot in the format its name asks for; Fig. 13 named after the scenario, with lines.
    assert (out / "fig14.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert (out / "mine-bins.png").stat().st_size > 0
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["scenarios"][0]["resolved"]["name"] == "mine" and prov["scenarios"][0]["file"] == str(mine)
    assert set(prov["systems"]) == {"hicache", "basin-prior"}
    assert prov["systems"]["basin-prior"]["policy_params_by_scenario"][str(mine)]["margin"] == 0.9


def test_fig13_plots_the_rows_of_a_scenario_given_by_path(tmp_path):
    from basin.experiments.compare import plot_bins

    infos = {"dir/my.yaml": ScenarioInfo("mine", "1P1D", "x5 surge", 10, (2, 4))}
    rows = aggregate([_result("dir/my.yaml", "hicache", 0, 100.0, 2.0)], infos, ["hicache"])
    fig = plot_bins(rows, infos["dir/my.yaml"], tmp_path / "b.png", key="dir/my.yaml")
    lines = [ln for ax in fig.axes for ln in ax.get_lines()]
    assert lines and all(len(ln.get_xdata()) == 2 for ln in lines)
    with pytest.raises(ValueError, match="no rows of scenario 'mine'"):
        plot_bins(rows, infos["dir/my.yaml"], tmp_path / "b.png")


def test_figures_are_written_in_the_format_their_name_asks_for(tmp_path):
    from basin.plotting import new_figure, save_figure

    fig = new_figure(2.0, 2.0)
    fig.subplots().plot([0, 1], [0, 1])
    assert save_figure(fig, tmp_path / "a.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert save_figure(fig, tmp_path / "a.pdf").read_bytes().startswith(b"%PDF")
    assert save_figure(fig, tmp_path / "a.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(BasinInputError, match=r"cannot write a figure as '.docx'.*\.svg"):
        save_figure(fig, tmp_path / "a.docx")


def test_compare_table_shows_full_system_names():
    from rich.console import Console

    from basin.cli.compare import print_tables

    infos = {"a": ScenarioInfo("a", "1P3D", "x5 surge", 120, (15, 35))}
    systems = ["basin-prior", "thunderagent", "composition"]
    rows = aggregate([_result("a", s, 0, 100.0, 2.0) for s in systems], infos, systems)
    console = Console(width=60, record=True, file=io.StringIO())
    print_tables(rows, infos, console)
    text = console.export_text()
    for name in systems:
        assert f"│ {name} " in text
