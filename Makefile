# The README's two commands: `make run` (the demo) and `make test` (the tests).
# Both create the virtualenv and install everything on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test lint install clean bench

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is pinned to the CPU wheel on local disk; install it first so nothing pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	# CPU environment: onnxruntime (never together with onnxruntime-gpu).
	$(BIN)/pip install -q -e '.[cpu,train,dev]'
	# the native HTTP front (Rust, built offline from Debian's crates; apt-installs them):
	# served with --front native; where it cannot build, uvicorn's front serves
	bash native/build.sh $(BIN)/python || echo "native front not built: --front native falls back to uvicorn"
	# the beam search's compiled step (C on the numpy C API; gcc from apt where missing):
	# where it cannot build, the search steps in numpy
	bash native/beam/build.sh $(BIN)/python || echo "beam kernel not built: the beam search steps in numpy"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/seqserve demo

test: $(STAMP)
	# system tools the deploy tests use (promtool, prometheus); no-op when present
	bash deploy/install-test-tools.sh
	$(BIN)/ruff check seqserve bench deploy tests examples native
	$(BIN)/mypy
	# two workers, each test file on one (its module fixtures: one server), client venvs made
	# in the background meanwhile (tests/client_venvs.py)
	$(BIN)/python -m pytest -q -ra --durations=30 -n 2 --dist loadfile tests

lint: $(STAMP)
	$(BIN)/ruff check seqserve bench deploy tests examples native
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs data model_repository work
