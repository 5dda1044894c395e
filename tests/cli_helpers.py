"""Running the ``basin`` command in-process from tests."""

from __future__ import annotations

import pytest

from basin.cli.app import main


def run_basin(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``basin ARGS``; returns (exit code, stdout, stderr with rich's
    line wrapping undone so that messages compare as one line)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())
