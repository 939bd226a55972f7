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
	@echo "make lint      ruff check + ruff format --check"
	@echo "make bench     kernel benchmark on a GPU (writes bench/results/, never overwrites)"

install:
	$(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e ".[kernel,transformers,test,ray,report]"

test:
	TRITON_INTERPRET=1 $(PYTHON) -m pytest -q

test-gpu:
	TRITON_INTERPRET=0 MOETUNE_GPU_TESTS=1 $(PYTHON) -m pytest -q

test-engines:
	$(PYTHON) scripts/fetch_engines.py --dest $(ENGINES_DIR) $(if $(ENGINE_WHEELS),--wheels $(ENGINE_WHEELS))
	MOETUNE_ENGINES_SITE=$(abspath $(ENGINES_DIR))/site TRITON_INTERPRET=1 $(PYTHON) -m pytest -q -m engines tests/engines_real

lint:
	$(PYTHON) -m ruff check moetune tests bench scripts
	$(PYTHON) -m ruff format --check moetune tests bench scripts

bench:
	$(PYTHON) bench/kernel.py
