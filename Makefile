# Two entry points (see README): `make demo` and `make test`. Both set up a local virtualenv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test bench clean gpu-check

setup: $(STAMP)

# Re-install only when the package metadata changes. torch stays pinned to 2.13.0, the CPU build
# these machines carry locally, whenever an extra pulls it in.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,comms,ray,megatron,sim,ocs,agentic]'
	touch $(STAMP)

# make demo PROTOCOL=netconf (or gnmi): the emulated switches speak that protocol and the proxy drives them with it.
PROTOCOL ?= tl1
demo: setup
	$(VENV)/bin/orchestrl demo --protocol $(PROTOCOL)

# Two workers, each test file on one of them (a file's module fixtures are built once): 13-15 min on
# 2 cores instead of 21. Debug one file with `$(PY) -m pytest FILE`, which runs without workers.
test: setup
	$(PY) -m pytest -n 2 --dist loadfile

# Every benchmark in bench/, each in a fresh interpreter; the first that fails stops the run.
bench: setup
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The checks that need a GPU (each skips with a message without one). On a GPU machine with PyTorch but no
# network, run it with the machine's own Python: make gpu-check GPU_PY=python3 GPU_OUT=DIR
GPU_PY  ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_OUT ?= out/gpu
gpu-check:
	mkdir -p $(GPU_OUT)
	-PYTHONPATH=$(CURDIR) timeout 120 $(GPU_PY) -m pytest -p no:cacheprovider -q -rs tests/collectives/test_colocated.py 2>&1 | tee $(GPU_OUT)/ipc.log
	-PYTHONPATH=$(CURDIR) timeout 240 $(GPU_PY) bench/gpu_step_check.py --out $(GPU_OUT)/step
	-PYTHONPATH=$(CURDIR) timeout 200 $(GPU_PY) bench/gpu_slowdown_profile.py --out $(GPU_OUT)/slowdown
	-PYTHONPATH=$(CURDIR) timeout 120 $(GPU_PY) bench/gpu_graph_groups.py --out $(GPU_OUT)/graph_groups

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
