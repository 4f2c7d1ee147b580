# Sundial developer commands. `make help` lists them; every target's `## ` comment is its help line.

SHELL := /bin/bash
.DEFAULT_GOAL := help
# uv: the one on PATH if there is one, else Sundial's private copy in .tools/uv (see `python-deps`).
UV_HOME := $(CURDIR)/.tools/uv
export PATH := $(PATH):$(UV_HOME)/bin

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends

.PHONY: help deps python-deps test-deps run up down status test test-unit lint typecheck clean bench chaos release \
	docs docs-serve docs-reference

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: python-deps ## Install what is missing (Debian packages of the servers and wrk, uv, Python dependencies); idempotent
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v etcd >/dev/null || missing="$$missing etcd-server"; \
	command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v wrk >/dev/null || missing="$$missing wrk"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && $(APT_INSTALL) $$missing >/dev/null; \
	fi

# uv goes into a virtualenv of its own under .tools/uv (pip from PyPI, nothing in the system Python);
# Debian's python3 needs python3-venv for that: 6 small packages (~4 MiB), no compilers.
python-deps: ## Install uv (if missing) and the Python dependencies into .venv; all that lint/typecheck/test-unit need
	@if ! command -v uv >/dev/null; then \
		echo "installing uv into .tools/uv"; \
		rm -rf "$(UV_HOME)"; \
		python3 -m venv "$(UV_HOME)" >/dev/null 2>&1 || { \
			rm -rf "$(UV_HOME)"; \
			$(SUDO) apt-get update -qq && $(APT_INSTALL) python3-venv >/dev/null && \
			python3 -m venv "$(UV_HOME)"; \
		} && \
		"$(UV_HOME)/bin/pip" install -q --disable-pip-version-check uv; \
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

# The browser suite (tests/console) drives Debian's chromium through Playwright; a server running Sundial needs no
# browser, so only the tests install it (Playwright's own browser download is not used).
test-deps: deps ## Install what only the tests need: chromium (the console's browser suite), jq and nodejs (the gateway workers' conformance suite); idempotent
	@command -v chromium >/dev/null || { \
		echo "installing Debian package: chromium (the console's browser tests)"; \
		$(SUDO) apt-get update -qq && $(APT_INSTALL) chromium >/dev/null; \
	}
	@missing=""; \
	command -v jq >/dev/null || missing="$$missing jq"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing (the example gateway workers of tests/conformance)"; \
		$(SUDO) apt-get update -qq && $(APT_INSTALL) $$missing >/dev/null; \
	fi

test: deps test-deps ## Run the whole test suite against real servers it starts on its own ports (three lanes at once; slowest 15 of each)
	@bash tests/lanes.sh $(PYTEST_ARGS)

test-unit: python-deps ## Run the unit tests only (no servers)
	uv run --frozen pytest tests/unit

lint: python-deps ## ruff lint and format check
	uv run --frozen ruff check . && uv run --frozen ruff format --check .

typecheck: python-deps ## mypy (strict) on libs, services, infra, bench and tests
	uv run --frozen mypy libs/common/sundial_common libs/client/sundial_client services/*/sundial_* infra/sundial_infra bench tests

release: python-deps ## Cut a release: VERSION=x.y.z versions, CHANGELOG, tag, wheels test-installed (DRY_RUN=1: build only)
	@DRY_RUN=$(DRY_RUN) bash infra/scripts/release.sh $(VERSION)

clean: ## Stop everything (dev stack, servers of killed test and bench runs) and delete .sundial/: all Sundial data
	@if [ -x .venv/bin/sundial ]; then \
		.venv/bin/sundial dev clean; \
	else \
		$(call kill_pid_files,$$(find .sundial -name '*.pid' ! -name postmaster.pid 2>/dev/null)); \
		rm -rf .sundial; \
	fi

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

# The rolling upgrade runs here at full size (SUNDIAL_ROLLING_UPGRADE=full: several cron jobs, hundreds of one-shots,
# two replicas of each kind); `make test` runs its small stream. SUNDIAL_FAULT_MATRIX=1: the fault tests' full matrix
# (the gateway killed at each instant of a call, three times each).
chaos: deps ## Run the fault tests (real processes, one fault at a time; the full matrix) and the full-size rolling upgrade; print what each cost
	@SUNDIAL_ROLLING_UPGRADE=full SUNDIAL_FAULT_MATRIX=1 uv run --frozen pytest tests/faults tests/e2e/test_rolling_upgrade.py -q $(PYTEST_ARGS); \
	status=$$?; uv run --frozen python -m tests.faults.recovery; exit $$status

bench: deps ## Benchmark: stack on its own ports, workloads W1-W4 + raw ceilings, then the ClickHouse replica and the console's pages; appends to bench/results/<workload>.jsonl (python -m bench --help)
	uv run --frozen python -m bench $(BENCH_ARGS)
	uv run --frozen python -m bench analytics
	uv run --frozen python -m bench console

docs: python-deps ## Build the documentation site into site/ (mkdocs, strict: a broken link or a missing page fails)
	uv run --frozen mkdocs build --strict

docs-serve: python-deps ## Serve the documentation site on http://127.0.0.1:8000, rebuilt as you edit
	uv run --frozen mkdocs serve --dev-addr 127.0.0.1:8000

docs-reference: python-deps ## Regenerate the reference pages (HTTP API, CLI, configuration, metrics) from the code
	uv run --frozen python -m docs_gen
