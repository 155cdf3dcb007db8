# The two commands of the README. Each does its own set-up (scripts/setup.sh is idempotent).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test demo lint clean

setup:
	bash scripts/setup.sh

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/opus-testbed demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean: setup
	$(VENV)/bin/opus-testbed clean
