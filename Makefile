# Two commands do all the set-up on a fresh machine with Python 3.10+:
#   make demo   migrate, enqueue, work, show the result (embedded PostgreSQL unless DATABASE_URL)
#   make test   ruff, mypy, the documentation site and the whole test suite against real PostgreSQL
#   make docs   build the documentation site (mkdocs build --strict) into site/
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck docs pytest bench bench-quick clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded,prometheus,async-example,dashboard,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two processes halve the suite's wall time on a 2-core machine (its tests wait on
# worker processes and PostgreSQL as much as they compute). PYTEST_ARGS= runs serially.
PYTEST_ARGS ?= -n 2 --dist loadfile

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# Strict: a broken link, a page missing from the nav or an unresolved reference fails
# (not --quiet: it hides the warnings, and then strict mode has none to count).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: lint typecheck docs pytest

$(VENV)/.bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded,prometheus,async-example,dashboard,docs,bench]'
	touch $(VENV)/.bench

bench: $(VENV)/.bench
	$(BIN)/python benchmarks/run.py

bench-quick: $(VENV)/.bench
	$(BIN)/python benchmarks/run.py --quick

clean:
	rm -rf $(VENV) .pgdata .mypy_cache .ruff_cache .pytest_cache site
