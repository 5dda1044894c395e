"""Where the project's shipped files live (data, scenarios, profiles).

Every lookup of a shipped file goes through the names below. A wheel carries
the repository's ``scenarios/``, ``profiles/``, ``data/`` and ``sweeps/`` inside the
package, under ``basin/_shipped/`` (``setup.py`` copies them at build time);
an editable checkout has no such folder and reads them at the repository's
top, where people edit them.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The installed ``basin`` package.
PACKAGE_DIR = Path(__file__).resolve().parent

#: Repository root of an editable checkout (``src/basin`` two levels down);
#: meaningless for a wheel, whose shipped files are in :data:`SHIPPED_DIR`.
REPO_ROOT = PACKAGE_DIR.parents[1]

#: Where a wheel keeps the shipped folders.
PACKAGED_DIR = PACKAGE_DIR / "_shipped"


def _shipped_root() -> Path:
    """The package's copy when the package has one (a wheel), else the checkout."""
    return PACKAGED_DIR if (PACKAGED_DIR / "scenarios").is_dir() else REPO_ROOT


#: The folder holding ``scenarios/``, ``profiles/`` and ``data/``.
SHIPPED_DIR = _shipped_root()

#: Shipped traces and their licences; ``BASIN_DATA_DIR`` overrides it.
DATA_DIR = Path(os.environ.get("BASIN_DATA_DIR") or SHIPPED_DIR / "data")

#: Built-in scenario files (YAML).
SCENARIO_DIR = SHIPPED_DIR / "scenarios"

#: Hardware profiles and deployments (YAML data files).
PROFILE_DIR = SHIPPED_DIR / "profiles"

#: The paper's sweep files, runnable by name (``basin sweep fig07-vulnerability-1p1d``).
SWEEP_DIR = SHIPPED_DIR / "sweeps"

#: Whether the shipped files are the editable checkout's (writing there edits the repository).
IN_CHECKOUT = SHIPPED_DIR == REPO_ROOT
