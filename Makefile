# paws_tf: every target runs inside a virtualenv built from requirements.txt.
# VENV can point at a shared environment: `make test VENV=/path/to/venv`.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements-stamp
PYTEST_ARGS ?=

.PHONY: venv test test-fast demo clean

venv: $(STAMP)

# The venv is (re)built whenever requirements.txt is newer than the stamp.
$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# Everything except the runs marked slow (multi-worker, end-to-end).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo:
	@echo "make demo: the Fashion-MNIST demo is not built yet (issue 6)."
	@exit 1

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
