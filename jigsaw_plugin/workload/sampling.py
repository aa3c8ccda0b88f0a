"""One step's concrete samples of a pipeline: seeded, vectorised, deterministic.

``sample_step(pipeline, step, seed)`` depends only on (pipeline name, its spec, step, seed).
Each field has its own random stream (children of ``SeedSequence([seed, step,
crc32(name)])``), so changing one field's distribution leaves the others' draws unchanged.

Rules (docs/workload.md, "Sampling"):

* ``prompt_len`` is drawn per prompt and shared by that prompt's ``samples_per_prompt``
  samples (sample ``i`` belongs to prompt ``i // samples_per_prompt``);
* token counts are rounded to integers: prompt and per-turn generated tokens >= 1,
  observation tokens >= 0; turns are rounded and >= 1 (1 for a single-turn pipeline);
  latencies are clipped at 0;
* ``max_response_len`` caps a sample's generated tokens (summed over turns): the turn that
  reaches the cap is truncated to the remaining budget and the trajectory ends there (its
  later turns are dropped, so ``turns`` is reduced), as a generation that hits the length
  limit ends the episode in verl / Search-R1;
* ``tool_latency_s`` and ``observation_len`` are 0 on a sample's last turn (no tool call
  follows it);
* ``group_correlation`` (rho > 0): the response lengths are drawn from the marginal exactly
  as with rho = 0, then permuted across the step so that their ranks follow a Gaussian
  copula with a per-prompt latent, ``u = sqrt(rho) z_prompt + sqrt(1 - rho) e``: the
  multiset of lengths (so the step's total tokens before the cap) is the one rho = 0 gives
  for the same seed, and every sample's marginal is unchanged. For an agentic pipeline the
  turns' lengths are permuted the same way, every turn of a prompt's samples sharing the
  prompt's latent, before the cap truncates trajectories. The latent has its own stream.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["StepSamples", "sample_step", "step_rng", "correlate_within_groups"]

# appending a stream leaves the earlier ones' draws unchanged (SeedSequence children by index)
_STREAMS = ("prompt_len", "turns", "response_len", "tool_latency_s", "observation_len", "reward", "group_latent")


@dataclass(frozen=True, eq=False)
class StepSamples:
    """Arrays of one step. N samples, T = turns.sum() turns; sample i's turns are
    ``turn_offset[i]:turn_offset[i+1]`` in the per-turn arrays."""

    prompt_len: np.ndarray  # int64[N]
    turns: np.ndarray  # int64[N]
    turn_offset: np.ndarray  # int64[N+1]
    gen_tokens: np.ndarray  # int64[T]
    tool_latency_s: np.ndarray  # float64[T]
    observation_len: np.ndarray  # int64[T]
    reward_latency_s: np.ndarray  # float64[N]

    @property
    def n(self) -> int:
        return len(self.prompt_len)

    def generated_per_sample(self) -> np.ndarray:
        """int64[N]: each sample's generated tokens summed over its turns."""
        c = np.concatenate(([0], np.cumsum(self.gen_tokens)))
        return c[self.turn_offset[1:]] - c[self.turn_offset[:-1]]

    def __len__(self) -> int:
        return self.n


def step_rng(name: str, step: int, seed: int) -> list[np.random.Generator]:
    """One generator per field stream, derived from (seed, step, crc32(name))."""
    if step < 0 or seed < 0:
        raise ValueError(f"step and seed must be >= 0, got step={step}, seed={seed}")
    ss = np.random.SeedSequence([int(seed), int(step), zlib.crc32(name.encode("utf-8"))])
    return [np.random.Generator(np.random.PCG64(s)) for s in ss.spawn(len(_STREAMS))]


def _tokens(x: np.ndarray, minimum: int) -> np.ndarray:
    return np.maximum(np.rint(x), minimum).astype(np.int64)


def correlate_within_groups(values: np.ndarray, group_of: np.ndarray, n_groups: int, rho: float,
                            rng: np.random.Generator) -> np.ndarray:
    """``values`` permuted so that their ranks follow a Gaussian copula whose latent has
    intra-class correlation ``rho`` within each group (``group_of[i]`` in ``[0, n_groups)``).
    The multiset of values is unchanged; rho = 0 gives a uniformly random permutation."""
    z = rng.standard_normal(n_groups)
    u = math.sqrt(rho) * z[group_of] + math.sqrt(1.0 - rho) * rng.standard_normal(len(values))
    out = np.empty_like(values)
    out[np.argsort(u, kind="stable")] = np.sort(values, kind="stable")
    return out


def sample_step(pipeline, step: int, seed: int) -> "StepSamples":
    """The concrete samples of ``pipeline``'s step ``step`` under ``seed``."""
    r_prompt, r_turns, r_resp, r_tool, r_obs, r_reward, r_latent = step_rng(pipeline.name, step, seed)
    spp = pipeline.samples_per_prompt
    n = pipeline.prompts_per_step * spp
    cap = int(pipeline.max_response_len)
    rho = float(getattr(pipeline, "group_correlation", 0.0) or 0.0)
    correlated = rho > 0.0 and spp > 1

    prompt_len = np.repeat(_tokens(pipeline.prompt_len.sample(r_prompt, pipeline.prompts_per_step), 1), spp)

    if pipeline.turns is None:
        gen = np.minimum(_tokens(pipeline.response_len.sample(r_resp, n), 1), cap)
        if correlated:
            gen = correlate_within_groups(gen, np.arange(n) // spp, pipeline.prompts_per_step, rho, r_latent)
        turns = np.ones(n, dtype=np.int64)
        offset = np.arange(n + 1, dtype=np.int64)
        tool = np.zeros(n, dtype=np.float64)
        obs = np.zeros(n, dtype=np.int64)
    else:
        # each turn generates >= 1 token, so more than `cap` turns can never fit
        turns = np.clip(np.rint(pipeline.turns.sample(r_turns, n)), 1, cap).astype(np.int64)
        t_all = int(turns.sum())
        gen = _tokens(pipeline.response_len.sample(r_resp, t_all), 1)
        if correlated:
            prompt_of_turn = np.repeat(np.arange(n) // spp, turns)
            gen = correlate_within_groups(gen, prompt_of_turn, pipeline.prompts_per_step, rho, r_latent)
        tool = np.maximum(pipeline.tool_latency_s.sample(r_tool, t_all), 0.0)
        obs = _tokens(pipeline.observation_len.sample(r_obs, t_all), 0)
        # generated tokens before each turn, within its sample
        start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(turns, out=start[1:])
        csum = np.cumsum(gen)
        before = csum - gen
        before -= np.repeat(before[start[:-1]], turns)
        keep = before < cap  # a turn starting with budget left; the first turn always does
        gen = np.minimum(gen, cap - before)
        if not keep.all():
            sample_of_turn = np.repeat(np.arange(n), turns)
            turns = np.bincount(sample_of_turn[keep], minlength=n).astype(np.int64)
            gen, tool, obs = gen[keep], tool[keep], obs[keep]
        offset = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(turns, out=offset[1:])
        last = offset[1:] - 1
        tool[last] = 0.0
        obs[last] = 0

    reward = np.maximum(pipeline.reward.latency_s.sample(r_reward, n), 0.0)
    return StepSamples(prompt_len, turns, offset, gen, tool, obs, reward)
