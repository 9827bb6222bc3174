# Two entry points: `make run` (the main job) and `make ci` (lint + every CPU test).
# Both create .venv on first use and install everything the project needs into it.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a machine without a GPU the CPU build of torch is installed first, so that nothing
# afterwards resolves `torch` to a multi-GB CUDA wheel. Override for other machines.
TORCH_CPU_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: run ci lint test compile-check install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if $(BIN)/python -c "import torch" 2>/dev/null; then echo "torch already installed"; \
	elif nvidia-smi -L >/dev/null 2>&1; then echo "GPU present: torch comes from the package index"; \
	else echo "no GPU: installing $(TORCH_CPU_SPEC) (CPU build)"; $(BIN)/python -m pip install -q "$(TORCH_CPU_SPEC)"; fi
	$(BIN)/python -m pip install -q -e ".[dev,gsm8k]"
	touch $@

run: $(STAMP)
	$(BIN)/nopebench run

lint: $(STAMP)
	$(BIN)/ruff check nopebench tests

compile-check: $(STAMP)
	$(BIN)/nopebench build --compile-only

test: $(STAMP)
	$(BIN)/python -m pytest -q

ci: lint compile-check test

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
