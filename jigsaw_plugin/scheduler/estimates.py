"""Quick, pure estimates of a step's phases from the cost model (for provisioning).

Used by the disaggregated baselines to choose their rollout/training split (StreamRL and
AReaL pick the split by profiling the workload offline: ``length_stats`` of the spec is
that profile) and by the jigsaw policy's look-ahead, which uses only what the run has
observed (``observed_stats``).
"""

from __future__ import annotations

import math

import numpy as np

from jigsaw_plugin.algorithms import FORWARD_STAGES, UPDATE_STAGES

__all__ = ["rollout_tp", "holding_replica", "split_rollout_sizes", "length_stats", "observed_stats", "gen_estimate_s", "gen_parts_s", "gen_profile_s", "train_estimate_s",
           "balanced_split", "device_risks", "restart_priced_s"]


def rollout_tp(pipeline, cost) -> int:
    """The replica size (``CostModel.rollout_width`` of the spec's ``rollout_tp``)."""
    return cost.rollout_width(pipeline.model, pipeline.spec.rollout_tp)


def holding_replica(state, model, devices, width: int) -> list:
    """The devices of ``devices`` whose class holds a ``width``-wide rollout replica of
    ``model`` with room for a KV cache (a node holds one class). On a pool of several
    classes a width chosen on one class's memory may not fit another's: a 14B at width 1
    fills an 80 GB device a third of the way and overflows a 24 GB one. All of them on a
    pool of one class, whose widths ``rollout_width`` grows until they fit."""
    if len(state.classes) <= 1:
        return list(devices)
    fits = [c.devices for c in state.classes if c.cost.kv_capacity_tokens(model, width) > 0]
    return [d for d in devices if any(d in r for r in fits)]


def device_risks(state) -> dict[int, tuple[float, float]]:
    """Device -> (preemptions a second, seconds down after one) that its class has shown so
    far (``SchedulerState.preemptions``: observed counts over the device-seconds in the pool,
    never a preemption still to come); devices of classes that have lost none are absent,
    and the dict is empty where none has."""
    out: dict[int, tuple[float, float]] = {}
    for seen in state.preemptions:
        rate = seen.rate_per_s
        if rate <= 0:
            continue
        devices = state.classes[seen.cls].devices if state.classes else range(state.gpus)
        for d in devices:
            out[d] = (rate, seen.mean_down_s)
    return out


_EXP_MAX = 700.0  # e^700 is near the largest float
_OVERFLOW_S = 1e300  # what an expectation past it is priced at (times a factor just above 1)


def restart_priced_s(t: float, rate: float, wait_s: float, again_s: float | None = None) -> float:
    """Expected time to finish a pass of ``t`` seconds that loses its progress whenever one
    of its devices is preempted (Poisson, ``rate`` preemptions a second over all of them)
    and starts again ``wait_s`` later (its device's replacement joins), each new attempt
    taking ``again_s`` (default ``t``; a training stage reloads its state first). The
    classic checkpoint-free restart: an attempt of ``L`` seconds from its start takes
    ``X = (e^(rate L) - 1)(1/rate + wait_s)`` expected, so the pass takes
    ``q/rate + q (wait_s + X(again_s))`` with ``q = 1 - e^(-rate t)`` the odds the first
    attempt is cut, which is ``X(t)`` where ``again_s == t``; ``t`` itself at rate 0. A
    training stage restarts so (``sim/preemption.py``: the update's start is its only
    checkpoint), so a wide gang of preemptible devices can take far longer than a narrow
    one: odd_workloads --preempt seed 200's values pass on 10 devices preempted every 18 s
    each ran 16,345 s."""
    if rate <= 0 or t <= 0:
        return t
    again = t if again_s is None else again_s
    if rate * max(t, again) > _EXP_MAX:
        # past what a float holds: finite all the same, ordered by the logarithm of the
        # expectation, and above any time a pass could take. A pass must still start on
        # its likeliest gang: priced infinite at every width, the stages of a pool
        # preempted every 0.2 s a device never started, not even once the simulator's
        # preemptions ran out (odd_workloads --preempt seed 68: a stall at 47,212 s)
        return _OVERFLOW_S * (1.0 + 1e-10 * (rate * max(t, again) + math.log(1.0 / rate + wait_s)))
    q = -math.expm1(-rate * t)
    return q / rate + q * (wait_s + math.expm1(rate * again) * (1.0 / rate + wait_s))


def split_rollout_sizes(tp: int, model, cost, devices: int) -> range:
    """Rollout sizes a disaggregated split of ``devices`` allows: whole replicas of ``tp``
    devices, leaving a trainer that holds ``model``'s training state
    (``CostModel.min_gang``); empty where the share holds no such split."""
    return range(tp, (devices - cost.min_gang(model, update=True)) // tp * tp + 1, tp)


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
    generation against its training on the rest, as the disaggregated systems size their
    pools: from an offline profile of the workload (``gen_profile_s``: every replica's share
    of the step decoded at the batch its KV cache holds, the long tail in lockstep, prompts
    and observations prefilled, the slowest trajectory's tool calls and reward). The cheap
    ``gen_estimate_s`` left out the prefill, the tools and the tail's shrinking batch: on
    bundled (c) it put 2 and 1 of 8 devices on rollout, where 3 run the mix 18% faster."""
    tp = rollout_tp(pipeline, cost)
    st = length_stats(pipeline.spec)
    best, best_r = None, tp
    for r in split_rollout_sizes(tp, pipeline.model, cost, devices):
        t = max(gen_profile_s(pipeline, cost, r), train_estimate_s(pipeline, cost, devices - r, st))
        if best is None or t < best:
            best, best_r = t, r
    return best_r


def gen_profile_s(pipeline, cost, devices: int, other_weight_bytes: float = 0.0) -> float:
    """One step's generation on ``devices``, profiled from the spec's distributions as an
    offline profiler would see it (RollMux's planner uses it; ``gen_estimate_s`` is the
    cheap form the online policies use). Each replica takes its share of the step's
    trajectories (seeded draws: deterministic); their responses, every turn's tokens summed,
    decode at the batch the KV cache and ``max_num_seqs`` allow, the shortest through the
    full batch first and then the longest in lockstep at a shrinking batch (the long tail);
    prompts and observations are prefilled; the chain adds the slowest trajectory's tool
    calls and reward. ``other_weight_bytes``: other jobs' weights resident on the replicas'
    devices, which shrink the KV cache (evicted where they leave it none)."""
    spec, model = pipeline.spec, pipeline.model
    tp = rollout_tp(pipeline, cost)
    replicas = max(1, devices // tp)
    m = max(1, -(-spec.samples_per_step // replicas))  # trajectories per replica
    rng = np.random.default_rng(12345)
    turns = spec.turns.sample(rng, m).clip(min=1).astype(int) if spec.turns is not None else np.ones(m, int)
    starts = np.concatenate(([0], np.cumsum(turns)[:-1]))

    def per_trajectory(dist, k: int) -> np.ndarray:  # each turn its own draw, summed
        return np.add.reduceat(dist.sample(rng, int(turns.sum())), starts) if k else np.zeros(m)

    total = np.sort(np.minimum(per_trajectory(spec.response_len, 1), spec.max_response_len))[::-1]  # longest first
    prompt = spec.prompt_len.sample(rng, m)
    # a trajectory's later turns bring an observation and a tool call each (its first turn's
    # draw stands in for the one a single turn does not make: a slight overcount)
    obs = per_trajectory(spec.observation_len, spec.observation_len is not None) * (turns > 1)
    waits = per_trajectory(spec.tool_latency_s, spec.tool_latency_s is not None) * (turns > 1)
    waits = waits + spec.reward.latency_s.sample(rng, m)
    full = float(np.mean(prompt + obs + total))  # a sequence's context when it ends
    context = float(np.mean(prompt + obs + total / 2))  # on average while it decodes
    cap = cost.kv_capacity_tokens(model, tp, other_weight_bytes / tp) or cost.kv_capacity_tokens(model, tp)
    batch = int(max(1, min(cost.f.max_num_seqs, m, cap / max(1.0, full))))
    # the ``batch`` longest decode last, in lockstep: between the j-th and (j+1)-th longest
    # lengths j sequences are left
    tail = total[:batch]
    steps = tail - np.append(tail[1:], 0.0)
    live = np.arange(1, batch + 1)
    step_s = np.array([cost.decode_step_s(model, tp, int(b), b * context) for b in live])
    decode = float(np.sum(steps * step_s))
    decode += float(np.sum(total[batch:])) / batch * step_s[-1]  # the rest, through the full batch
    prefill = cost.prefill_s(model, tp, float(np.sum(prompt + obs)))
    return decode + prefill + float(np.max(waits))
