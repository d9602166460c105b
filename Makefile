# The only entry point people and CI use. Every target runs inside the uv workspace.
# `make run` and `make test` work on a fresh machine with Python 3.11: uv is bootstrapped
# into .atmosphere/tools when it is not on PATH.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .atmosphere/tools
UV := $(or $(shell command -v uv 2>/dev/null),$(TOOLS)/bin/uv)
VENV := .venv
RUN := $(UV) run --frozen --no-sync
# The adapters of the pinned environment (`envs/pinned`, synced into .venvs/pinned): their
# frameworks cannot be installed beside the main environment's, so they are checked and tested there.
PINNED := .venvs/pinned
PINNED_LIBS := libs/runtime-crewai libs/runtime-semantic-kernel libs/runtime-llamaindex
SOURCES := $(filter-out $(addsuffix /src,$(PINNED_LIBS)),$(wildcard libs/*/src)) services/*/src examples
PYTEST_ARGS ?=
RUN_ARGS ?=
# The commit whose proto/ must stay wire-compatible (`buf breaking`, rules in buf.yaml). Empty:
# HEAD while proto/ has uncommitted changes, else HEAD~1, so a fresh clone (.ci/run) checks the
# last commit. Set it to the previous landing to check several commits: BREAKING_BASE=<sha>.
BREAKING_BASE ?=

.PHONY: help install run test lint fmt typecheck proto proto-check pytest bench clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(TOOLS)/bin/uv:
	@echo "uv not found on PATH: installing uv $(UV_VERSION) into $(TOOLS)"
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

install: $(UV) ## Install the workspace into .venv, the pinned adapters' environment into .venvs/pinned, and bubblewrap
	$(UV) sync --all-packages --all-extras --frozen --python 3.11
	UV_PROJECT_ENVIRONMENT=$(CURDIR)/$(PINNED) $(UV) sync --frozen --python 3.11 --project envs/pinned
	@scripts/ensure_bubblewrap.sh
	@scripts/ensure_node_clients.sh
	@scripts/ensure_chromium.sh

# The pinned adapters' pools, when an app pins agents to them, run on their environment's interpreter.
POOL_PYTHONS := $(foreach runtime,crewai semantic-kernel llamaindex,--pool-python $(runtime)=$(PINNED)/bin/python)

run: install ## Run nats-server and all services with the example app (Ctrl-C stops all)
	$(VENV)/bin/atmosphere dev $(POOL_PYTHONS) $(RUN_ARGS)

# Three lanes at once (scripts/test_lanes.py), each one's wall time printed at the end: the
# suite on PYTEST_WORKERS workers (it prints as it goes), the static gates, and the dependency
# floors then the pinned adapters' tests, one after the other (a fourth lane beside them starved
# the suite's latency-bound tests on two cores); their output kept in .atmosphere/lanes/ and
# printed when all are done. Most of the
# suite waits on real processes and the broker rather than the CPU, so they share two cores
# well. The gates and the floors run niced: they only need to finish, while some of the suite's
# end-to-end tests bound how long a client waits (a resume storm, a chaos kill), so the suite
# comes first for the CPU. Any lane failing fails `make test`.
test: install ## Every gate: lint, types, contracts, the docs, the whole test suite, the dependency floors
	$(RUN) python scripts/test_lanes.py --live suite \
		suite '$(MAKE) --no-print-directory pytest' \
		gates 'nice -n 10 $(MAKE) --no-print-directory lint typecheck proto-check docs' \
		floors 'nice -n 10 $(MAKE) --no-print-directory test-lowest test-pinned PINNED_WORKERS=0'

lint: install ## ruff, buf lint/format, lock freshness, the namespace rule
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) buf lint
	$(RUN) buf format --diff --exit-code
	$(UV) lock --check
	$(UV) lock --check --project envs/pinned
	@if ls */*/src/atmosphere/__init__.py >/dev/null 2>&1; then \
		echo "a src/atmosphere/__init__.py breaks the atmosphere.* namespace"; exit 1; fi

fmt: install ## Format Python and protos
	$(RUN) ruff format .
	$(RUN) ruff check --fix .
	$(RUN) buf format -w

typecheck: install ## mypy --strict on every library, service and example
	$(RUN) mypy $(SOURCES)
	$(PINNED)/bin/mypy $(addsuffix /src,$(PINNED_LIBS))

proto: install ## Regenerate libs/contracts from proto/
	$(RUN) python scripts/gen_protos.py

proto-check: install ## Fail when libs/contracts is stale or proto/ breaks the wire of BREAKING_BASE
	$(RUN) python scripts/gen_protos.py --check
	$(RUN) python scripts/check_proto_breaking.py --against '$(BREAKING_BASE)'

.PHONY: docs
docs: install ## The documentation: docs/ built into site/ by MkDocs, strictly (a broken link fails it)
	$(RUN) mkdocs build --strict

# The suite on three pytest-xdist workers, whole files each (a file's shared stacks start once),
# the longest first (conftest.py; `--no-loadscope-reorder` keeps that order, where xdist would
# start the files with the most tests first and end on the long single-test ones): about 8
# minutes on two cores instead of 18. A test that bounds a latency in wall time is marked
# `alone` and runs with no other test beside it (conftest.py). PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 3
pytest: install ## The test suite (unit, contract, integration, end-to-end) on PYTEST_WORKERS workers
	$(RUN) pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The declared dependency floors, tested: every library and service installed at the lowest
# versions its pyproject allows (scripts/lowest_env.py; kept in .atmosphere/lowest and reused
# until a pyproject or uv.lock changes), then their unit, integration and contract tests run there
# (about 7 minutes beside the suite). Left out: the 3-node cluster tests (server behaviour, nearly a minute; the
# single-server contract tests cover the client's API), `buf breaking` (a check of proto/),
# the sandbox's bubblewrap tests (the kernel's, with the standard library only), and the runtime
# adapters (their frameworks need newer pydantic, starlette... than the platform's floors: they are
# not installed here, and their own floors are uv.lock's versions, which the suite tests).
LOWEST := .atmosphere/lowest
ADAPTER_TESTS := $(wildcard libs/runtime-*/tests/* libs/langchain-bridge/tests/*)
LOWEST_TESTS := $(filter-out $(ADAPTER_TESTS),$(wildcard libs/*/tests/unit libs/*/tests/integration)) libs/testing/tests \
    $(wildcard services/*/tests/unit services/*/tests/integration) tests/contract \
    --ignore=tests/contract/test_bus_replication.py --ignore=tests/contract/test_proto_breaking.py \
    --ignore=services/sandbox/tests/integration/code --ignore=libs/testing/tests/test_anthropic_wire.py \
    --ignore=libs/testing/tests/test_cohere_wire.py --ignore=libs/testing/tests/test_gemini_wire.py

# The pinned adapters (CrewAI, Semantic Kernel, LlamaIndex) in their own environment: their unit
# and contract tests, and what their distributions declare; their end-to-end tests run with the
# others' (tests/e2e/test_runtime_adapters.py starts their pools on this environment's interpreter).
# The root conftest leaves their paths out of every other run.
PINNED_TESTS := $(addsuffix /tests,$(PINNED_LIBS)) tests/test_distributions.py

PINNED_WORKERS ?= 2
.PHONY: test-pinned
test-pinned: install ## The pinned adapters' tests, in .venvs/pinned
	$(PINNED)/bin/python -m pytest -q -n $(PINNED_WORKERS) --dist loadfile $(PINNED_TESTS)

.PHONY: test-lowest
test-lowest: install ## The floors: unit, integration and contract tests with each dependency at its lowest declared version
	$(RUN) python scripts/lowest_env.py sync $(LOWEST) --uv $(UV)
	$(LOWEST)/bin/python scripts/lowest_env.py check
	$(LOWEST)/bin/python -m pytest -q $(LOWEST_TESTS)

bench: install ## Benchmarks with ratios against baselines measured in the same run
	$(RUN) python bench/bus_roundtrip.py
	$(RUN) python bench/dispatch_overhead.py
	$(RUN) python bench/runtime_adapters.py
	$(PINNED)/bin/python bench/runtime_adapters.py
	$(RUN) python bench/governance_overhead.py
	$(RUN) python bench/ingress_overhead.py
	$(RUN) python bench/run_cost.py
	$(RUN) python bench/ingress_flood.py

soak: install ## A 3-node NATS cluster, two replicas of every service, nodes and replicas SIGKILLed mid-run (minutes)
	$(RUN) pytest -q -s tests/soak --soak

# Keeps .venv and the bootstrapped uv (.atmosphere/tools): `make install` is not needed again.
CLEAN_PATHS := .atmosphere/data .atmosphere/nats .atmosphere/workspace dist .mypy_cache .ruff_cache .pytest_cache .hypothesis .schemathesis

clean: ## Remove local state (.atmosphere/data, nats, workspace), built wheels (dist) and tool caches
	rm -rf $(CLEAN_PATHS)
