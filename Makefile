# Two commands set everything up on a fresh machine: `make serve` and `make test` (lint, types, tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The interpreter's version picks the lock: requirements/{runtime,dev}-py3.X.txt (tools/lock.sh writes them).
PY_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
LOCK_RUNTIME := requirements/runtime-py$(PY_VERSION).txt
LOCK_DEV := requirements/dev-py$(PY_VERSION).txt
STAMP := $(VENV)/.installed-dev
RUNTIME_STAMP := $(VENV)/.installed-runtime
# Exactly the lock, hash-checked, nothing resolved on the day; then our package on top, editable.
PIP_LOCKED := -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r
PIP_OURS := -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .

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

.PHONY: install install-runtime serve lint test test-latest lock bench clean

$(VENV)/bin/python:
	@test -f $(LOCK_DEV) || { echo "no lock for Python $(PY_VERSION): requirements/ has $$(ls requirements)"; exit 2; }
	$(PYTHON) -m venv $(VENV)

# The runtime set (serve, embed, bulk); `make test` adds the dev set (the suite, lint, docs, load tests, plots).
$(RUNTIME_STAMP): pyproject.toml $(LOCK_RUNTIME) | $(VENV)/bin/python
	$(BIN)/python $(PIP_LOCKED) $(LOCK_RUNTIME)
	$(BIN)/python $(PIP_OURS)
	$(BIN)/python -m pip check --disable-pip-version-check
	touch $@

# The suite's S3 stand-in, moto's server, lives in a venv of its own (requirements/moto-server.in says why).
$(STAMP): pyproject.toml $(LOCK_DEV) requirements/moto-server-py$(PY_VERSION).txt | $(VENV)/bin/python
	$(BIN)/python $(PIP_LOCKED) $(LOCK_DEV)
	$(BIN)/python $(PIP_OURS)
	$(BIN)/python -m pip check --disable-pip-version-check
	test -x $(VENV)-moto/bin/python || $(PYTHON) -m venv $(VENV)-moto
	$(VENV)-moto/bin/python $(PIP_LOCKED) requirements/moto-server-py$(PY_VERSION).txt
	touch $@ $(RUNTIME_STAMP)

install: $(STAMP)

install-runtime: $(RUNTIME_STAMP)

# After editing pyproject.toml's dependencies; `make lock ARGS='--upgrade-package httpx'` upgrades one.
lock: $(STAMP)
	tools/lock.sh $(ARGS)

# The canary: the newest versions the ranges allow, in a scratch venv, through the whole suite; it names
# every distribution that differs from the lock first (tools/test_latest.sh).
test-latest: $(STAMP)
	tools/test_latest.sh $(PYTEST_ARGS)

serve: $(RUNTIME_STAMP)
	$(BIN)/siglip-serve run --backend $(BACKEND) --model $(MODEL) $(if $(filter tiny-siglip,$(MODEL)),,$(WEIGHTS)) \
		--replicas $(REPLICAS) --host $(HOST) --port $(PORT) --metrics-port $(METRICS_PORT)

# Lint, import cycles, layers and types first (seconds), then the suite (minutes). Settings: pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python tools/import_cycles.py src/siglip_serve
	$(BIN)/python tools/layers.py src/siglip_serve
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site

test: lint
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/siglip-serve bench --model ViT-B-16-SigLIP --random-weights --json bench-vit-b16.json

clean:
	rm -rf $(VENV) $(VENV)-moto $(VENV)-latest .pytest_cache
