# Two entry points: `make run` (the main job) and `make ci` (lint + every CPU test).
# Both create .venv on first use and install what the project needs on this machine into it.
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
TORCH_LOG := $(VENV)/torch-install.log
# torch's CPU build: from the configured sources, else from TORCH_CPU_INDEX, else one error line.
TORCH_CPU_INSTALL = \
	if $(BIN)/python -c "import torch" 2>/dev/null; then echo "torch already installed"; \
	elif $(PIP) install -q "$(TORCH_CPU_SPEC)" >$(TORCH_LOG) 2>&1; then \
	  echo "installed $(TORCH_CPU_SPEC) from the configured package sources"; \
	elif echo "$(TORCH_CPU_SPEC) is not in the configured package sources: trying $(TORCH_CPU_INDEX)" && \
	  $(PIP) install -q --timeout 30 --retries 2 --extra-index-url "$(TORCH_CPU_INDEX)" "$(TORCH_CPU_SPEC)" \
	    >>$(TORCH_LOG) 2>&1; then \
	  echo "installed $(TORCH_CPU_SPEC) from $(TORCH_CPU_INDEX)"; \
	else \
	  echo "error: cannot install $(TORCH_CPU_SPEC) (torch's CPU build) from the configured package sources or $(TORCH_CPU_INDEX); set TORCH_CPU_INDEX to an index that has it (pip's output: $(TORCH_LOG))" >&2; \
	  exit 1; \
	fi

.PHONY: run ci lint test compile-check install clean

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
	  $(TORCH_CPU_INSTALL); \
	  echo '$(PIP) install -q --no-deps "$(FLASHINFER_SPEC)" "$(LM_EVAL_SPEC)"'; \
	  $(PIP) install -q --no-deps "$(FLASHINFER_SPEC)" "$(LM_EVAL_SPEC)" && \
	  echo '$(PIP) install -q -e ".[dev,cpu]"' && \
	  $(PIP) install -q -e ".[dev,cpu]" 2> >(grep -vE "$(LEFT_OUT)" >&2); \
	fi
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
