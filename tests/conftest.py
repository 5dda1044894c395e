"""Shared by every test: the repository root on ``sys.path``, so the test
doubles in ``tests/support`` import as ``tests.support.<module>`` whichever
way pytest is started (``python -m pytest`` from the root already has it; the
``pytest`` script and other working directories do not)."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
