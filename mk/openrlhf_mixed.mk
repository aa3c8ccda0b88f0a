# A verl job and an OpenRLHF job at the same time on one coordinator (docs/openrlhf.md, "A
# verl job beside an OpenRLHF job"). verl's driver runs from .venv-verl, the OpenRLHF job
# from .venv-openrlhf (its Ray workers through the job's py_executable), one Ray cluster.
# A file of its own: the venv stamps depend on mk/openrlhf.mk and mk/verl.mk.
.PHONY: integration-mixed real-ab-mixed

# The jigsaw policy's grants carried out by both hosts, engines released mid-rollout,
# every sample trained once (integration_tests/test_mixed_hosts.py): 10-20 minutes here.
integration-mixed: venv-verl venv-openrlhf
	nice -n 10 $(VENV_VERL)/bin/python -m pytest -q -p no:cacheprovider integration_tests/test_mixed_hosts.py

# The same pair, jigsaw against static halves (verl-sync) on a pool of 2, the simulator's
# prediction beside; writes docs/benchmarks.md's real-ab-mixed block. 20-40 minutes a repeat.
REAL_AB_MIXED_REPEATS ?= 1
real-ab-mixed: venv-verl venv-openrlhf
	nice -n 10 $(VENV_VERL)/bin/python benchmarks/real_ab_mixed.py --repeats $(REAL_AB_MIXED_REPEATS)
