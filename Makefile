# Quick start:  make demo   (set up .venv, build the demo pack, answer a question)
#               make test   (run the test suite)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo notebook test test-services lint bench clean

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

# Re-run docs/notebook.ipynb against the demo pack, storing its outputs, and export it to
# docs/notebook.md so a reader sees the results without running it.
notebook: setup
	$(BIN)/kpack build demo
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace docs/notebook.ipynb
	$(BIN)/jupyter nbconvert --to markdown docs/notebook.ipynb
	# The demo pack's pages are files of this checkout: a reader sees the project's place,
	# not this machine's folders.
	sed -i 's|file://$(CURDIR)/|file:///path/to/knowledge-packs/|g' docs/notebook.ipynb docs/notebook.md

# tests/test_celery.py runs a build on Celery workers with Debian's redis-server as broker
# (started by the test itself); installed here when missing (CI runs as root). Without it that
# test is skipped, and nothing else needs it: `make demo` never does.
test-services:
	@command -v redis-server >/dev/null || \
		(apt-get update -q && apt-get install -y -q redis-server) >/dev/null || \
		echo "redis-server could not be installed: tests/test_celery.py will be skipped"

# pytest exits 5 when it collects no test; that is not a failure of the suite.
test: setup test-services
	$(BIN)/python -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; else exit $$rc; fi

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python bench/build_bench.py

clean:
	rm -rf .dagster_home .kpack_storage packs/*/.versions packs/*/pack.db packs/*/manifest.json packs/*/skill.md
