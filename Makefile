# Two entry points for a fresh machine: `make run` (the main job) and `make test`.
# Both create the project's own virtual environment on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

.PHONY: setup run test bench
setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/basin run surge-1p3d --system hicache --system basin

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/python -m bench
