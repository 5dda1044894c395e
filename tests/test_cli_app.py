"""The ``basin`` entry point: every command listed, only the one that runs imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from basin.cli.app import COMMANDS, build_app


def test_the_whole_command_lists_every_sub_command_once():
    group = typer.main.get_command(build_app())
    assert sorted(group.commands) == sorted(COMMANDS)  # type: ignore[attr-defined]


def test_a_command_imports_only_its_own_module():
    code = ("import sys; from basin.cli.app import main\n"
            "try: main(['scenario', 'list'])\n"
            "except SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('basin.cli.') and m != 'basin.cli.app'))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "['basin.cli.scenario']"


def test_help_and_unknown_commands_see_the_whole_command(capsys):
    from basin.cli.app import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert all(name in shown for name in COMMANDS)
    with pytest.raises(SystemExit) as refused:
        main(["no-such-command"])
    assert refused.value.code == 2
    assert "No such command" in capsys.readouterr().err
