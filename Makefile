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

# --- local testing: the simulator and a receiver together ---
.PHONY: demo
demo: $(VENV)/.installed  ## simulator + receiver, a mix of events with faults, a report; < 1 min
	$(BIN)/python -m receiver.demo

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
