# Quick start: `make run` (set up, then the whole pipeline on the embedded broker)
# and `make test` (set up, then lint, layer contracts, types and every test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DURATION ?= 120
GPUS ?= 8
# pytest-xdist processes for make test (TEST_WORKERS=0: serial); each module runs in one of them, in the order
# collected (integration first), so that module-scoped brokers and workers start once.  Four on two cores: 273 s
# against 326 s with three (the suite waits on group joins and paced fleets part of the time)
TEST_WORKERS ?= 4

.PHONY: setup run test lint bench clean

setup: $(STAMP)
	@sh scripts/ensure-prometheus.sh  # prometheus and promtool for the rule tests (Debian's package)
	@sh scripts/ensure-kubectl.sh $(BIN)  # kubectl (kustomize v5) for the Kubernetes manifest tests

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned, so that pip takes the CPU build (docs/ARCHITECTURE.md, "Measured pitfalls")
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
	@# tests/integration/test_web_bind.py makes a network namespace (ip netns): iproute2, and root
	@command -v ip >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq iproute2) >/dev/null 2>&1 || \
		{ echo "make test: iproute2 (the ip command) is missing and cannot be installed here: apt-get install iproute2, as root" >&2; exit 1; }
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=15

bench: setup
	$(BIN)/aip bench all --quick

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
