# One entry point for people and CI. Every target creates the virtualenv it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.example.toml

.PHONY: run simulate test test-fast lint format typecheck check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Installs are re-run only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

run: $(VENV)/.installed  ## start the receiver on the embedded defaults (SQLite, ./data)
	$(BIN)/receiver serve --config $(CONFIG)

simulate: $(VENV)/.installed  ## start the local upstream stand-in on 127.0.0.1:8090
	$(BIN)/receiver simulate

test: $(VENV)/.installed-dev  ## the whole suite
	$(BIN)/pytest -q

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check receiver tests
	$(BIN)/ruff format --check receiver tests

format: $(VENV)/.installed-dev
	$(BIN)/ruff format receiver tests
	$(BIN)/ruff check --fix receiver tests

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache

# --- Benchmarks and the long fuzz run (bench/; never part of `make test`) ---------------------
# Each benchmark measures its baselines in the same run and prints ratios; BENCH_ARGS passes
# options through (e.g. `make bench-ingest BENCH_ARGS="--rounds 5 --loop asyncio"`).
.PHONY: bench bench-ingest bench-scale bench-e2e bench-tools fuzz
BENCH_ARGS ?=
FUZZ_EXAMPLES ?= 100000

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,uvloop]'
	touch $(VENV)/.installed $(VENV)/.installed-dev $@

bench-tools:  ## wrk, from the distribution, only when missing
	@command -v wrk >/dev/null 2>&1 || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update && $$sudo apt-get install -y wrk; }

bench-ingest: $(VENV)/.installed-bench bench-tools  ## intake vs a bare handler and per-request commits
	$(BIN)/python -m bench.ingest $(BENCH_ARGS)

bench-scale: $(VENV)/.installed-bench bench-tools  ## 1M events stored vs empty; drain 100k
	$(BIN)/python -m bench.scale $(BENCH_ARGS)

bench-e2e: $(VENV)/.installed-bench  ## events/s against a 100 ms upstream vs the concurrency bound
	$(BIN)/python -m bench.e2e $(BENCH_ARGS)

bench: bench-ingest bench-scale bench-e2e

fuzz: $(VENV)/.installed-dev  ## the webhook fuzz test with $(FUZZ_EXAMPLES) requests
	RECEIVER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest tests/hostile/test_fuzz_webhook.py \
		-q -s -p no:cacheprovider -o timeout=0
