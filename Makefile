# Two entry points (see README): `make demo` and `make test`. Both create .venv.
#   make demo  installs only what the main job needs: torch and DLCP's base install
#              (numpy, scapy, scikit-learn, matplotlib); no extras, no system packages.
#   make test  adds every extra the tests use (dev, testbed, switch, sim) and, as root
#              with apt-get, the Debian tools the namespace testbed needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# pip prints what it collects and installs, with progress bars on a terminal
PIP    := $(BIN)/pip install --progress-bar on --disable-pip-version-check
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test

.PHONY: setup setup-demo sysdeps demo demo-transport test test-quick test-python-engine \
	sanitize fuzz lint bench clean

$(BIN)/python:
	@echo "==> [1/3] creating $(VENV)"
	$(PYTHON) -m venv $(VENV)

# the CPU build of torch that these machines carry; an unpinned torch pulls CUDA
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "==> [2/3] installing torch==2.13.0 (the largest step)"
	$(PIP) torch==2.13.0
	@echo "==> [3/3] installing DLCP and the main job's dependencies (numpy, scapy, scikit-learn, matplotlib)"
	$(PIP) -e .
	touch $@

# the extras the tests use: dev (pytest, ruff, mypy), testbed (Mininet's Python API),
# switch (P4Runtime client), sim (ns-3, ~480 MB)
$(TEST_STAMP): $(DEMO_STAMP)
	@echo "==> installing the test extras: dev, testbed, switch, sim (ns-3 is ~480 MB: a few minutes)"
	$(PIP) -e '.[dev,testbed,switch,sim]'
	touch $@

setup-demo: $(DEMO_STAMP)

setup: $(TEST_STAMP) sysdeps

# Namespace tests and benchmarks need iproute2, procps (sysctl), nftables, ethtool and
# ping; the Mininet backend needs mnexec (Debian mininet, without its recommended Open
# vSwitch: the backend runs hosts as routers, and nothing here enables a service). As
# root with apt (CI, a fresh Debian), install what is missing; otherwise those tests skip.
sysdeps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  for t in ip:iproute2 sysctl:procps nft:nftables ethtool:ethtool ping:iputils-ping; do \
	    command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; \
	  done; \
	  if [ -n "$$missing" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends $$missing; \
	  fi; \
	  if ! command -v mnexec >/dev/null; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	        apt-get install -y -qq --no-install-recommends mininet; } \
	      || echo "mininet not installed: the Mininet backend tests will skip"; \
	  fi; \
	fi

# the main job: 4 local ranks train the digits CNN over DLCP (1% emulated loss,
# p = 0.05), then over Gloo; per-epoch figures, JSON and a PNG plot in results/
demo: $(DEMO_STAMP)
	$(BIN)/dlcp train-demo --results results

# the transport alone: two sessions over an emulated lossy multipath link
demo-transport: $(DEMO_STAMP)
	$(BIN)/dlcp demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# The in-process tests on TEST_WORKERS pytest-xdist workers (they leave a core idle
# between their subprocesses); those marked integration (multi-rank jobs, whose timing
# a second worker's load would stretch) one at a time
TEST_WORKERS ?= 2
test: lint
	$(BIN)/pytest -q --durations=25 -m "not integration" -n $(TEST_WORKERS)
	$(BIN)/pytest -q --durations=25 -m integration
	$(MAKE) test-python-engine sanitize test-no-extensions

# The quick tests (tests/README.md): the package folders' in-process tests, without those
# marked integration (whole endpoints, processes or programs on loopback)
QUICK_TESTS := tests/proto tests/io tests/collectives tests/shims tests/bench tests/launch \
	tests/cli tests/tree
test-quick: $(TEST_STAMP)
	$(BIN)/pytest -q -m "not integration" $(QUICK_TESTS)

# The tests of what sends data (endpoint, engines, collectives, process group, training)
# once more on the Python engine; the whole suite above ran on the native one where built
ENGINE_TESTS := tests/io/test_endpoint.py tests/io/test_engines.py tests/io/test_endpoint_accumulate.py \
	tests/collectives/test_halving.py tests/collectives/test_ps_dedicated.py \
	tests/collectives/test_collective_failures.py tests/shims/test_process_group.py \
	tests/training/test_training.py
test-python-engine: setup
	DLCP_ENGINE=python $(BIN)/pytest -q $(ENGINE_TESTS)

# The package as a machine without a C compiler builds and installs it (CC=false: every
# extension of setup.py is optional), in a folder of its own, and the tests of what
# sends data run against that install (tests/tree/test_no_extensions.py checks that no
# extension is there and that the Python engine runs and says so). The wheel is built from
# a copy of the sources without the extensions an editable install built in place; the
# tests run from a copy of tests/ so that the source tree is not imported instead.
NOEXT := build/no-extensions
NOEXT_TESTS := tests/tree/test_no_extensions.py tests/io/test_endpoint.py \
	tests/io/test_engines.py tests/collectives/test_halving.py
test-no-extensions: setup
	rm -rf $(NOEXT) && mkdir -p $(NOEXT)/src $(NOEXT)/run
	tar -c --exclude='*.so' --exclude=__pycache__ pyproject.toml setup.py README.md \
	  dlcp shims testbed | tar -x -C $(NOEXT)/src
	cd $(NOEXT)/src && CC=false LDSHARED=false $(abspath $(BIN))/pip wheel -q --no-deps \
	  --no-build-isolation -w ../wheel .
	$(BIN)/pip install -q --no-deps --target $(NOEXT)/site $(NOEXT)/wheel/dlcp-*.whl
	cp -r tests pyproject.toml $(NOEXT)/run/
	cd $(NOEXT)/run && EXPECT_NO_EXTENSIONS=1 PYTHONPATH=$(abspath $(NOEXT)/site) \
	  $(abspath $(BIN))/pytest -q -p no:cacheprovider $(NOEXT_TESTS)

# The native engine and the UDP receive loop (the native receive path) built with
# AddressSanitizer and UBSan (any finding aborts), loaded in place of the normal builds
# (DLCP_ENGINE_BUILD, DLCP_UDPIO_BUILD, DLCP_KERNELS_BUILD), under their own tests and
# the endpoint's (the engine's own tests run 1, 2 and 4 send threads; the endpoint's run
# again on 2: DLCP_ENGINE_THREADS); with libcrypto (sealing, rule 8; the receive loop's
# tag checks) when the normal build has it
SANITIZED := build/sanitize/_engine.so
SANITIZED_UDPIO := build/sanitize/_udpio.so
SANITIZED_KERNELS := build/sanitize/_kernels.so
SANITIZE_FLAGS := -shared -fPIC -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
	-fno-sanitize-recover=all -Wall -Wextra -Wno-missing-field-initializers \
	-Wno-cast-function-type
sanitize: setup
	@if ! $(CC) -print-file-name=libasan.so | grep -q /; then \
	  echo "sanitize: skipped ($(CC) has no AddressSanitizer runtime)"; exit 0; fi; \
	mkdir -p $(dir $(SANITIZED)) && \
	crypto="$$($(BIN)/python -c 'from dlcp.io.engine import native_seals; \
	  print("-DDLCP_LIBCRYPTO -lcrypto" if native_seals() else "")')" && \
	include="$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" && \
	$(CC) $(SANITIZE_FLAGS) -I"$$include" dlcp/io/_engine.c -o $(SANITIZED) -lpthread $$crypto && \
	$(CC) $(SANITIZE_FLAGS) -I"$$include" dlcp/io/_udpio.c -o $(SANITIZED_UDPIO) -lpthread $$crypto && \
	$(CC) $(SANITIZE_FLAGS) -I"$$include" dlcp/proto/_kernels.c -o $(SANITIZED_KERNELS) && \
	export DLCP_ENGINE=native DLCP_ENGINE_BUILD=$(abspath $(SANITIZED)) \
	  DLCP_UDPIO_BUILD=$(abspath $(SANITIZED_UDPIO)) \
	  DLCP_KERNELS_BUILD=$(abspath $(SANITIZED_KERNELS)) \
	  LD_PRELOAD="$$($(CC) -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 && \
	  $(BIN)/pytest -q tests/io/test_engine_send.py tests/io/test_engine_pacer.py \
	  tests/proto/test_gmac.py tests/io/test_engines.py tests/io/test_endpoint.py \
	  tests/collectives/test_halving.py tests/io/test_native_receive.py tests/io/test_native_receive_auth.py \
	  tests/io/test_posted_receives.py tests/io/test_lent_send_failure.py tests/io/test_native_replay.py \
	  tests/io/test_udp_receive.py tests/io/test_prefilter.py tests/io/test_endpoint_accumulate.py \
	  tests/io/test_receive_linger.py tests/io/test_readiness.py tests/io/test_linger_rates.py \
	  tests/io/test_engine_finish.py tests/io/test_stops_in_waits.py tests/io/test_finishes_in_waits.py \
	  tests/io/test_control_tags_in_waits.py tests/proto/test_kernels.py \
	  tests/proto/test_packetizer.py tests/proto/test_lent_rounds.py tests/proto/test_receive_run.py \
	  tests/proto/test_accumulate.py && \
	DLCP_ENGINE_THREADS=2 $(BIN)/pytest -q tests/io/test_endpoint.py \
	  tests/collectives/test_halving.py

# libFuzzer targets of the compiled code that reads network input (tests/fuzz/: the
# receive kernels and the UDP receive loop), built with clang and ASan/UBSan, seeded from
# the golden vectors, FUZZ_SECONDS of fuzzing in all; fails on any crash or oracle
# mismatch. A long campaign: tests/security/README.md
FUZZ_SECONDS ?= 60
fuzz: $(DEMO_STAMP)
	$(BIN)/python tests/fuzz/run.py --seconds $(FUZZ_SECONDS)

bench: $(DEMO_STAMP)
	$(BIN)/python -m dlcp.bench.core --json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build
