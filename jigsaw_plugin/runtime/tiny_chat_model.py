"""tiny-qwen2-chat: the tiny random Qwen2 with a real tokenizer, for hosts that tokenize.

verl tokenizes prompts with the model folder's tokenizer and applies its chat template, so
the tiny model of ``tiny_model.py`` (token ids only) is not enough there. This one adds:

- a byte-level BPE tokenizer: the 256 bytes (GPT-2's byte-to-unicode alphabet, id = byte
  value) and the three Qwen2 specials ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>``
  (eos): 259 tokens. Any text round-trips; ``\\n`` is one token (verl's Qwen token builder
  needs that, ``utils/tokenizer/continuous_token.py:555-559``). A word-level tokenizer does not
  work: transformers 5 rebuilds a ``Qwen2Tokenizer`` from ``model_type=qwen2`` and drops it;
- a ChatML chat template (Qwen2's form);
- a vocab equal to the tokenizer's length: verl masks the ids past ``len(tokenizer)`` in
  vLLM (``vllm_async_server.py:501``), and a larger vocab would make vLLM's sampling differ
  from the trainer's log-probs.

Built locally and deterministically (``torch.manual_seed(seed)``, no download), written
beside its final place and renamed into it. torch/transformers/tokenizers are imported
inside the functions: the core imports no host framework at import time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from jigsaw_plugin.runtime.tiny_model import TINY_QWEN2, already_built

__all__ = ["SPECIAL_TOKENS", "CHATML_TEMPLATE", "VOCAB_SIZE", "tiny_chat_config", "build_tiny_chat_qwen2",
           "byte_alphabet"]

#: The specials after the 256 byte tokens, in id order (256, 257, 258).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
PAD, EOS = "<|endoftext|>", "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_MARKER = "jigsaw_tiny_model.json"


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map (what a ByteLevel pre-tokenizer emits), by byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tiny_chat_config() -> dict:
    """The Qwen2 config: tiny_model's architecture with the tokenizer's vocab and special ids."""
    ids = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}
    return {**TINY_QWEN2, "vocab_size": VOCAB_SIZE, "bos_token_id": ids[PAD], "eos_token_id": ids[EOS],
            "pad_token_id": ids[PAD], "tie_word_embeddings": False}


def _recipe(seed: int) -> dict:
    return {"model": "tiny-qwen2-chat", "config": tiny_chat_config(), "specials": list(SPECIAL_TOKENS),
            "chat_template": CHATML_TEMPLATE, "seed": int(seed)}


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in enumerate(byte_alphabet())}
    vocab.update({tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   additional_special_tokens=[s for s in SPECIAL_TOKENS if s not in (EOS, PAD)])
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_chat_qwen2(path, seed: int = 0) -> Path:
    """Build (or reuse) the model and tokenizer in folder ``path``; returns the folder.

    A marker file records the recipe; a folder holding the same recipe is reused as is.
    """
    path = Path(path)
    recipe = _recipe(seed)
    if already_built(path, recipe):
        return path

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _tokenizer()
    assert len(tokenizer) == VOCAB_SIZE, (len(tokenizer), VOCAB_SIZE)
    config = Qwen2Config(**tiny_chat_config())
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(int(seed))
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
                                               bos_token_id=config.bos_token_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps(recipe, indent=1, sort_keys=True) + "\n")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another builder renamed an identical folder first
        if not already_built(path, recipe):
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
