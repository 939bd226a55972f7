# moetune developer targets. `make test` is what CI runs (CPU only, Triton interpreter).
PYTHON ?= python3

.PHONY: install test test-unit test-gpu test-engines fetch-engines lint bench help
# The engines' released files: one site folder per release mix under $(ENGINES_DIR) (git ignores
# it), each with SGLang's current release, so tests/engines_real runs once per vLLM release.
# ENGINE_WHEELS is an optional folder of wheels already downloaded (else pip downloads them into
# $(ENGINES_DIR)/wheels). Outside CI a release that cannot be had (offline) is one warning line and
# its site's tests skip; in CI (CI=true) it fails the run.
ENGINES_DIR ?= .engines
ENGINE_WHEELS ?=
ENGINE_SITES ?= vllm==0.33.0,sglang==0.5.23 vllm==0.34.0,sglang==0.5.23
# pytest-xdist workers: auto is one per CPU core. loadgroup: the tests marked with one
# xdist_group (those sharing an expensive module fixture) run on one worker; the others go one
# by one to the next free worker, those marked slow first (tests/conftest.py). The 15 slowest
# tests are listed at the end: the suite should stay under 8 minutes on CI's 2 cores.
TEST_WORKERS ?= auto

comma := ,
empty :=
space := $(empty) $(empty)
SITE_DIRS = $(foreach site,$(ENGINE_SITES),$(abspath $(ENGINES_DIR))/$(subst $(comma),+,$(subst ==,-,$(site))))
SITE_PATH = $(subst $(space),:,$(strip $(SITE_DIRS)))
FETCH_OPTIONAL = $(if $(filter true 1,$(CI)),,--optional)
PYTEST = TRITON_INTERPRET=1 MOETUNE_ENGINES_SITE=$(SITE_PATH) $(PYTHON) -m pytest -q -rs --durations=15 -n $(TEST_WORKERS) --dist loadgroup

help:
	@echo "make install   install moetune with the kernel, test, ray and report extras (editable)"
	@echo "make test      CPU test suite (kernels under TRITON_INTERPRET=1), the engines' releases included; what CI runs"
	@echo "make test-unit the same without fetching the engines' releases (their tests skip)"
	@echo "make test-gpu  the same tests on a CUDA GPU, plus the GPU-only ones"
	@echo "make test-engines  fetch vLLM/SGLang's released files (no deps) and run only tests/engines_real"
	@echo "make lint      ruff check + ruff format --check + the import layers (lint-imports)"
	@echo "make bench     kernel benchmark on a GPU (writes bench/results/, never overwrites)"

install:
	$(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e ".[kernel,transformers,test,ray,report]"

# One pytest run: the whole suite, tests/engines_real once per site, spread over the cores.
test: fetch-engines
	$(PYTEST)

test-unit:
	$(PYTEST) --ignore=tests/engines_real

fetch-engines:
	$(PYTHON) scripts/fetch_engines.py --dest $(ENGINES_DIR) $(FETCH_OPTIONAL) $(if $(ENGINE_WHEELS),--wheels $(ENGINE_WHEELS)) $(ENGINE_SITES)

# The GPU targets stop at once, in one line, where torch sees no CUDA GPU.
HAS_GPU = $(shell $(PYTHON) -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
NEED_GPU = $(if $(filter 1,$(HAS_GPU)),,$(error make $@: no CUDA GPU visible (torch.cuda.is_available() is not True); $(1)))

test-gpu:
	$(call NEED_GPU,make test runs the CPU suite)
	TRITON_INTERPRET=0 MOETUNE_GPU_TESTS=1 $(PYTHON) -m pytest -q

test-engines: fetch-engines
	$(PYTEST) tests/engines_real

lint:
	$(PYTHON) -m ruff check moetune tests bench scripts
	$(PYTHON) -m ruff format --check moetune tests bench scripts
	lint-imports

bench:
	$(call NEED_GPU,TRITON_INTERPRET=1 $(PYTHON) bench/kernel.py --quick runs the tiny shape on the CPU)
	$(PYTHON) bench/kernel.py
