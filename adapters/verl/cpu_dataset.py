"""The small local dataset of the CPU end-to-end run, in verl's RL parquet format.

Each row is what verl's ``RLHFDataset`` reads (``data.train_files``): ``prompt`` (chat
messages), ``data_source``, ``reward_model`` (``{"style": "rule", "ground_truth": ...}``) and
``extra_info``. The ground truth is the target letter of ``cpu_reward.compute_score``.
Deterministic: the same ``rows`` give the same file.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_SOURCE", "rows", "write_dataset"]

DATA_SOURCE = "jigsaw/letters"
_WORDS = ("apple", "banana", "cherry", "dates", "elder", "figs", "grape", "honey",
          "kiwi", "lemon", "mango", "nectar", "olive", "peach", "quince", "rasp")


def rows(n: int = 16) -> list[dict]:
    """``n`` prompts asking to repeat a letter of a word."""
    if n < 1:
        from jigsaw_plugin.errors import SpecError

        raise SpecError("rows", n, "an integer >= 1")
    out = []
    for i in range(n):
        word = _WORDS[i % len(_WORDS)]
        letter = word[i % len(word)]
        out.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"Write the letter {letter} of {word} many times."}],
            "ability": "letters",
            "reward_model": {"style": "rule", "ground_truth": letter},
            "extra_info": {"index": i, "split": "train"},
        })
    return out


def write_dataset(path, n: int = 16) -> Path:
    """Write :func:`rows` to ``path`` (parquet); returns the path."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows(n)).to_parquet(path)
    return path
