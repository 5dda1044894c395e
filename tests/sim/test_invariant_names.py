"""The registry of invariants (:data:`basin.sim.invariants.INVARIANTS`) is
the set the simulator's code raises, both ways: a name raised that is not
listed, listed where it is not raised, or listed and raised nowhere fails."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from basin.sim.invariants import INVARIANTS

SIM = Path(__file__).resolve().parents[2] / "src" / "basin" / "sim"
TESTS = Path(__file__).resolve().parents[1]

_RAISERS = {"InvariantViolation": 0, "RequestNeverFits": 0, "require": 1}


def raised_names(package_dir: Path) -> dict[str, set[str]]:
    """Invariant name -> the modules whose code raises it (``require(cond,
    NAME)``, ``InvariantViolation(NAME)``, ``RequestNeverFits(NAME)``)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in package_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            position = _RAISERS.get(name)
            if position is None or len(node.args) <= position:
                continue
            arg = node.args[position]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found[arg.value].add(path.stem)
    return found


def test_every_invariant_raised_is_listed_where_it_is_raised():
    raised = raised_names(SIM)
    assert len(raised) > 15
    for name, modules in sorted(raised.items()):
        assert name in INVARIANTS, f"{name} (raised in {sorted(modules)}) is missing from INVARIANTS"
        assert set(INVARIANTS[name][0].split()) == modules, (name, INVARIANTS[name][0], sorted(modules))


def test_every_invariant_listed_is_raised_or_pinned_by_a_test():
    raised = raised_names(SIM)
    tests_text = "\n".join(p.read_text(encoding="utf-8") for p in TESTS.rglob("test_*.py"))
    for name, (where, what) in INVARIANTS.items():
        assert what, name
        if where == "tests":
            assert name not in raised and name in tests_text, name
        else:
            assert name in raised, f"{name} is listed for {where} but raised nowhere"


def test_a_name_raised_but_not_listed_is_found(tmp_path: Path):
    (tmp_path / "m.py").write_text(
        "def f(x):\n    require(x, 'KNOWN')\n    if not x:\n        raise InvariantViolation(\n"
        "            'NEW-RULE', 'detail')\n", encoding="utf-8")
    assert raised_names(tmp_path) == {"KNOWN": {"m"}, "NEW-RULE": {"m"}}
