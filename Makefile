# Two entry points (see README): `make demo` and `make test`. Both set up a local virtualenv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

# Re-install only when the package metadata changes. torch stays pinned to 2.13.0, the CPU build
# these machines carry locally, whenever an extra pulls it in.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,comms,ray,megatron,sim]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/orchestrl demo

test: setup
	$(PY) -m pytest

# Every benchmark in bench/, each in a fresh interpreter; the first that fails stops the run.
bench: setup
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
