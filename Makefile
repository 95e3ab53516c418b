# Two entry points (see README): `make demo` and `make test`. Both create .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup sysdeps demo demo-transport test test-python-engine sanitize lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the CPU build of torch that these machines carry; an unpinned torch pulls CUDA
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,testbed,switch,sim]'
	touch $(STAMP)

setup: $(STAMP) sysdeps

# Namespace tests and benchmarks need iproute2, procps (sysctl), nftables, ethtool and
# ping; the Mininet backend needs mnexec (Debian mininet). As root with apt (CI, a fresh
# Debian), install what is missing; otherwise those tests skip.
sysdeps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  for t in ip:iproute2 sysctl:procps nft:nftables ethtool:ethtool ping:iputils-ping; do \
	    command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; \
	  done; \
	  if [ -n "$$missing" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  fi; \
	  if ! command -v mnexec >/dev/null; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mininet; } \
	      || echo "mininet not installed: the Mininet backend tests will skip"; \
	  fi; \
	fi

# the main job: 4 local ranks train the digits CNN over DLCP (1% emulated loss,
# p = 0.05), then over Gloo; per-epoch figures, JSON and a PNG plot in results/
demo: setup
	$(BIN)/dlcp train-demo --results results

# the transport alone: two sessions over an emulated lossy multipath link
demo-transport: setup
	$(BIN)/dlcp demo

lint: setup
	$(BIN)/ruff check dlcp shims testbed tests bench examples
	$(BIN)/mypy dlcp

test: lint
	$(BIN)/pytest -q
	$(MAKE) test-python-engine sanitize

# The tests of what sends data (endpoint, engines, collectives, process group, training)
# once more on the Python engine; the whole suite above ran on the native one where built
ENGINE_TESTS := tests/integration/test_endpoint.py tests/integration/test_engines.py \
	tests/integration/test_halving.py tests/integration/test_ps_dedicated.py \
	tests/integration/test_collective_failures.py tests/integration/test_process_group.py \
	tests/integration/test_training.py
test-python-engine: setup
	DLCP_ENGINE=python $(BIN)/pytest -q $(ENGINE_TESTS)

# The native engine built with AddressSanitizer and UBSan (any finding aborts), loaded in
# place of the normal build (DLCP_ENGINE_BUILD), under its own tests and the endpoint's
SANITIZED := build/sanitize/_engine.so
sanitize: setup
	mkdir -p $(dir $(SANITIZED))
	$(CC) -shared -fPIC -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
	  -fno-sanitize-recover=all -Wall -Wextra -Wno-missing-field-initializers \
	  -Wno-cast-function-type \
	  -I"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	  dlcp/io/_engine.c -o $(SANITIZED) -lpthread
	DLCP_ENGINE=native DLCP_ENGINE_BUILD=$(abspath $(SANITIZED)) \
	  LD_PRELOAD="$$($(CC) -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 \
	  $(BIN)/pytest -q tests/unit/test_engine_send.py tests/unit/test_engine_pacer.py \
	  tests/integration/test_engines.py tests/integration/test_endpoint.py \
	  tests/integration/test_halving.py

bench: setup
	$(BIN)/python -m bench.core --json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build
