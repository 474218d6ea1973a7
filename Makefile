# Heliotrope. `make demo` and `make test` are all a fresh clone needs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
EXTRAS ?= dev,torch,airflow,aws,gcp,entsoe,azure,k8s
PYTEST_ARGS ?=
GRIDSTATUS_DEPS := beautifulsoup4 frozendict lxml openpyxl pdfplumber plotly tabulate termcolor tqdm xlrd

.PHONY: setup demo test lint bench e2e airflow clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	# gridstatus (extra `grid`) pins pandas~=2.2 but runs, and its tests pass, on the pandas
	# we use: installed without its pins, with the libraries it imports.
	$(PY) -m pip install --quiet --no-deps 'gridstatus==0.37.0'
	$(PY) -m pip install --quiet $(GRIDSTATUS_DEPS)
	@rm -f $(VENV)/.installed-* && touch $@

demo: setup
	$(BIN)/heliotrope demo --home out/demo

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

PY_DIRS := orchestrator providers policies tests dags examples infra

lint: setup
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: setup
	$(BIN)/pytest tests/benchmarks -m bench -s -p no:cacheprovider $(PYTEST_ARGS)

e2e: setup
	$(BIN)/pytest -m slow $(PYTEST_ARGS)

# Airflow standalone on http://127.0.0.1:8080 with the DAGs in dags/ (AIRFLOW_HOME=./airflow_home).
airflow: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" bash infra/airflow/standalone.sh

clean:
	rm -rf $(VENV) out replay-out .mypy_cache .ruff_cache .pytest_cache
