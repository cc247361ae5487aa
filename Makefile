# FStream: `make demo` and `make test` do all set-up on a fresh machine (no root needed).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Snakemake has a venv of its own: its dependencies may clash with apache-airflow's in $(VENV).
# tests/test_pipeline_snakemake.py runs $(SNAKEMAKE_VENV)/bin/snakemake with $(VENV)/bin on PATH.
SNAKEMAKE_VENV  ?= $(VENV)-snakemake
SNAKEMAKE_SPEC  ?= snakemake>=8,<10
SNAKEMAKE_STAMP := $(SNAKEMAKE_VENV)/.installed-stamp

.PHONY: demo test test-servers install bench-deps bench clean lint goals-check

# The native data path (native/, Rust via setuptools-rust; issue 29) is built by cargo from rustup's usual place
# when it is not on PATH already. Without cargo the package installs without it (same digests, one more read).
export PATH := $(PATH):$(HOME)/.cargo/bin

$(STAMP): setup.cfg setup.py pyproject.toml native/Cargo.toml native/Cargo.lock native/src/lib.rs
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -e '.[all]'
	touch $(STAMP)

$(SNAKEMAKE_STAMP):
	test -x $(SNAKEMAKE_VENV)/bin/python || $(PYTHON) -m venv $(SNAKEMAKE_VENV)
	$(SNAKEMAKE_VENV)/bin/pip install -q '$(SNAKEMAKE_SPEC)'
	touch $(SNAKEMAKE_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fstream demo

# The whole suite on the embedded default (the bundled Valkey 9), then the bus's tests once more on each other
# supported server present (Redis 6.2, 7.0: test-servers). With PYTEST_ARGS only what they name runs.
test: $(STAMP) $(SNAKEMAKE_STAMP) lint goals-check
	FSTREAM_SNAKEMAKE=$(SNAKEMAKE_VENV)/bin/snakemake bash .ci/pytest.sh $(PYTEST_ARGS)
	@if [ -z "$(PYTEST_ARGS)" ]; then bash .ci/servers.sh; fi

test-servers: $(STAMP)
	bash .ci/servers.sh

# The rooms' allowed arrows (.importlinter, docs/architecture.md): CI fails on a broken contract.
lint: $(STAMP)
	$(VENV)/bin/lint-imports

# BENCHMARKS.md's goals table is what the committed results and today's code say (reads files, runs no benchmark).
goals-check: $(STAMP)
	$(VENV)/bin/fstream bench report --check

# Tools only the benchmarks and the WAN testbed need (root: Debian packages).
bench-deps:
	bash bench/install-deps.sh

bench: $(STAMP)
	$(VENV)/bin/fstream bench report

clean:
	rm -rf $(VENV) $(SNAKEMAKE_VENV) build *.egg-info .pytest_cache native/target transfer_agent/storage/_blake3tree*.so
