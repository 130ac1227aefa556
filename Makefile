# Two commands set everything up on a fresh machine: `make serve` and `make test` (lint, types, tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

MODEL ?= ViT-SO400M-14-SigLIP-384
WEIGHTS ?= --pretrained webli
BACKEND ?= cpu
HOST ?= 127.0.0.1
PORT ?= 8000
METRICS_PORT ?= 8080
REPLICAS ?= 1
PYTEST_ARGS ?=
# pytest-xdist workers; 0 runs the suite in one process. tests/session_order.py says how the suite is split.
TEST_WORKERS ?= 2

.PHONY: install serve lint test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/siglip-serve run --backend $(BACKEND) --model $(MODEL) $(if $(filter tiny-siglip,$(MODEL)),,$(WEIGHTS)) \
		--replicas $(REPLICAS) --host $(HOST) --port $(PORT) --metrics-port $(METRICS_PORT)

# Lint, import cycles, layers and types first (seconds), then the suite (minutes). Settings: pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python tools/import_cycles.py src/siglip_serve
	$(BIN)/python tools/layers.py src/siglip_serve
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/siglip-serve bench --model ViT-B-16-SigLIP --random-weights --json bench-vit-b16.json

clean:
	rm -rf $(VENV) .pytest_cache
