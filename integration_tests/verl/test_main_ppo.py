"""The real command line without ``VERL_PLATFORM=cpu``: the error a user then sees.

verl's ``main_ppo`` parses the flag and the ``+jigsaw.*`` options with Hydra, starts Ray and
its ``TaskRunnerV1`` actor; inside it, verl's ``get_trainer_cls`` returns the jigsaw trainer
and builds it (``main_ppo.py:141-152``). Without ``VERL_PLATFORM=cpu`` verl's platform falls
back to ``nvidia``, and on this CPU-only machine ``trainer.init()`` would stop at verl's pool
check ("Total available GPUs 0 is less than total desired GPUs 1", ``single_controller/ray/base.py:240``),
which does not say what to do. The jigsaw trainer's ``init`` checks first and names the fix.
The run that sets it, to the end: ``test_main_ppo_cpu.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def dataset(tiny_model, tmp_path_factory):
    """verl's RL dataset format (parquet: prompt messages, data_source, reward_model) and a
    word-level tokenizer saved beside the tiny model (verl loads one from the model path)."""
    import pandas as pd
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(2000)} | {"<pad>": 2000, "<eos>": 2001, "<unk>": 2002}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(tiny_model)
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    pd.DataFrame([{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"w{i} w{i + 1}"}],
                   "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"},
                   "extra_info": {"index": i}} for i in range(8)]).to_parquet(path)
    return str(path)


def test_main_ppo_without_verl_platform_builds_the_jigsaw_trainer_then_names_the_fix(tiny_model, dataset, tmp_path):
    args = [
        "trainer.v1.trainer_mode=jigsaw", "+jigsaw.pipeline=cpu-run", "+jigsaw.policy=observe",
        "algorithm.adv_estimator=grpo", f"data.train_files={dataset}", f"data.val_files={dataset}",
        "data.train_batch_size=2", "data.max_prompt_length=32", "data.max_response_length=16",
        f"actor_rollout_ref.model.path={tiny_model}", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.logger=[console]",
        "trainer.val_before_train=false", "+ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.object_store_memory=200000000",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS") and k != "VERL_PLATFORM"}
    out = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], capture_output=True, text=True,
                         timeout=420, cwd=tmp_path, env=env)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    # built by verl's own get_trainer_cls inside its TaskRunner actor (the line is printed there)
    assert "jigsaw-plugin (verl): trainer_mode=jigsaw -> JigsawTrainerSync (verl 0.9.1), pipeline 'cpu-run'" in log
    assert ("VERL_PLATFORM: got '(unset)'; allowed: cpu to run verl on CPUs: this Ray cluster has no GPU, so "
            "verl's platform fell back to 'nvidia' (set VERL_PLATFORM=cpu") in log
    assert "Total available GPUs 0" not in log  # stopped before verl's own, less helpful, check
