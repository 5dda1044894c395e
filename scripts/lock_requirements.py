"""Write requirements-lock.txt: the exact versions the tests run with.

pyproject.toml states compatible ranges (so that basin-serve installs beside
other stacks); this pins what the project's own environment resolved them
to, for reproducible CI. It walks the installed distributions from
``basin-serve[dev]`` down, so tools installed beside it (the test engine,
benchmarks) stay out. Run it with the environment's Python after an upgrade:

    .venv/bin/python scripts/lock_requirements.py
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "basin-serve"
EXTRAS = ("dev",)


def _requirements(dist: metadata.Distribution, extras: tuple[str, ...]) -> list[Requirement]:
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**default_environment(), "extra": e})
                                     for e in ("", *extras)):
            out.append(req)
    return out


def _project_requirements() -> list[Requirement]:
    """The project's own requirements, read from pyproject.toml (the installed
    metadata of an editable install may predate an edit)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    texts = list(project["dependencies"])
    for extra in EXTRAS:
        texts += project["optional-dependencies"][extra]
    reqs = [Requirement(t) for t in texts]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(dict(default_environment()))]


def closure() -> dict[str, str]:
    """Every distribution ``basin-serve[dev]`` needs here, name -> version."""
    pinned: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [(PROJECT, EXTRAS)]
    while todo:
        name, extras = todo.pop()
        reqs = _project_requirements() if name == PROJECT else _requirements(metadata.distribution(name), extras)
        for req in reqs:
            key = canonicalize_name(req.name)
            try:
                version = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                sys.exit(f"{req.name} (needed by {name}) is not installed; run `make setup` first")
            if not req.specifier.contains(version, prereleases=True):
                sys.exit(f"{req.name} {version} is installed but {name} asks for {req}; run `make setup` first")
            if key not in pinned:
                pinned[key] = version
                todo.append((req.name, tuple(req.extras)))
    return pinned


def main() -> None:
    pins = closure()
    lines = ["# Exact versions the tests run with; `make setup` installs with them as constraints.",
             "# pyproject.toml keeps compatible ranges. Regenerate: .venv/bin/python scripts/lock_requirements.py",
             *(f"{name}=={version}" for name, version in sorted(pins.items()))]
    (ROOT / "requirements-lock.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(pins)} pins to requirements-lock.txt")


if __name__ == "__main__":
    main()
