"""Where the project's shipped files live (data, scenarios, profiles)."""

from __future__ import annotations

import os
from pathlib import Path

#: Repository root: the package is installed in editable mode from ``src/``.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Shipped traces and their licences; ``BASIN_DATA_DIR`` overrides it.
DATA_DIR = Path(os.environ.get("BASIN_DATA_DIR", REPO_ROOT / "data"))

#: Built-in scenario files (YAML).
SCENARIO_DIR = REPO_ROOT / "scenarios"

#: Hardware profiles and deployments (YAML data files).
PROFILE_DIR = REPO_ROOT / "profiles"
