"""`basin emulate` refuses bad flags before it listens, naming the flag."""

from __future__ import annotations

import pytest
from tests.cli_helpers import run_basin


@pytest.mark.parametrize("args, says", [
    (["--deployment", "9q9q"], "deployment"),
    (["--deployment", "1p1d-h100", "--speed", "0"], "--speed"),
    (["--deployment", "1p1d-h100", "--host-ratio", "-1"], "--host-ratio"),
    (["--deployment", "1p1d-h100", "--listen", "here:there"], "--listen"),
    (["--deployment", "1p1d-h100", "--metrics-style", "tgi"], "--metrics-style"),
    (["--deployment", "1p1d-h100", "--default-max-tokens", "0"], "--default-max-tokens"),
])
def test_bad_flags_exit_2_with_one_line_naming_them(capsys, args, says):
    code, _, err = run_basin(capsys, "emulate", *args)
    assert code == 2 and says in err and "Traceback" not in err


def test_help_names_every_flag(capsys):
    code, out, _ = run_basin(capsys, "emulate", "--help")
    assert code == 0
    for flag in ("--deployment", "--host-ratio", "--speed", "--listen", "--metrics-style", "--seed"):
        assert flag in out
