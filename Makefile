# Sundial developer commands. `make help` lists them; every target's `## ` comment is its help line.

SHELL := /bin/bash
.DEFAULT_GOAL := help
# `pip install --user uv` (non-root) puts uv here.
export PATH := $(HOME)/.local/bin:$(PATH)

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help deps run up down status test test-unit lint typecheck clean bench

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## Install what is missing (Debian packages, uv, Python dependencies); quiet and idempotent
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v etcd >/dev/null || missing="$$missing etcd-server"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@if ! command -v uv >/dev/null; then \
		echo "installing uv"; \
		python3 -m pip install -q uv 2>/dev/null || python3 -m pip install -q --user uv 2>/dev/null || { \
			DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-pip >/dev/null && \
			python3 -m pip install -q --break-system-packages uv; }; \
	fi
	@uv sync --frozen --quiet

run: deps ## Start everything in the foreground (servers, migrations, api on :8080, workers); Ctrl-C stops it
	@uv run --frozen sundial dev up --foreground

up: deps ## Start everything in the background; returns once the API answers /readyz
	@uv run --frozen sundial dev up

down: ## Stop everything `make up`/`make run` started (works even before `make deps`)
	@if [ -x .venv/bin/sundial ]; then \
		.venv/bin/sundial dev down; \
	else \
		$(call kill_pid_files,.sundial/run/*.pid .sundial/*/*.pid); \
	fi

status: ## Show what runs, with pids, URLs and logs
	@if [ -x .venv/bin/sundial ]; then .venv/bin/sundial dev status; else echo "not installed yet: run make deps"; fi

# Two xdist workers, one per core, each with a stack of its own (ports SUNDIAL_TEST_PORT_OFFSET + 100 × worker):
# `loadgroup` runs the tests that start Sundial's processes (e2e, faults) one after another on one worker while
# the other takes integration and unit tests (tests/conftest.py). --durations shows growth in every CI log.
TEST_WORKERS ?= 2
PYTEST_ARGS ?=

test: deps ## Run the whole test suite against real servers it starts on its own ports (2 workers; slowest 15 listed)
	uv run --frozen pytest -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

test-unit: ## Run the unit tests only (no servers)
	uv run --frozen pytest tests/unit

lint: ## ruff lint and format check
	uv run --frozen ruff check . && uv run --frozen ruff format --check .

typecheck: ## mypy (strict) on libs, services and infra
	uv run --frozen mypy libs/common/sundial_common services/*/sundial_* infra/sundial_infra

clean: down ## Stop everything, including servers a crashed test run left, and delete .sundial/
	@$(call kill_pid_files,.sundial/test/*/*.pid .sundial/test-*/*/*.pid)
	rm -rf .sundial

# SIGTERM (Postgres and Tansu: SIGINT, their quick clean stop) every pid in the given pid files, wait up
# to 15 s, then SIGKILL their process groups.
# Used when Python is not available yet (no .venv) and for leftovers of killed test sessions.
define kill_pid_files
	pids=""; for f in $(1); do \
		[ -f "$$f" ] || continue; p=$$(cat "$$f"); \
		sig=TERM; case "$$f" in */postgres.pid|*/broker.pid) sig=INT;; esac; \
		if [ -n "$$p" ] && kill -0 "$$p" 2>/dev/null; then kill -$$sig "$$p" 2>/dev/null; pids="$$pids $$p"; fi; \
		rm -f "$$f"; \
	done; \
	for i in $$(seq 150); do \
		alive=""; for p in $$pids; do kill -0 "$$p" 2>/dev/null && alive="$$alive $$p"; done; \
		[ -z "$$alive" ] && break; sleep 0.1; \
	done; \
	for p in $$alive; do kill -KILL -- "-$$p" 2>/dev/null || kill -KILL "$$p" 2>/dev/null; done; true
endef

bench: deps ## Benchmark: stack on its own ports, workloads W1-W4 + raw ceilings; appends to bench/results/<date>.jsonl
	uv run --frozen python bench/harness.py $(BENCH_ARGS)
