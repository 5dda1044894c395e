"""When the compiled build of the hot modules is used (basin.accel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from basin import accel

ROOT = Path(__file__).resolve().parents[1]


def test_every_compiled_module_has_its_source_and_is_in_the_digest(tmp_path: Path) -> None:
    for name in accel.COMPILED_MODULES:
        assert accel.source_path(name).is_file(), name
        spec = accel._SourceOnly.find_spec(name)
        assert spec is not None and spec.origin == str(accel.source_path(name))
    assert accel._SourceOnly.find_spec("basin.policy.basin") is None  # the rest is found as usual
    # Each module's bytes count: a copy of the package with one module edited digests differently.
    copy = tmp_path / "basin"
    for name in accel.COMPILED_MODULES:
        target = accel.source_path(name, copy)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(accel.source_path(name).read_bytes())
    assert accel.source_digest(copy) == accel.source_digest()
    edited = accel.source_path("basin.policy.driver", copy)
    edited.write_text(edited.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert accel.source_digest(copy) != accel.source_digest()


def test_pure_python_is_forced_for_every_compiled_module() -> None:
    script = ("import json, importlib, basin.accel as a; "
              "print(json.dumps({n: importlib.import_module(n).__file__ for n in a.COMPILED_MODULES}))")
    env = dict(os.environ, BASIN_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True,
                         cwd=ROOT)
    files = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(path.endswith(".py") for path in files.values()), files


def test_a_build_older_than_its_sources_is_ignored_with_a_warning(monkeypatch, tmp_path: Path) -> None:
    if not accel._built():
        pytest.skip("no compiled build here (make accel builds it)")
    stale = tmp_path / "compiled.sha256"
    stale.write_text("0" * 64 + "\n", encoding="utf-8")
    monkeypatch.setattr(accel, "DIGEST_FILE", stale)
    monkeypatch.delenv("BASIN_PURE_PYTHON", raising=False)
    with pytest.warns(UserWarning, match="older than their sources"):
        assert accel._use_sources()
    monkeypatch.setattr(accel, "DIGEST_FILE", tmp_path / "missing.sha256")
    with pytest.warns(UserWarning, match="make accel"):
        assert accel._use_sources()
