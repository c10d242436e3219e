# Quick start:  make demo   (set up .venv, build the demo pack, answer a question)
#               make test   (run the test suite)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

# torch first and by exact version: the CPU build is found locally, and installing it
# before the rest stops the resolver from choosing a newer CUDA build.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c requirements.lock -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(BIN)/kpack build demo
	$(BIN)/kpack query demo "How does a build publish a new version of a pack?"

# pytest exits 5 when it collects no test; that is not a failure of the suite.
test: setup
	$(BIN)/python -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; else exit $$rc; fi

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python bench/build_bench.py

clean:
	rm -rf .dagster_home .kpack_storage packs/*/.versions packs/*/pack.db packs/*/manifest.json packs/*/skill.md
