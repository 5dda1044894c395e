"""Benchmarks: run with ``make bench`` or ``.venv/bin/python -m bench``."""
