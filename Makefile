# moetune developer targets. `make test` is what CI runs (CPU only, Triton interpreter).
PYTHON ?= python3

.PHONY: install test test-gpu test-engines lint bench help
# test-engines: the engines' released files go here (git ignores it); ENGINE_WHEELS is an
# optional folder of wheels already downloaded (else pip downloads them into $(ENGINES_DIR)/wheels).
ENGINES_DIR ?= .engines
ENGINE_WHEELS ?=

help:
	@echo "make install   install moetune with the kernel, test, ray and report extras (editable)"
	@echo "make test      CPU test suite (kernels under TRITON_INTERPRET=1); what CI runs"
	@echo "make test-gpu  the same tests on a CUDA GPU, plus the GPU-only ones"
	@echo "make test-engines  fetch vLLM/SGLang's released files (no deps) and test against them"
	@echo "make lint      ruff check + ruff format --check + the import layers (lint-imports)"
	@echo "make bench     kernel benchmark on a GPU (writes bench/results/, never overwrites)"

install:
	$(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e ".[kernel,transformers,test,ray,report]"

test:
	TRITON_INTERPRET=1 $(PYTHON) -m pytest -q

# The GPU targets stop at once, in one line, where torch sees no CUDA GPU.
HAS_GPU = $(shell $(PYTHON) -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
NEED_GPU = $(if $(filter 1,$(HAS_GPU)),,$(error make $@: no CUDA GPU visible (torch.cuda.is_available() is not True); $(1)))

test-gpu:
	$(call NEED_GPU,make test runs the CPU suite)
	TRITON_INTERPRET=0 MOETUNE_GPU_TESTS=1 $(PYTHON) -m pytest -q

test-engines:
	$(PYTHON) scripts/fetch_engines.py --dest $(ENGINES_DIR) $(if $(ENGINE_WHEELS),--wheels $(ENGINE_WHEELS))
	MOETUNE_ENGINES_SITE=$(abspath $(ENGINES_DIR))/site TRITON_INTERPRET=1 $(PYTHON) -m pytest -q -m engines tests/engines_real

lint:
	$(PYTHON) -m ruff check moetune tests bench scripts
	$(PYTHON) -m ruff format --check moetune tests bench scripts
	lint-imports

bench:
	$(call NEED_GPU,TRITON_INTERPRET=1 $(PYTHON) bench/kernel.py --quick runs the tiny shape on the CPU)
	$(PYTHON) bench/kernel.py
