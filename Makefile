# Two entry points (see README): `make demo` and `make test`. Both create .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup sysdeps demo demo-transport test lint bench clean

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

bench: setup
	$(BIN)/python -m bench.core --json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
