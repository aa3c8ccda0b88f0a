"""A deterministic rule reward on token ids, for the reference pipeline.

The policy is the tiny random Qwen2 (no tokenizer, no task), so the reward is a rule on
token ids: a fixed *target set* of ids, and

    r(response) = |{t in response : t in target}| / |response|        (0 for an empty one)

over the tokens the policy generated (observations spliced into a multi-turn rollout,
response mask 0, are left out).

The pipeline's rule (``low_id_reward``): the target set is the lower half of the
vocabulary, ids ``< 1024`` of tiny-qwen2's 2048. Why: the random model's next-token
distribution is close to uniform, so the initial reward is about 0.5 and, a response
being many nearly independent draws, the samples of one prompt differ (binomial spread,
about 0.09 for 32 tokens): GRPO's group normalisation has signal from the first step,
and every token carries some (a dense reward; "emit token X" would be hit once in 2048
draws). It ignores the prompt: this is a pipeline exercise, not a task. Measured
(docs/reference_pipeline.md): with the trainer's defaults the mean reward of 8 prompts x
4 samples x 32 tokens rises by 0.06-0.10 within five steps, for each of five seeds
(integration_tests/test_reference_grpo.py asserts it for one).

Pure Python; no torch.
"""

from __future__ import annotations

__all__ = ["TokenSetReward", "low_id_reward", "VOCAB_HALF"]

VOCAB_HALF = 1024  # half of tiny-qwen2's 2048-token vocabulary


class TokenSetReward:
    """``reward(prompt_ids, response_ids) -> float``: the fraction of response tokens in a
    fixed set of token ids (see the module docstring)."""

    def __init__(self, token_ids, name: str = "token_set"):
        self.token_ids = frozenset(int(t) for t in token_ids)
        if not self.token_ids:
            raise ValueError("the target set of token ids is empty")
        self.name = name

    def __call__(self, prompt_token_ids, response_token_ids) -> float:
        ids = list(response_token_ids)
        if not ids:
            return 0.0
        return sum(1 for t in ids if int(t) in self.token_ids) / len(ids)

    def batch(self, batch) -> list[float]:
        """Rewards of a batch of ``(prompt_ids, response_ids, prompt_index[, mask])``
        samples; with a response mask only the generated (mask 1) tokens count."""
        out = []
        for item in batch:
            response = item[1]
            if len(item) > 3 and item[3] is not None:
                response = [t for t, m in zip(response, item[3]) if m]
            out.append(self(item[0], response))
        return out

    def __repr__(self) -> str:
        return f"TokenSetReward({self.name}, {len(self.token_ids)} ids)"


def low_id_reward(threshold: int = VOCAB_HALF) -> TokenSetReward:
    """The pipeline's reward: target set ``{0, ..., threshold-1}``."""
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    return TokenSetReward(range(int(threshold)), name=f"id<{threshold}")
