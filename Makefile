# One entry point for setup, run, lint, test and bench. Every target builds the venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run lint format test test-other-cpu bench gpu-check soak seeds clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m tgo.train $(ARGS)

# The habits CI enforces (.ci/run runs this before the tests; .pre-commit-config.yaml runs the same on commit).
# The second ruff line runs one preview rule alone (preview mode would change stable rules too): every text file
# opened with its encoding, since under a locale that is not UTF-8 open()'s default is ASCII (tgo-report stopped on
# findings.csv's "±" with LC_ALL=C and no locale coercion).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff check --preview --select PLW1514 .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# Rewrites files: ruff's fixes and formatter.
format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Two pytest-xdist workers (TEST_WORKERS=1 for one process). Work stealing balances the long end-to-end tests
# with the heavy modules dealt first (tests/conftest.py; 7-9 min here, docs/benchmarks.md); a module fixture may be
# built on both workers.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(ARGS)

# The suite with the kernels of another kind of x86 CPU (tools/other_cpu.py; not part of `make test`): a test that
# compares a stored copy bit for bit fails here as on that machine. CPU_KIND: avx2 (no AVX-512) or x86-64 (no AVX).
CPU_KIND ?= avx2
test-other-cpu: $(STAMP)
	$(PY) -m tools.other_cpu $(CPU_KIND) $(ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks $(ARGS)

# GPU acceptance (docs/benchmarks.md): train tgo1 briefly on a CUDA GPU, time the observation, check it is exact.
# On a CPU: make gpu-check ARGS="--device cpu --tiny"
gpu-check: $(STAMP)
	$(PY) -m tools.gpu_check $(ARGS)

# Fault-injection soak (docs/benchmarks.md; not part of `make test`): randomized kill -9 trials over the smoke
# experiment, each resumed with ckpt_path=last until it finishes, then its records checked. E.g. ARGS="--trials 12".
soak: $(STAMP)
	$(PY) -m tools.soak $(ARGS)

# Seed replication (docs/benchmarks.md; not part of `make test`): K seeds of quickstart into bench_out/seeds (finished
# runs reused), every single run's findings scored against the truth of all seeds. E.g. ARGS="--score-only".
seeds: $(STAMP)
	$(PY) -m benchmarks.seed_replication $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun bench_out .pytest_cache .mypy_cache .ruff_cache
