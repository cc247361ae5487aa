# FStream: `make demo` and `make test` do all set-up on a fresh machine (no root needed).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test install bench-deps bench clean lint

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -e '.[all]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fstream demo

test: $(STAMP) lint
	bash .ci/pytest.sh $(PYTEST_ARGS)

# The rooms' allowed arrows (.importlinter, docs/architecture.md): CI fails on a broken contract.
lint: $(STAMP)
	$(VENV)/bin/lint-imports

# Tools only the benchmarks and the WAN testbed need (root: Debian packages).
bench-deps:
	bash bench/install-deps.sh

bench: $(STAMP)
	$(VENV)/bin/fstream bench report

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
