"""The layering of docs/architecture.md, held by a test: no package imports
what it must not know about, lazy imports (inside functions) included."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "basin"

#: Modules at the base of the package, free for every part to import but the
#: policy core, which may import only the pure ones (``POLICY_BASE``).
BASE = {"errors", "paths", "jsonvalues", "yamlfile", "plotting", "diskcache", "hostport", "accel", "cliff",
        "runtables"}
#: The base modules the policy core may import: errors, and the cliff's shape (numpy only).
POLICY_BASE = {"errors", "cliff"}

#: Part of the package -> the parts it may import (besides itself and BASE).
ALLOWED: dict[str, set[str]] = {
    "catalog": set(),
    "workload": {"catalog"},
    "metrics": {"workload"},
    "policy": set(),
    "predict": {"catalog", "workload", "metrics"},
    "model": {"catalog", "workload", "metrics"},
    "sim": {"catalog", "policy", "workload"},
    "systems": {"catalog", "policy", "predict", "workload"},
    "experiments": {"catalog", "policy", "predict", "model", "metrics", "sim", "systems", "workload"},
    "gateway": {"catalog", "policy", "predict", "model", "metrics", "systems", "workload"},
    "emulate": {"catalog", "policy", "sim", "workload"},  # an engine over HTTP: never the gateway
    "calibrate": {"catalog", "workload"},  # an HTTP client writing catalogue data: never the simulator
    "cli": {"catalog", "policy", "predict", "model", "metrics", "sim", "systems", "workload", "experiments",
            "gateway", "emulate", "calibrate"},
    "__main__": {"cli"},  # `python -m basin`: the command, nothing else
}
for _base in BASE:
    ALLOWED[_base] = set()


def _may_import(part: str, target: str) -> bool:
    if target in (part, "basin") or target in ALLOWED[part]:
        return True
    if part == "policy":
        return target in POLICY_BASE
    return target in BASE

#: Parts whose third-party imports are limited (the policy core is pure:
#: the standard library and numpy).
THIRD_PARTY_ALLOWED = {"policy": {"numpy"}}


def _part(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.name != "__init__.py" else "basin"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            if node.module == "basin":
                found += [(node.lineno, f"basin.{alias.name}") for alias in node.names]
    return found


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p.name != "__init__.py" or p.parent != SRC)


def violations() -> list[str]:
    stdlib = set(sys.stdlib_module_names)
    out = []
    for path in _modules():
        part = _part(path)
        allowed = ALLOWED.get(part)
        if allowed is None:
            out.append(
                f"{path.relative_to(SRC)}: part '{part}' has no layering rule; add one to tests/test_layering.py")
            continue
        for line, module in _imports(path):
            top, _, rest = module.partition(".")
            if top == "basin":
                target = rest.split(".")[0] if rest else "basin"
                if not _may_import(part, target):
                    out.append(f"{path.relative_to(SRC)}:{line}: '{part}' imports {module}")
            elif part in THIRD_PARTY_ALLOWED and top not in stdlib and top not in THIRD_PARTY_ALLOWED[part]:
                out.append(f"{path.relative_to(SRC)}:{line}: '{part}' imports third-party {module}")
    return out


def test_no_part_imports_what_it_must_not_know() -> None:
    bad = violations()
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_policy_imports_only_its_own_modules_and_the_pure_base() -> None:
    allowed = ("basin.policy", *(f"basin.{m}" for m in POLICY_BASE))
    for path in sorted((SRC / "policy").glob("*.py")):
        for line, module in _imports(path):
            if module.startswith("basin."):
                assert module.startswith(allowed), f"{path.name}:{line} imports {module}"


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from basin.sim.engine import Simulator\n    import basin.gateway\n")
    assert [m for _, m in _imports(sample)] == ["basin.sim.engine", "basin.gateway"]


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_every_rule_names_known_parts(part: str) -> None:
    known = set(ALLOWED) | {"basin"}
    assert ALLOWED[part] <= known
