"""The decode floor of ``core.bounds`` that counts the HBM reads no decode step avoids (the
weights once per replica step, at least as many steps as the longest trajectory has tokens
and as the step's contexts fill caches; each token's KV cache once): its arithmetic on a
hand-built step, and that no policy beats the bounds where it binds (long contexts, and
many long contexts a step)."""

from types import SimpleNamespace

import numpy as np
import pytest

from jigsaw_plugin.core.bounds import (_cache_steps, _class_costs, _decode_chain_s, _decode_token_device_s, _kv_cap,
                                       _kv_read_device_s, _tail_read_line, _width_limit, _widths)
from jigsaw_plugin.scheduler import get_policy, policy_names
from jigsaw_plugin.sim.engine import Simulation
from jigsaw_plugin.workload import parse_workload
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


def _brute_cache_steps(smp, cap: float) -> float:
    """``_cache_steps`` token by token: each token's context (the turn's start context plus
    the tokens before it), at most ``cap``, summed, over ``cap``."""
    total = 0.0
    for s in range(len(smp.prompt_len)):
        ctx = float(smp.prompt_len[s])
        for k in range(smp.turn_offset[s], smp.turn_offset[s + 1]):
            for j in range(int(smp.gen_tokens[k])):
                total += min(ctx + j, cap)
            ctx += smp.gen_tokens[k] + smp.observation_len[k]
    return total / cap


def test_the_cache_floor_counts_each_tokens_context_up_to_one_cache():
    # sample 0's turn starts below the cap and crosses it; sample 1's second turn starts
    # above it (one sequence may outgrow a cache alone: it counts one full cache a token)
    smp = StepSamples(prompt_len=np.array([90, 50]), turns=np.array([1, 2]), turn_offset=np.array([0, 1, 3]),
                      gen_tokens=np.array([20, 30, 5]), tool_latency_s=np.array([0.0, 1.0, 0.0]),
                      observation_len=np.array([0, 40, 0]), reward_latency_s=np.zeros(2))
    for cap in (1.0, 60.0, 100.0, 100.5, 125.0, 1e6):
        assert _cache_steps(smp, cap) == pytest.approx(_brute_cache_steps(smp, cap)), cap
    assert _cache_steps(smp, 0.0) == 0.0


def _many_long_contexts():
    # 128 sequences a step with 3,000-token prompts on 6 GB devices: their contexts fill
    # the roomiest replica's cache (about 190K tokens) about twice as often as the longest
    # response has tokens, so the weights are read in at least that many replica steps
    small = {"name": "small6", "flops_tflops": 165.0, "hbm_tbps": 1.0, "memory_gb": 6.0, "link_gbps": 32.0}
    pipes = [{"name": f"p{i}", "model": "qwen2.5-1.5b", "algorithm": "grpo", "mode": mode,
              "staleness": 1 if mode == "async" else 0, "prompts_per_step": 16, "samples_per_prompt": 8,
              "max_response_len": 4096, "prompt_len": {"dist": "const", "value": 3000},
              "response_len": {"dist": "lognormal", "median": 2500, "sigma": 0.2, "min": 1}, "steps": 2}
             for i, mode in enumerate(("sync", "async"))]
    return parse_workload({"version": 1, "cluster": {"gpus": 12, "gpu": small, "gpus_per_node": 2},
                           "pipelines": pipes})


def test_no_policy_beats_the_bounds_where_the_cache_floor_binds():
    wl = _many_long_contexts()
    runs = [(name, "history") for name in policy_names() if not name.startswith("test-")] + [("jigsaw", "oracle")]
    for name, predictor in runs:
        sim = Simulation(wl, get_policy(name), seed=1, predictor=predictor)
        r = sim.run()
        ex = sim.world
        costs = _class_costs(ex)
        for p in ex.order:  # the floor binds: more cache-filled steps than the longest response's tokens
            cap = _kv_cap(costs, p.model, _width_limit(costs, p, ex.largest_node))
            for s in p.steps.values():
                assert _cache_steps(s.samples, cap) > 1.5 * _kv_read_device_s(p.model, s.samples, 1.0)[1]
        b, g = r["bounds"], r["gap_breakdown"]
        assert r["makespan_s"] >= b["makespan_lower_bound_s"], (name, r["makespan_s"], b)
        assert g["rollout_above_ideal_device_s"] >= -1e-6 * g["gap_device_s"], (name, g)


def test_the_longest_trajectorys_floor_reads_its_own_kv_cache_each_token():
    # a 32B's 8,000-token turn after a 24,000-token context: each token's step reads its
    # own KV cache too; the floor stays below the cheapest width's step token by token
    from jigsaw_plugin.costmodel import CostModel
    from jigsaw_plugin.costmodel.profiles import hardware_profile, model_profile

    cost, model = CostModel(hardware_profile("h100")), model_profile("qwen2.5-32b")
    widths = _widths(cost, model, 8)
    tail = min(cost.decode_step_s(model, tp, 1, 0.0) for tp in widths)
    a, b = _tail_read_line([cost], model, 8)
    for ctx in (0.0, 1e3, 3e4, 1e6):
        assert a + b * ctx <= min(cost.decode_step_s(model, tp, 1, ctx) for tp in widths) * (1 + 1e-12)
    smp = StepSamples(prompt_len=np.array([24000, 100]), turns=np.array([1, 1]), turn_offset=np.array([0, 1, 2]),
                      gen_tokens=np.array([8000, 50]), tool_latency_s=np.zeros(2), observation_len=np.zeros(2),
                      reward_latency_s=np.zeros(2))
    chain = _decode_chain_s(smp, tail, (a, b))
    exact = sum(min(cost.decode_step_s(model, tp, 1, 24000 + j) for tp in widths) for j in range(8000))
    assert 8000 * tail < chain[0] <= exact * (1 + 1e-9)
    assert chain[1] == pytest.approx(50 * tail, rel=1e-3)  # a short context reads little beside the weights
