"""Test data of the OpenRLHF integration tests, all built locally (no download).

* ``build_model_with_tokenizer(path)``: the project's tiny random Qwen2 (vocab 2048) plus a
  byte-level BPE tokenizer of exactly 2048 entries (id 0 = ``<|endoftext|>``, EOS and pad),
  so OpenRLHF's ``get_tokenizer`` and vLLM's detokenizer both work on it.
* ``write_prompts(path, n)``: a JSONL prompt dataset (``input`` / ``label`` keys).
* ``write_reward_func(path)``: a ``reward_func(queries, prompts, labels)`` file, the form
  OpenRLHF loads through ``--reward.remote_url <file>.py`` (reward computed per sample
  inside generation, ``utils/agent.py``), rewarding responses that contain the label word.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from jigsaw_plugin.runtime.tiny_model import TINY_QWEN2, build_tiny_qwen2

WORDS = ["alpha", "beta", "gamma", "delta", "one", "two", "three", "four", "red", "green", "blue", "say"]


def _train_tokenizer():
    """A byte-level BPE of exactly 2048 entries (id 0 = ``<|endoftext|>``), trained on random
    words. transformers 5 loads a ``qwen2`` folder's tokenizer as ``Qwen2Tokenizer`` (a
    byte-level BPE) whatever the tokenizer file says, so the tokenizer must be one."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    corpus = [" ".join(WORDS + ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
                                for _ in range(50)]) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_QWEN2["vocab_size"], special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() == TINY_QWEN2["vocab_size"], tok.get_vocab_size()
    return tok


def build_model_with_tokenizer(path, seed: int = 0) -> Path:
    """A copy of ``build_tiny_qwen2`` in ``path`` with a tokenizer beside it (reused if present)."""
    path = Path(path)
    if (path / "tokenizer.json").is_file():
        return path
    src = build_tiny_qwen2(path.parent / f".tiny-qwen2-seed{seed}", seed=seed)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)

    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=_train_tokenizer(), eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(tmp)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg.update(eos_token_id=0, pad_token_id=0, bos_token_id=0)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def write_prompts(path, n: int) -> Path:
    path = Path(path)
    with open(path, "w") as f:
        for i in range(n):
            label = WORDS[i % 4]
            prompt = f"say {label} {WORDS[4 + i % 4]} {WORDS[8 + i % 3]}"
            f.write(json.dumps({"input": prompt, "label": label}) + "\n")
    return path


REWARD_FUNC = '''
import torch


def reward_func(queries, prompts, labels):
    """1.0 when the response (query minus prompt) contains the label word, else 0.0."""
    rewards = []
    for query, prompt, label in zip(queries, prompts, labels):
        response = query[len(prompt):] if query.startswith(prompt) else query
        rewards.append(1.0 if label in response.split() else 0.0)
    rewards = torch.tensor(rewards)
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
'''


def write_reward_func(path) -> Path:
    path = Path(path)
    path.write_text(REWARD_FUNC)
    return path
