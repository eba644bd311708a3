# Quick start: `make run` (set up, then the whole pipeline on the embedded broker)
# and `make test` (set up, then lint, layer contracts, types and every test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DURATION ?= 120
GPUS ?= 8

.PHONY: setup run test lint bench clean

setup: $(STAMP)
	@sh scripts/ensure-prometheus.sh  # prometheus and promtool for the rule tests (Debian's package)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned, so that pip takes the CPU build (see DESIGN.md pitfalls)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[producer,stream,embedded,dev]'
	touch $(STAMP)

run: setup
	$(BIN)/aip up --duration $(DURATION) --gpus $(GPUS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy events config

test: lint
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/aip bench all --quick

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
