"""Test doubles shared by the tests and the benchmarks, imported as
``tests.support.<module>`` with the repository root on ``sys.path`` (pytest:
tests/conftest.py; ``python -m bench...`` and ``python -m tests.support...``:
run from the repository root)."""
