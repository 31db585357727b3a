# Set-up is automatic: every target creates .venv on first use and installs dlcc into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench
PYTEST_ARGS ?=

.PHONY: demo test test-quick bench lint clean fuzz

$(BIN)/python:
	$(PY) -c 'import sys; assert sys.version_info >= (3, 11), "dlcc needs Python 3.11+ (set PY=python3.11)"'
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# the torch extra (torch 2.13.0 CPU, onnxscript) so that the torch-marked tests run in CI too
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev,torch]'
	touch $@

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,torch,bench]'
	touch $@

demo: $(STAMP)
	$(BIN)/python -m dlcc.demo

# the >2 GB model test writes 2.25 GiB to disk: it runs in `make fuzz`, not in CI
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m "not large" $(PYTEST_ARGS)

test-quick: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m "not slow and not large" $(PYTEST_ARGS)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/optimizers.py
	$(BIN)/python bench/fusion.py
	$(BIN)/python bench/algebra.py
	$(BIN)/python bench/compiled.py

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) build demo-out .pytest_cache

fuzz: $(STAMP)
	$(BIN)/python bench/fuzz.py --n 10000 --graphs 10000
	$(BIN)/python -m pytest -q -m large tests/test_large_model.py
