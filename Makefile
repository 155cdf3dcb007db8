# The two commands of the README. Each does its own set-up (scripts/setup.sh is idempotent).
VENV := .venv
PY := $(VENV)/bin/python
# The docs site, built into a temporary directory (never into the repository): --strict makes a
# link or an anchor in docs/ that leads nowhere fail the build.
DOCS_BUILD := site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && \
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir "$$site"

.PHONY: setup test demo lint docs clean

setup:
	bash scripts/setup.sh

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(DOCS_BUILD)
	$(PY) -m pytest -q

docs: setup
	$(DOCS_BUILD)

demo: setup
	$(VENV)/bin/opus-testbed demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean: setup
	$(VENV)/bin/opus-testbed clean
