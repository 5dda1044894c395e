"""The small things a new user meets first: -h, help text wrapped as prose,
shell completion, warnings as one line, `workload list --json`, and
`model analyze` saying where the simulator is known to answer otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from tests.cli_helpers import run_basin

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [["-h"], ["run", "-h"], ["workload", "stats", "-h"], ["model", "analyze", "-h"]])
def test_dash_h_is_help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run_basin(capsys, *argv)
    assert code == 0, err
    assert "Usage: basin" in out and "No such option" not in out + err


def test_help_paragraphs_wrap_as_prose(capsys: pytest.CaptureFixture[str]) -> None:
    from basin.cli.app import reflow

    assert reflow("One line\n    broken here.\n\n    Example:\n\n        basin run x\n") == \
        "One line broken here.\n\nExample:\n\n    basin run x"
    code, out, _ = run_basin(capsys, "run", "--help")
    assert code == 0
    # The docstring breaks after "cliff profile," in the source; the help flows on.
    flat = " ".join(line.strip(" │") for line in out.splitlines())
    assert "parameters, cliff profile, version and command" in " ".join(flat.split())
    lines = [line.rstrip() for line in out.splitlines() if line.strip() and "─" not in line and "│" not in line]
    prose = [line for line in lines if not line.lstrip().startswith(("Usage", "Example", "basin"))]
    # Evenly wrapped: no prose line ends far short of the next but the last of a paragraph.
    assert all(len(line) > 40 for line in prose[:-1] if not line.rstrip().endswith((".", ":", ")")))


def test_shell_completion_completes_commands_and_options() -> None:
    env = dict(os.environ, _BASIN_COMPLETE="complete_bash", COMP_WORDS="basin ru", COMP_CWORD="1",
               PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-m", "basin"], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["run"], done.stderr
    env.update(COMP_WORDS="basin run --cl", COMP_CWORD="2")
    done = subprocess.run([sys.executable, "-m", "basin"], env=env, capture_output=True, text=True, timeout=60)
    assert "--clean" in done.stdout.split()
    # The shell named, not detected: under `make` (or CI) the parent shell is sh, which has no completion.
    shown = subprocess.run([sys.executable, "-m", "basin", "--show-completion", "bash"], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT / "src"),
                                                           _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1"))
    assert shown.returncode == 0 and "_BASIN_COMPLETE" in shown.stdout


def test_warnings_print_as_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import basin.workload.presets

    listed = basin.workload.presets.list_presets

    def warns() -> object:
        warnings.warn("workload 'x' has only 5 sessions;\n  results reflect them repeated", UserWarning,
                      stacklevel=2)
        return listed()

    monkeypatch.setattr(basin.workload.presets, "list_presets", warns)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main replaces it; restored after
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code, _, err = run_basin(capsys, "workload", "list", "--json")
    assert code == 0
    assert err == "warning: workload 'x' has only 5 sessions; results reflect them repeated"


def test_workload_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_basin(capsys, "workload", "list", "--json")
    assert code == 0
    presets = json.loads(out)
    assert {"name", "kind", "sessions", "description"} <= set(presets[0])
    assert "terminal-bench" in {p["name"] for p in presets}


def test_model_analyze_says_where_the_simulator_differs(capsys: pytest.CaptureFixture[str]) -> None:
    # +90%: the model recovers with its peak within 10% of N_u, where the simulator often traps.
    code, out, err = run_basin(capsys, "model", "analyze", "--scenario", "trap-1p1d", "--set", "surge.factor=1.9")
    assert code == 0, err
    assert "recovers (near N_u: see the note)" in out
    assert "the simulator" in err and "traps" in err and "docs/fluid-model.md" in err
    code, out, _ = run_basin(capsys, "model", "analyze", "--scenario", "trap-1p1d", "--set", "surge.factor=1.33",
                             "--json")
    assert code == 0 and json.loads(out)["simulator_differs"] == []
    code, out, _ = run_basin(capsys, "model", "analyze", "--scenario", "trap-1p1d", "--set", "surge.factor=1.9",
                             "--json")
    assert any("docs/fluid-model.md" in line for line in json.loads(out)["simulator_differs"])
