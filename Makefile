# Two entry points for a fresh machine: `make run` (the main job) and `make test`.
# Both create the project's own virtual environment on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# pyproject.toml states compatible ranges; requirements-lock.txt pins the exact
# versions the tests run with (constraints: nothing is installed that the
# project does not ask for). Refresh it with `make lock` after an upgrade.
$(STAMP): pyproject.toml setup.py requirements-lock.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c requirements-lock.txt -e '.[dev]'
	touch $(STAMP)

# The real engines of the integration tests, cached per machine under ~/.cache/basin-serve:
# llama.cpp + a 270M model (the first build ~7 minutes), and vLLM's CPU build in an
# environment of its own with a random-weight model written locally (~3 minutes).
ENGINE_STAMP := $(VENV)/.engine
$(ENGINE_STAMP): $(STAMP) scripts/setup_engine.sh scripts/setup_vllm.py scripts/build_vllm_model.py \
		profiles/engines/vllm-cpu.yaml profiles/engines/vllm-cpu-requirements.txt
	PYTHON=$(VENV)/bin/python scripts/setup_engine.sh
	$(VENV)/bin/python scripts/setup_vllm.py
	touch $(ENGINE_STAMP)

# The headless browser the report tests open pages in (Debian's chromium, once per machine).
BROWSER_STAMP := $(VENV)/.browser
$(BROWSER_STAMP): $(STAMP) scripts/setup_browser.sh
	scripts/setup_browser.sh
	touch $(BROWSER_STAMP)

# The simulator's hot modules and the policy driver compiled with mypyc (about
# a minute; identical results, about twice as fast). Without a compiler the
# pure-Python modules run; basin ignores a build older than its sources.
ACCEL_STAMP := src/.accel-stamp
$(ACCEL_STAMP): $(STAMP) setup.py src/basin/accel.py $(wildcard src/basin/sim/*.py) src/basin/policy/driver.py
	@BASIN_COMPILE=1 $(VENV)/bin/python setup.py --quiet build_ext --inplace >$(VENV)/accel.log 2>&1 \
		&& echo "make accel: compiled the simulator" \
		|| echo "make accel: could not compile the simulator (see $(VENV)/accel.log); the pure-Python one runs"
	@touch $(ACCEL_STAMP)

.PHONY: setup engine browser accel bytecode run test lint bench bench-gateway lock
setup: $(STAMP) bytecode

# The package's bytecode written ahead (only what is stale; a second or so the
# first time): where PYTHONDONTWRITEBYTECODE is set, every `basin`
# process would otherwise compile the modules it imports (about 0.1 CPU s a run).
bytecode: $(STAMP)
	@$(VENV)/bin/python -m compileall -q src >/dev/null

engine: $(ENGINE_STAMP)

browser: $(BROWSER_STAMP)

accel: $(ACCEL_STAMP)

run: $(STAMP) bytecode
	$(VENV)/bin/basin run surge-1p3d --system hicache --system basin

test: $(STAMP) $(ENGINE_STAMP) $(BROWSER_STAMP) $(ACCEL_STAMP) bytecode lint
	$(VENV)/bin/python -m pytest -q -m "not realtime"

# Style and types: ruff and mypy, clean (part of `make test`, so CI runs them).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/mypy

# Pin what the environment resolved the ranges to (see scripts/lock_requirements.py).
lock: $(STAMP)
	$(VENV)/bin/python scripts/lock_requirements.py

bench: $(STAMP) $(ACCEL_STAMP) bytecode
	$(VENV)/bin/python -m bench

# The gateway's added latency beside direct calls and the LiteLLM proxy (about 12 minutes).
bench-gateway: $(STAMP)
	$(VENV)/bin/pip install --quiet --no-deps -r bench/requirements-litellm.txt
	$(VENV)/bin/python -m bench.gateway_latency
