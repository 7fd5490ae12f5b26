# Two commands for a newcomer: `make run` and `make test`. Both create .venv on first use.
# `make test-fast` runs only the fast tier (tests/unit: in memory, no nats-server, no ONNX).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast check bench install clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/memgate up $(ARGS)

test: check
	$(BIN)/python -m pytest $(ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -m unit $(ARGS)

check: $(STAMP)
	$(BIN)/ruff check memgate tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m bench.latency $(ARGS)

.PHONY: load
load: $(STAMP)  # the load benchmark (bench/load.py); ARGS=--quick for a short check
	$(BIN)/python -m bench.load $(ARGS)

clean:
	rm -rf $(VENV) .memgate .pytest_cache
