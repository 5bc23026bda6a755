# Two commands do all set-up on a fresh machine:
#   make run    -> virtual env with the base install, then the default simulator sweep
#   make test   -> virtual env with every extra (torch CPU, transformers, server, Ray, docs), then the
#                  lint (ruff), the architecture contracts (import-linter), the documentation site
#                  (mkdocs --strict: a broken link fails) and the tests, spread over the cores
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --quiet --disable-pip-version-check
ARGS   ?=
# the tests run on up to four processes (pytest-xdist), one per core; TEST_WORKERS=0 runs them in this one.
# --dist loadfile keeps a module's tests in one process, so a module fixture is built once (loadgroup
# does nothing under pytest 9.2: xdist 3.8 marks a group by rewriting the node id, which pytest no
# longer reads, so every test went anywhere and each worker built the module fixtures it met)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

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
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

bench: $(VENV)/.all
	$(PY) benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) results .data
