# paws_tf: every target runs inside a virtualenv built from requirements.txt
# (the runtime); the test targets add requirements-test.txt (pytest, PyTorch).
# VENV can point at a shared environment: `make test VENV=/path/to/venv`.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements-stamp
TEST_STAMP := $(VENV)/.requirements-test-stamp
PYTEST_ARGS ?=
# Test processes (pytest-xdist): most of a test's time is single-threaded
# (tracing, process start-up), so two processes fill 2 cores better than
# one. 0 runs them in this process. A process
# that runs out of tests takes half of the other's remaining ones
# (worksteal); tests/conftest.py puts the long `slow` ones first and gives
# each process its share of the cores for TensorFlow's thread pools.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist worksteal

.PHONY: venv check test test-long test-fast demo demo-quick fashion-mnist \
	clean

venv: $(STAMP)

# The venv is (re)built whenever requirements.txt is newer than the stamp,
# and the package re-installed when pyproject.toml is (its packages, package
# data and the paws-tf entry point are installed from it).
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

$(TEST_STAMP): $(STAMP) requirements-test.txt
	$(PY) -m pip install --quiet -r requirements-test.txt
	touch $@

# README's install check: a tiny ResNet on 4 synthetic classes, 128 steps.
CHECK_DIR ?= /tmp/paws_debug

check: $(STAMP)
	$(PY) run.py --gin_file=gin_configs/debug.gin --model_dir=$(CHECK_DIR) \
	  --mode=train_and_evaluate

# Every test but the `long` ones: the runs end to end through run.py and on
# two-process clusters, which test-long runs (CI runs both).
test: $(TEST_STAMP)
	$(PY) -m pytest $(XDIST) -m "not long" $(PYTEST_ARGS)

test-long: $(TEST_STAMP)
	$(PY) -m pytest $(XDIST) -m long $(PYTEST_ARGS)

# Everything except the tests marked slow (those of over ~5 s).
test-fast: $(TEST_STAMP)
	$(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The demo reads Debian's Fashion-MNIST IDX files; when they are missing it
# installs the package if apt can, else the run falls back to TFDS.
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
DEMO_DIR ?= runs/demo
DEMO_QUICK_DIR ?= runs/demo-quick

fashion-mnist:
	@test -f $(FASHION_MNIST) || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -qq dataset-fashion-mnist >/dev/null || \
	      { apt-get update -qq && \
	        apt-get install -y -qq dataset-fashion-mnist >/dev/null; }; \
	  else \
	    echo "Fashion-MNIST IDX files not found and apt unavailable:" \
	         "the demo will use TFDS fashion_mnist (downloads it)."; \
	  fi; }

demo: $(STAMP) fashion-mnist
	$(PY) run.py --gin_file=gin_configs/demo_fashion_mnist.gin \
	  --model_dir=$(DEMO_DIR) --mode=demo

demo-quick: $(STAMP) fashion-mnist
	$(PY) run.py --gin_file=gin_configs/demo_fashion_mnist_quick.gin \
	  --model_dir=$(DEMO_QUICK_DIR) --mode=demo
	@echo "demo-quick results: $(DEMO_QUICK_DIR)/results.json"

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
