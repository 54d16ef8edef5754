# The verbs of the project (STYLE convention 12). Everything installs into .venv in the repo,
# so `make test` and `make run` work on a fresh machine with only python3 (>= 3.11).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test check lint typecheck bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Serves the gateway on 127.0.0.1:8000 in front of UPSTREAM_BASE_URL (see README).
HOST ?= 127.0.0.1
PORT ?= 8000
run: $(STAMP)
	$(BIN)/toolforge serve --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check app tools tests bench
	$(BIN)/ruff format --check app tools tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

bench: $(STAMP)
	$(BIN)/python -m bench.parse
	$(BIN)/python -m bench.gateway
	$(BIN)/python -m bench.tools

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
