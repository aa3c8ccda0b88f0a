"""The decode floor of ``core.bounds`` that counts the HBM reads no decode step avoids (the
weights once per step, each token's KV cache once): its arithmetic on a hand-built step,
and that no policy beats the bounds where it binds (long contexts)."""

from types import SimpleNamespace

import numpy as np
import pytest

from jigsaw_plugin.core.bounds import _decode_token_device_s, _kv_read_device_s
from jigsaw_plugin.scheduler import get_policy, policy_names
from jigsaw_plugin.sim.engine import Simulation
from jigsaw_plugin.workload.sampling import StepSamples
from sim_helpers import small_workload


def test_the_read_floor_counts_each_turns_context_and_the_longest_trajectorys_steps():
    # sample 0: one turn of 4 tokens after a 100-token prompt; sample 1: two turns (3, then
    # 2 tokens) after a 50-token prompt, the tool's 10-token observation between them
    smp = StepSamples(prompt_len=np.array([100, 50]), turns=np.array([1, 2]), turn_offset=np.array([0, 1, 3]),
                      gen_tokens=np.array([4, 3, 2]), tool_latency_s=np.array([0.0, 1.0, 0.0]),
                      observation_len=np.array([0, 10, 0]), reward_latency_s=np.zeros(2))
    model = SimpleNamespace(weight_bytes=1000.0, kv_bytes_per_token=2.0)
    kv = (4 * 100 + 4 * 3 / 2) + (3 * 50 + 3 * 2 / 2) + (2 * (50 + 3 + 10) + 2 * 1 / 2)
    kv_s, steps = _kv_read_device_s(model, smp, per_byte=0.5)
    assert steps == 5  # sample 1's trajectory: 3 + 2 tokens, one per decode step
    assert kv_s == pytest.approx(kv * 2.0 * 0.5)


def _long_context():
    # long responses on a small pool: each token re-reads a long KV cache, so the read floor
    # is above the batched one; one synchronous and one asynchronous pipeline
    return small_workload(gpus=8, pipelines=2, prompts=4, samples=4, steps=2, median=6000, max_len=16000,
                          models=("qwen2.5-7b", "qwen2.5-7b"), algorithms=("grpo", "grpo"),
                          agentic=(False, True), modes=("sync", "async"), staleness=(0, 1))


def test_the_read_floor_binds_on_long_contexts():
    wl = _long_context()
    sim = Simulation(wl, get_policy("verl-sync"), seed=1)
    r = sim.run()
    cost = sim.world.cost
    batched = 0.0
    for p in sim.world.order:
        per_token = _decode_token_device_s(cost, p.model, sim.world.gpus_per_node)
        batched += sum(float(np.sum(s.samples.gen_tokens)) * per_token for s in p.steps.values())
    prefill = min(cost.prefill_s(sim.world.order[0].model, tp, 1e6) * tp / 1e6 for tp in (1, 2, 4, 8))
    fresh = sum(float(np.sum(s.samples.prompt_len)) + float(np.sum(s.samples.observation_len))
                for p in sim.world.order for s in p.steps.values())
    from jigsaw_plugin.core.bounds import compute_bounds

    b = compute_bounds(sim.world)
    assert b.ideal_rollout_device_s > 1.2 * (batched + fresh * prefill)
    assert r["makespan_s"] >= r["bounds"]["makespan_lower_bound_s"]


def test_no_policy_beats_the_bounds_where_the_read_floor_binds():
    wl = _long_context()
    runs = [(name, "history") for name in policy_names() if not name.startswith("test-")] + [("jigsaw", "oracle")]
    for name, predictor in runs:
        r = Simulation(wl, get_policy(name), seed=1, predictor=predictor).run()
        b, g = r["bounds"], r["gap_breakdown"]
        assert r["makespan_s"] >= b["makespan_lower_bound_s"], (name, r["makespan_s"], b)
        # the rollout replicas held at least the ideal decode and prefill device-seconds
        assert g["rollout_above_ideal_device_s"] >= -1e-6 * g["gap_device_s"], (name, g)
