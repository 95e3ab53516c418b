# Two entry points (see README): `make demo` and `make test`. Both create .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the CPU build of torch that these machines carry; an unpinned torch pulls CUDA
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/dlcp demo

lint: setup
	$(BIN)/ruff check dlcp shims testbed tests bench
	$(BIN)/mypy dlcp

test: lint
	$(BIN)/pytest -q

bench: setup
	$(BIN)/python -m bench.core --json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
