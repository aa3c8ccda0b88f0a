"""The rule reward of the CPU end-to-end run (verl's ``custom_reward_function`` interface).

verl loads it by file path (``reward.custom_reward_function.path=<this file>
reward.custom_reward_function.name=compute_score``, ``trainer/ppo/reward.py:50-85``) and calls
it once per trajectory. No imports beyond the standard library: verl's reward workers load it
by path.

The rule: the share of the response's characters that are the prompt's target letter
(``ground_truth``), plus a small bonus for any lowercase letter. A random tiny model scores
differently on each sample, so GRPO's group-relative advantages are non-zero and the actor
update has a gradient.
"""

from __future__ import annotations

__all__ = ["compute_score"]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    text = str(solution_str or "")
    if not text:
        return 0.0
    target = str(ground_truth or "")[:1]
    hits = sum(ch == target for ch in text) if target else 0
    letters = sum("a" <= ch <= "z" for ch in text)
    return hits / len(text) + 0.1 * letters / len(text)
