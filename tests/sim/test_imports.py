"""No import circle inside ``basin.sim``: its modules import one another in
one direction only, every import counted (at module top, inside functions,
and under ``TYPE_CHECKING``), so each module can be read, tested and
compiled with only the ones below it."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "src" / "basin" / "sim"


def import_graph(package_dir: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (names without the package)."""
    modules = {p.stem for p in package_dir.glob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for path in package_dir.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found = graph[path.stem]
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from . import x, from .x import y
                    base = node.module or ""
                    names = [base] if base else [alias.name for alias in node.names]
                    names = [f"{package}.{n}" for n in names]
                elif node.module == package:
                    names = [f"{package}.{alias.name}" for alias in node.names]
                elif node.module:
                    names = [node.module]
            for name in names:
                if name.startswith(f"{package}."):
                    target = name[len(package) + 1:].split(".")[0]
                    if target in modules and target != path.stem:
                        found.add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected sets of more
    than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_basin_sim_has_no_import_circle():
    graph = import_graph(SIM, "basin.sim")
    assert {"cluster", "requests", "sessions", "prefill", "decode", "borrow", "engine"} <= set(graph)
    assert not circles(graph), circles(graph)
    # The layering the circle's absence gives: requests below the instances,
    # the instances below the core, the core below the simulator.
    assert "requests" in graph["prefill"] and "requests" in graph["decode"]
    assert "cluster" in graph["engine"] and "engine" not in graph["cluster"]
    assert not graph["requests"] & {"sessions", "prefill", "decode", "borrow", "cluster", "engine"}


def test_a_circle_through_lazy_and_type_checking_imports_is_found(tmp_path: Path):
    (tmp_path / "a.py").write_text("def f():\n    from pkg.b import g\n", encoding="utf-8")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n",
                                   encoding="utf-8")
    (tmp_path / "c.py").write_text("import pkg.a\n", encoding="utf-8")
    (tmp_path / "d.py").write_text("from . import a\nfrom .e import x\n", encoding="utf-8")
    (tmp_path / "e.py").write_text("import os\n", encoding="utf-8")
    graph = import_graph(tmp_path, "pkg")
    assert graph["d"] == {"a", "e"} and graph["e"] == set()
    assert circles(graph) == [["a", "b", "c"]]
