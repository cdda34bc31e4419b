# Conveyor: `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: help install system-packages dev test test-all lint format bench bench-flow bench-scale clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/$$(PORT)/$(PORT)/g' \
	  | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# what running needs (make dev), then the test tools on top (make install, make test)
$(VENV)/.installed-run: pyproject.toml services/conveyor_cli.py  # the script module is copied in at install
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.installed-run
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed ## create .venv and install Conveyor with its test tools

# promtool, Chromium, PgBouncer, node/npm, PostgreSQL, RabbitMQ: installed with apt-get when
# missing and run as root; otherwise one line naming what to install (.ci/system-packages)
system-packages: ## install the system packages the tests need (as root, with apt-get)
	@.ci/system-packages

PORT ?= 8000

dev: $(VENV)/.installed-run ## run API + publisher + worker + maintenance on http://127.0.0.1:$(PORT) (example app; PORT=8001 to move it)
	$(VENV)/bin/conveyor dev --app examples.app:router --port $(PORT)

# pytest-xdist: worker processes, and every test of a module with a module-scoped fixture (a
# private RabbitMQ node / PostgreSQL cluster) on one of them. PYTEST_ARGS=-n0 runs serially;
# PYTEST_ARGS='-n0 -x tests/unit' or any other pytest arguments replace these.
PYTEST_WORKERS ?= 4
PYTEST_ARGS ?= -n $(PYTEST_WORKERS) --dist loadgroup

test: install system-packages ## lint, type-check and run the whole test suite (PYTEST_ARGS=-n0: serially)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

test-all: install system-packages ## the test suite plus the long fault soaks
	$(VENV)/bin/pytest -q -m "soak or not soak"

lint: install ## ruff and mypy --strict
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install ## apply ruff's formatting and fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install ## benchmark against Celery, with the 10-million-row batch step (QUICK=1: ~1 minute, no backfill)
	$(PIP) install -q -e '.[test,bench]'
	$(PY) -m bench.run $(if $(QUICK),--quick,--with-backfill)

bench-flow: install ## admission: throughput, hot and cold keys, fairness, rates, others' cost, ordered keys (QUICK=1: ~5 minutes; the table goes into bench/README.md)
	$(PIP) install -q -e '.[test,bench]'
	$(PY) -m bench.flow $(if $(QUICK),--quick) --readme

bench-scale: install ## the database at 10 million jobs: duties' idle passes, plans, gauges, batch rate vs empty, retention of 5M rows (ROWS=…; 23 min on a fast machine, ~35 on a slow one)
	$(PY) -m bench.scale --rows $(or $(ROWS),10000000)

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
