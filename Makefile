# Two commands do all set-up on a fresh machine:
#   make run    -> virtual env with the base install, then the default simulator sweep
#   make test   -> virtual env with every extra (torch CPU, transformers, server, Ray, docs), then the
#                  lint (ruff), the architecture contracts (import-linter), the documentation site
#                  (mkdocs --strict: a broken link fails) and the tests
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --quiet --disable-pip-version-check
ARGS   ?=

.PHONY: run test bench clean

$(PY):
	python3 -m venv $(VENV)

$(VENV)/.base: pyproject.toml | $(PY)
	$(PIP) install -e .
	touch $@

$(VENV)/.all: pyproject.toml | $(PY)
	$(PIP) install -e '.[hf,serve,ray,test,docs]'
	touch $@ $(VENV)/.base

run: $(VENV)/.base
	$(VENV)/bin/batchlab run $(ARGS)

test: $(VENV)/.all
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict   # not --quiet: it hides the warnings --strict counts
	$(PY) -m pytest -q $(ARGS)

bench: $(VENV)/.all
	$(PY) benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) results .data
