# Two commands do all the set-up on a fresh machine with Python 3.10+:
#   make demo   migrate, enqueue, work, show the result (embedded PostgreSQL unless DATABASE_URL)
#   make test   ruff, mypy and the whole test suite against real PostgreSQL
#   make matrix a named subset on Python 3.10 and 3.13, PostgreSQL 16 and 18 and the
#               minimum SQLAlchemy/Alembic/psycopg (.ci/matrix.py; venvs in .matrix/)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test matrix lint typecheck pytest bench bench-quick clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded,prometheus,async-example,flask-example,dashboard]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

test: lint typecheck pytest

# Needs no venv of its own: the script is standard library only (Python 3.11+) and
# builds each cell's venv, and the servers', itself.
matrix:
	$(PYTHON) .ci/matrix.py

$(VENV)/.bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded,prometheus,async-example,flask-example,dashboard,bench]'
	touch $(VENV)/.bench

bench: $(VENV)/.bench
	$(BIN)/python benchmarks/run.py

bench-quick: $(VENV)/.bench
	$(BIN)/python benchmarks/run.py --quick

clean:
	rm -rf $(VENV) .matrix .pgdata .mypy_cache .ruff_cache .pytest_cache
