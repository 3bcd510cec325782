# One entry point for setup, run, lint, test and bench. Every target builds the venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run lint format test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m tgo.train $(ARGS)

# The habits CI enforces (.ci/run runs this before the tests; .pre-commit-config.yaml runs the same on commit).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# Rewrites files: ruff's fixes and formatter.
format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun bench_out .pytest_cache .mypy_cache .ruff_cache
