"""Quick, pure estimates of a step's phases from the cost model (for provisioning).

Used by the disaggregated baselines to choose their rollout/training split (StreamRL and
AReaL pick the split by profiling the workload offline: ``length_stats`` of the spec is
that profile) and by the jigsaw policy's look-ahead, which uses only what the run has
observed (``observed_stats``).
"""

from __future__ import annotations

import numpy as np

from jigsaw_plugin.algorithms import FORWARD_STAGES, UPDATE_STAGES

__all__ = ["rollout_tp", "length_stats", "observed_stats", "gen_estimate_s", "gen_parts_s", "train_estimate_s",
           "balanced_split"]



def rollout_tp(pipeline, cost) -> int:
    """The replica size: the spec's ``rollout_tp`` or the model's default, grown (over the
    widths vLLM can shard the model on) until the weights leave room for a KV cache."""
    m = pipeline.model
    tp = pipeline.spec.rollout_tp or m.default_tp
    while (cost.kv_capacity_tokens(m, tp) <= 0 or not m.fits_tp(tp)) and tp < 8:
        tp *= 2
    return tp


def length_stats(spec, draws: int = 4096) -> dict:
    """Per-sample token figures of a pipeline's workload (seeded draws: deterministic)."""
    rng = np.random.default_rng(12345)
    resp = np.minimum(spec.response_len.sample(rng, draws), spec.max_response_len)
    prompt = spec.prompt_len.sample(rng, draws)
    turns = spec.turns.sample(rng, draws).clip(min=1) if spec.turns is not None else np.ones(draws)
    obs = spec.observation_len.sample(rng, draws) * (turns - 1) if spec.observation_len is not None else 0 * turns
    total_resp = np.minimum(resp * turns, spec.max_response_len)
    return {
        "prompt": float(prompt.mean()),
        "response": float(total_resp.mean()),
        "context": float((prompt + total_resp + obs).mean()),
        "p999": float(np.quantile(total_resp, 0.999)),
        "turns": float(turns.mean()),
    }


def observed_stats(pipeline) -> dict:
    """``length_stats``' figures from a ``PipelineView``'s finished work (or its prior)."""
    lens = pipeline.lengths
    return {
        "prompt": lens.prompt_tokens,
        "response": lens.generated_tokens,
        "context": lens.context_tokens,
        "p999": lens.longest_generated,
        "turns": lens.turns,
    }


def gen_estimate_s(pipeline, cost, devices: int, stats: dict | None = None) -> float:
    """Generation time of one step on ``devices``: batched bulk plus the longest response."""
    bulk, tail = gen_parts_s(pipeline, cost, devices, stats)
    return max(bulk, tail) + 0.3 * min(bulk, tail)


def gen_parts_s(pipeline, cost, devices: int, stats: dict | None = None) -> tuple[float, float]:
    """One step's generation on ``devices`` as (bulk, tail) seconds: the batched bulk, which
    shrinks with more replicas, and the longest response decoded alone, which does not."""
    spec, model = pipeline.spec, pipeline.model
    st = stats or length_stats(spec)
    tp = rollout_tp(pipeline, cost)
    replicas = max(1, devices // tp)
    n = spec.samples_per_step
    cap = cost.kv_capacity_tokens(model, tp)
    batch = max(1.0, min(cost.f.max_num_seqs, n / replicas, cap / max(1.0, st["context"])))
    step = cost.decode_step_s(model, tp, int(batch), batch * st["context"] / 2)
    bulk = n * st["response"] / replicas / batch * step
    tail = st["p999"] * cost.decode_step_s(model, tp, 1, st["context"])
    return bulk, tail


def train_estimate_s(pipeline, cost, devices: int, stats: dict | None = None) -> float:
    """Training-side time of one step on a gang of ``devices``."""
    st = stats or length_stats(pipeline.spec)
    tokens = pipeline.spec.samples_per_step * st["context"]
    total = 0.0
    for stage in pipeline.stages:
        if stage in FORWARD_STAGES:
            total += cost.forward_s(pipeline.model, devices, tokens)
        elif stage in UPDATE_STAGES:
            total += cost.train_s(pipeline.model, devices, tokens)
    return total


def balanced_split(pipeline, cost, devices: int) -> int:
    """Rollout devices (a multiple of the replica size) that best balance one step's
    generation against its training on the rest."""
    tp = rollout_tp(pipeline, cost)
    st = length_stats(pipeline.spec)
    best, best_r = None, tp
    for r in range(tp, devices, tp):
        t = max(gen_estimate_s(pipeline, cost, r, st), train_estimate_s(pipeline, cost, devices - r, st))
        if best is None or t < best:
            best, best_r = t, r
    return best_r
