# One entry point for people and CI. Every target creates the virtualenv it needs.
# `make` alone (or `make help`) lists the targets: each one's `## ` comment is its description.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.example.toml

.DEFAULT_GOAL := help
.PHONY: help install run simulate install-all test test-slow lint format typecheck check clean

help:  ## list the targets (this text)
	@echo "usage: make TARGET   (every target creates .venv when it needs it)"
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-zA-Z][a-zA-Z0-9_.-]*:[^=]*## / \
		{printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

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

$(VENV)/.installed-all: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[all]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed  ## the receiver into .venv (the targets below do it when they need it)

install-all: $(VENV)/.installed-all  ## the optional extras (redis, amqp, nats, postgres) into .venv

run: $(VENV)/.installed  ## start the receiver on the embedded defaults (SQLite, ./data)
	$(BIN)/receiver serve --config $(CONFIG)

simulate: $(VENV)/.installed  ## start the local upstream stand-in on 127.0.0.1:8090
	$(BIN)/receiver simulate

# --- local testing: the simulator and a receiver together ---
.PHONY: demo
demo: $(VENV)/.installed  ## simulator + receiver, a mix of events with faults, a report; < 1 min
	$(BIN)/python -m receiver.simulator.demo

# The suite runs in TEST_WORKERS processes (pytest-xdist): most tests wait on sockets, processes
# and timers, so four workers keep two cores busy. TEST_WORKERS=0 runs it in one process.
# The tests start hundreds of `receiver` processes: the sources are compiled once first, so none
# of them compiles them again (as each would where PYTHONDONTWRITEBYTECODE is set).
TEST_WORKERS ?= 4
COMPILE := $(BIN)/python -m compileall -q receiver tests bench
test: $(VENV)/.installed-dev  ## the suite but its slow proofs (make test-slow), in TEST_WORKERS processes (default 4); about 4 min on 2 cores
	@$(COMPILE)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not slow"

test-slow: test-durability  ## the proofs too long for `make test` (.ci/run runs both)
	$(BIN)/pytest -q -p no:cacheprovider -m slow

lint: $(VENV)/.installed-dev  ## ruff check and format check
	$(BIN)/ruff check receiver tests bench
	$(BIN)/ruff format --check receiver tests bench

format: $(VENV)/.installed-dev  ## ruff format and fix what it can
	$(BIN)/ruff format receiver tests bench
	$(BIN)/ruff check --fix receiver tests bench

typecheck: $(VENV)/.installed-dev  ## mypy --strict on receiver/
	$(BIN)/mypy

check: lint typecheck test  ## lint, typecheck and make test

# docs/configuration.md is generated from the config schema; tests/unit/test_docs.py fails while
# the committed page differs from it.
.PHONY: docs
docs: $(VENV)/.installed  ## write docs/configuration.md from the config schema
	$(BIN)/python -m receiver.config.reference docs/configuration.md

clean:  ## remove .venv, ./data and the tool caches
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache

# --- the inbox page in a real browser -----------------------------------------------------------
# tests/web drives Debian's Chromium with Playwright (from the dev extra); Playwright never
# downloads a browser. Idempotent: apt runs only when chromium is missing.
.PHONY: browser-tools screenshots

browser-tools: $(VENV)/.installed-dev  ## Chromium for tests/web, from Debian
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian packages: chromium"; \
		$(SUDO) apt-get update -q \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends chromium; }

screenshots: browser-tools  ## the browser tests, saving docs/ui-*.png (shown in docs/inbox-page.md)
	RECEIVER_SCREENSHOTS=docs $(BIN)/pytest -q tests/web -p no:cacheprovider

# --- deploy -----------------------------------------------------------------------------------
# The tools tests/deploy runs: from Debian caddy, nginx, openssl, sqlite3, prometheus (promtool),
# systemd-analyze and docker-compose (only `config`: no Docker engine is needed); from the
# `deploy` extra hadolint, kubernetes-validate and PyYAML. Idempotent: apt runs only when a
# command is missing. Without them those tests skip (or fail, in CI).
DEPLOY_COMMANDS := caddy:caddy nginx:nginx openssl:openssl prometheus:prometheus curl:curl \
	promtool:prometheus systemd-analyze:systemd docker-compose:docker-compose sqlite3:sqlite3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deploy-tools image-smoke

# Installs the Debian packages of the commands in $(1) (command:package pairs) that are missing;
# apt-get update only when there is something to install.
define apt-install-missing
	@missing=""; \
	for pair in $(1); do \
		PATH="$$PATH:/usr/sbin:/sbin" command -v "$${pair%%:*}" >/dev/null \
			|| missing="$$missing $${pair##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -q \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

deploy-tools: $(VENV)/.installed-deploy  ## install what tests/deploy needs
	$(call apt-install-missing,$(DEPLOY_COMMANDS))

$(VENV)/.installed-deploy: pyproject.toml | $(VENV)/.installed-dev
	$(BIN)/pip install --quiet -e '.[dev,deploy]'
	touch $@

# deploy/docker/Dockerfile's install steps without a Docker engine: the same build context
# (what .dockerignore lets through), a fresh virtualenv, a non-editable install, and the image's
# default config checked by the installed command.
IMAGE_SMOKE := build/image-smoke
image-smoke:  ## the Dockerfile's build steps in a throwaway virtualenv
	rm -rf $(IMAGE_SMOKE)
	mkdir -p $(IMAGE_SMOKE)/src
	cp -r pyproject.toml README.md receiver $(IMAGE_SMOKE)/src/
	find $(IMAGE_SMOKE)/src -name __pycache__ -prune -exec rm -rf {} +
	$(PYTHON) -m venv $(IMAGE_SMOKE)/opt
	PIP_CONSTRAINT=deploy/docker/constraints.txt \
		$(IMAGE_SMOKE)/opt/bin/pip install --quiet --no-cache-dir $(IMAGE_SMOKE)/src
	RECEIVER_WEBHOOK_SECRETS=whsec_image_smoke $(IMAGE_SMOKE)/opt/bin/receiver check-config \
		--config deploy/docker/config.toml
	$(IMAGE_SMOKE)/opt/bin/python -c "from receiver.web import render, ui; \
		assert (ui.STATIC / 'ui.css').is_file() and (ui.STATIC / 'ui.js').is_file(); \
		[render.ENVIRONMENT.get_template(t) for t in render.ENVIRONMENT.list_templates()]"
	rm -rf $(IMAGE_SMOKE)

# --- the release's packages: what `pip install` of a release gets ----------------------------
# The sdist and the wheel built into dist/ (the wheel from the sdist, so the sdist must be
# whole), checked as a package index would (twine check --strict: the metadata, and the README
# rendering as the project's description), then tests/package: what each archive holds, and the
# wheel installed with its dependencies into a throwaway virtualenv under build/ and run there
# (`receiver --version`, then `receiver init` and `receiver migrate` on a fresh SQLite inbox).
.PHONY: package
# build and twine live in a venv of their own: twine brings rich, which structlog would then load
# in every process of the suite (a tenth of a second each) though no user's install has it.
PACKAGE_TOOLS := build/package-tools
$(PACKAGE_TOOLS)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PACKAGE_TOOLS)
	$(PACKAGE_TOOLS)/bin/pip install --quiet 'build>=1.2' 'twine>=6.1'
	touch $@

package: $(VENV)/.installed-dev $(PACKAGE_TOOLS)/.installed  ## sdist and wheel built, checked with twine check --strict, the wheel installed in a clean venv and run
	rm -rf dist
	$(PACKAGE_TOOLS)/bin/python -m build --quiet --outdir dist .
	$(PACKAGE_TOOLS)/bin/twine check --strict dist/*
	$(BIN)/python -m tests.package --dist dist --work build/package-check --python $(PYTHON)

# --- the container image, built and run for real --------------------------------------------
# No Docker engine or registry is needed: the base is Debian's own python3 (debootstrap, made
# once and kept as $(IMAGE_BASE)), podman builds deploy/docker/Dockerfile on it (--format docker
# keeps the HEALTHCHECK), and tests/image runs the result with buildah. Elsewhere a plain
# `docker build -f deploy/docker/Dockerfile .` uses the official slim Python image instead.
IMAGE ?= localhost/receiver
# (the build stage is tagged $(IMAGE)-build so that pruning old images keeps its cache)
# The base's tag follows its recipe, so a changed recipe builds a new one.
IMAGE_BASE ?= localhost/receiver-python-base:$(shell sha256sum deploy/docker/debian-base.sh | cut -c1-12)
IMAGE_EXTRAS ?= postgres,otel
IMAGE_COMMANDS := podman:podman buildah:buildah debootstrap:debootstrap
# The image's OCI labels: the release (receiver/__init__.py), the commit it is built from, and
# SOURCE_URL, where its source lives (e.g. `make image SOURCE_URL=https://...`; else "unknown").
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' receiver/__init__.py)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# Read once: a commit made while the image builds must not change it.
REVISION := $(REVISION)
SOURCE_URL ?=
# The labels also as --label: podman reuses a cached LABEL step when only a build argument it
# reads changed, which would leave the previous build's revision on the image.
IMAGE_LABELS = --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
	$(if $(SOURCE_URL),--build-arg SOURCE_URL=$(SOURCE_URL)) \
	--label org.opencontainers.image.version=$(VERSION) \
	--label org.opencontainers.image.revision=$(REVISION) \
	$(if $(SOURCE_URL),--label org.opencontainers.image.source=$(SOURCE_URL))

.PHONY: image-tools image image-test
image-tools:  ## podman, buildah and debootstrap, from Debian, only when missing
	$(call apt-install-missing,$(IMAGE_COMMANDS))

image: image-tools  ## build $(IMAGE) from Debian packages only, and print its size
	@$(SUDO) podman image exists $(IMAGE_BASE) || { \
		echo "building the base image $(IMAGE_BASE) with debootstrap (a few minutes, once)"; \
		$(SUDO) deploy/docker/debian-base.sh $(IMAGE_BASE); }
	@started=$$(date +%s); \
	for target in "--target build -t $(IMAGE)-build" "-t $(IMAGE) $(IMAGE_LABELS)"; do \
		$(SUDO) podman build --isolation chroot --network host --format docker \
			--build-arg PYTHON_IMAGE=$(IMAGE_BASE) --build-arg EXTRAS=$(IMAGE_EXTRAS) \
			-f deploy/docker/Dockerfile $$target . || exit 1; \
	done \
	&& $(SUDO) podman image prune --force >/dev/null \
	&& $(SUDO) podman image inspect --format '{{.Size}}' $(IMAGE) $(IMAGE_BASE) | { \
		read -r image; read -r base; \
		echo "$(IMAGE): $$((image / 1000000)) MB ($$(((image - base) / 1000000)) MB on the" \
			"$$((base / 1000000)) MB base), built in $$(( $$(date +%s) - started )) s"; }

image-test: image $(VENV)/.installed-dev  ## run the image: SQLite, then two containers on Postgres
	$(SUDO) env RECEIVER_REQUIRE_SERVICES="$$RECEIVER_REQUIRE_SERVICES" \
		$(BIN)/python -m tests.image --image $(IMAGE) --revision $(REVISION)

# --- Postgres: the store contract, outages, migrations and three replicas on one inbox --------
.PHONY: test-postgres
test-postgres: $(VENV)/.installed-dev  ## the Postgres tests alone (PostgreSQL on 127.0.0.1:5432)
	RECEIVER_REQUIRE_SERVICES=1 $(BIN)/pytest -q -k postgres \
		tests/integration/test_store_contract_*.py tests/integration/test_pull_store.py
	RECEIVER_REQUIRE_SERVICES=1 $(BIN)/pytest -q tests/integration/test_migrate_cli.py \
		tests/integration/test_postgres_store_*.py tests/integration/test_postgres_outage.py \
		tests/integration/test_postgres_replicas.py tests/integration/test_pull_replicas.py \
		tests/upgrade/test_rolling_upgrade.py

# --- Benchmarks and the long fuzz run (bench/; never part of `make test`) ---------------------
# Each benchmark measures its baselines in the same run and prints ratios; BENCH_ARGS passes
# options through (e.g. `make bench-ingest BENCH_ARGS="--rounds 5 --loop asyncio"`).
.PHONY: bench bench-ingest bench-scale bench-e2e bench-soak bench-lanes bench-web bench-redeliver bench-tools fuzz
.PHONY: bench-steps bench-waits bench-profile bench-tracing
.PHONY: fuzz-webhook test-durability
BENCH_ARGS ?=
FUZZ_EXAMPLES ?= 100000
WEBHOOK_EXAMPLES ?= 2000

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,uvloop]'
	touch $(VENV)/.installed $(VENV)/.installed-dev $@

bench-tools:  ## wrk and gcc (for bench-ingest's slow-disk shim), from the distribution, only when missing
	@command -v wrk >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1 || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update && $$sudo apt-get install -y wrk gcc; }

bench-ingest: $(VENV)/.installed-bench bench-tools  ## intake on SQLite and Postgres vs a bare handler, per-request commits, the least inbox on each database and storing nothing; SQLite and per-request commits on a disk adding 2 ms a sync
	$(BIN)/python -m bench.ingest $(BENCH_ARGS)

bench-tracing: $(VENV)/.installed-bench bench-tools  ## intake on SQLite with tracing on (sample_ratio 1.0, spans exported) vs off
	$(BIN)/python -m bench.ingest --targets bare,sqlite,sqlite-traced $(BENCH_ARGS)

bench-steps: $(VENV)/.installed-bench  ## intake's steps one by one and its whole handler, CPU time per webhook
	$(BIN)/python -m bench.ingest.steps $(BENCH_ARGS)

bench-waits: $(VENV)/.installed-bench bench-tools  ## a webhook's time at 64 connections on SQLite: handler, wait for its group, the group's write, answer; group sizes
	$(BIN)/python -m bench.ingest.waits $(BENCH_ARGS)

bench-profile: $(VENV)/.installed-bench bench-tools  ## py-spy on the receiver storing nothing under wrk: what is below Intake._handle
	$(BIN)/pip install --quiet py-spy
	$(BIN)/python -m bench.ingest.profile $(BENCH_ARGS)

bench-scale: $(VENV)/.installed-bench bench-tools  ## intake with 1M events stored vs empty (SQLite, Postgres); drain 100k
	$(BIN)/python -m bench.scale $(BENCH_ARGS)

.PHONY: bench-sqlite-layouts
bench-sqlite-layouts: $(VENV)/.installed-bench  ## intake's transaction outside the receiver, empty vs 1M stored, for SQLite layouts (deliveries by arrival, no job index, 2 KiB pages, a file or tables of their own a day)
	$(BIN)/python -m bench.scale.sqlite_layouts $(BENCH_ARGS)

bench-e2e: $(VENV)/.installed-bench  ## events/s against a 100 ms upstream vs the concurrency bound
	$(BIN)/python -m bench.e2e $(BENCH_ARGS)

bench-soak: $(VENV)/.installed-bench  ## an hour of steady webhooks with 2 min of retention: file size, RSS and fds level off (SQLite, Postgres)
	$(BIN)/python -m bench.soak $(BENCH_ARGS)

bench-lanes: $(VENV)/.installed-bench  ## fast sinks beside a paced and a hanging sink, vs alone
	$(BIN)/python -m bench.lanes $(BENCH_ARGS)

bench-web: $(VENV)/.installed-dev  ## inbox page timings with 1,000,000 events in SQLite
	$(BIN)/python -m bench.web_pages $(BENCH_ARGS)

bench-redeliver: $(VENV)/.installed-bench bench-tools  ## a redelivery batch over 1,000,000 dead deliveries, SQLite and Postgres: time to queue, intake meanwhile, the lane's rate
	$(BIN)/python -m bench.redeliver $(BENCH_ARGS)

.PHONY: bench-store-copy
bench-store-copy: $(VENV)/.installed-bench  ## `receiver store copy` of 1,000,000 SQLite events into Postgres: events/s, peak memory vs a tenth of them
	$(BIN)/python -m bench.store_copy $(BENCH_ARGS)

.PHONY: bench-upstream-validation
bench-upstream-validation: $(VENV)/.installed-bench  ## the CPU a fetched object's check costs, as a share of enrichment (a job and 2 assets fetched from a stub)
	$(BIN)/python -m bench.upstream_validation $(BENCH_ARGS)

bench: bench-ingest bench-scale bench-e2e bench-lanes bench-web  ## every benchmark

fuzz: $(VENV)/.installed-dev  ## the webhook fuzz test, FUZZ_EXAMPLES requests (default 100000)
	RECEIVER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest tests/hostile/test_fuzz_webhook.py \
		-q -s -p no:cacheprovider -o timeout=0

DURABILITY_RUNS ?= 20
test-durability: $(VENV)/.installed-dev  ## kill -9 of a SQLite receiver while commands run beside it, DURABILITY_RUNS times (default 20)
	@$(COMPILE)
	RECEIVER_DURABILITY_RUNS=$(DURABILITY_RUNS) $(BIN)/pytest -q -p no:cacheprovider \
		tests/faults/test_commands_beside_serve.py

fuzz-webhook: $(VENV)/.installed-dev  ## signed bodies of any JSON, WEBHOOK_EXAMPLES random ones per inbox backend (default 2000)
	RECEIVER_HYPOTHESIS_EXAMPLES=$(WEBHOOK_EXAMPLES) $(BIN)/pytest \
		tests/hostile/test_property_webhook.py -q -p no:cacheprovider -o timeout=0 \
		--hypothesis-show-statistics
