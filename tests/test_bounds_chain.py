"""The training side of ``core.bounds``: an update on the critical path at its fastest gang
(every width tried: a pass's time is not monotone in it), and each pass's fixed cost
counted in the ideal device-seconds on the fewest devices that hold its state."""

import dataclasses

import numpy as np
import pytest

from jigsaw_plugin.core.bounds import _pass_device_s, _pass_s, _stage_fixed_device_s, compute_bounds
from jigsaw_plugin.costmodel import CostModel, EfficiencyFactors, model_profile
from jigsaw_plugin.costmodel.profiles import hardware_profile
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim.engine import Simulation
from sim_helpers import small_workload


def _h100(gpn: int = 8, hybrid_shard: bool = True) -> CostModel:
    return CostModel.for_nodes(hardware_profile("h100"), gpn,
                               dataclasses.replace(EfficiencyFactors(), hybrid_shard=hybrid_shard))


def test_an_update_on_the_chain_runs_at_its_fastest_width_not_spread_over_the_pool():
    # sharded over the whole gang (no hybrid sharding), whose all-gathers cross the NICs
    cost, m = _h100(hybrid_shard=False), model_profile("qwen2.5-14b")
    tokens, gpus = 2.0e6, 32
    ov = cost.f.train_stage_overhead_s
    times = {w: cost.train_s(m, w, tokens) - ov for w in range(cost.min_gang(m, update=True), gpus + 1)}
    fastest = min(times, key=times.get)
    assert _pass_s([cost], m, "update_actor", tokens, gpus) == pytest.approx(times[fastest])
    # past a node the all-gathers cross the NICs: the whole pool is not the fastest gang,
    # and the pass takes far longer than its least device-seconds spread over the pool
    assert fastest < gpus and times[gpus] > times[fastest]
    assert times[fastest] > 1.5 * _pass_device_s([cost], m, "update_actor", tokens, gpus) / gpus
    # a device class that is slower everywhere does not lower it; the faster one sets it
    slow = CostModel.for_nodes(hardware_profile("h20"), 8)
    assert _pass_s([slow, cost], m, "update_actor", tokens, gpus) == pytest.approx(times[fastest])


def test_a_pass_fixed_cost_is_ideal_work_on_the_fewest_devices_that_hold_its_state():
    cost = _h100()
    m7, m32 = model_profile("qwen2.5-7b"), model_profile("qwen2.5-32b")
    ov = cost.f.train_stage_overhead_s
    assert _stage_fixed_device_s([cost], m7, "old_log_prob") == pytest.approx(ov * cost.min_gang(m7, update=False))
    assert _stage_fixed_device_s([cost], m32, "update_actor") == pytest.approx(ov * cost.min_gang(m32, update=True))
    assert cost.min_gang(m32, update=True) > 1


def test_no_policy_beats_the_chain_bound_on_a_pool_where_updates_do_not_scale():
    # few samples of a 14B on four nodes: the chain (each step's longest trajectory, then its
    # update at its fastest width, whose all-gathers cross the NICs past a node) is above
    # the work spread over the pool; jigsaw grows and shrinks its gangs at micro-batch
    # boundaries, each micro-batch at its own width's price
    wl = small_workload(gpus=32, pipelines=1, prompts=8, samples=4, steps=3, median=800,
                        models=("qwen2.5-14b",), algorithms=("grpo",), agentic=(False,), modes=("sync",),
                        staleness=(0,))
    for name in ("verl-sync", "jigsaw"):
        sim = Simulation(wl, get_policy(name), seed=3)
        r = sim.run()
        b = compute_bounds(sim.world)
        assert b.critical_path_s > b.work_s
        assert r["makespan_s"] >= b.makespan_lower_bound_s


def test_no_policy_beats_the_bounds_with_replicas_wider_than_a_node():
    # the spec's 4-wide replicas on nodes of 2 devices: a long response decodes alone on 4
    # devices, faster than on any width within a node. The chain once took its widths
    # within a node only, and jigsaw ended at 43.5 s against a "bound" of 48.1 s
    from jigsaw_plugin.scheduler import policy_names
    from jigsaw_plugin.workload import parse_workload

    pipe = {"name": "p", "model": "qwen2.5-7b", "algorithm": "grpo", "mode": "sync", "prompts_per_step": 4,
            "samples_per_prompt": 4, "max_response_len": 16000, "rollout_tp": 4,
            "prompt_len": {"dist": "const", "value": 100},
            "response_len": {"dist": "lognormal", "median": 800, "sigma": 1.2, "min": 1}, "steps": 2}
    wl = parse_workload({"version": 1, "cluster": {"gpus": 8, "gpu": "h100", "gpus_per_node": 2},
                         "pipelines": [pipe]})
    runs = [(name, "history") for name in policy_names() if not name.startswith("test-")] + [("jigsaw", "oracle")]
    for name, predictor in runs:
        r = Simulation(wl, get_policy(name), seed=0, predictor=predictor).run()
        assert r["makespan_s"] >= r["bounds"]["makespan_lower_bound_s"], (name, predictor, r["makespan_s"], r["bounds"])


def test_two_updates_that_cannot_hold_their_state_at_once_are_both_on_the_chain():
    # a 14B PPO step's critic and actor updates need 4 devices each: on 8 they may run side
    # by side and the chain counts the longer; on 6 at most one progresses at a time, so the
    # chain counts both (and every policy, jigsaw's concurrent stages included, stays above)
    from jigsaw_plugin.core.bounds import _alongside

    chains = {}
    for gpus in (6, 8):
        wl = small_workload(gpus=gpus, pipelines=1, prompts=4, samples=4, steps=2, median=300,
                            models=("qwen2.5-14b",), algorithms=("ppo",), agentic=(False,), modes=("sync",),
                            staleness=(0,))
        for name in ("verl-sync", "jigsaw"):
            sim = Simulation(wl, get_policy(name), seed=0)
            r = sim.run()
            assert r["makespan_s"] >= r["bounds"]["makespan_lower_bound_s"], (gpus, name)
        p = sim.world.order[0]
        pair = [p.stages[i] for i in _alongside(sim.world, p)]
        chains[gpus] = pair
    assert "update_critic" in chains[8] and "update_critic" not in chains[6]
    assert "old_log_prob" in chains[6]  # forward passes hold no optimizer state: 1 device each


def test_two_passes_side_by_side_take_at_least_the_pools_time_for_both_device_seconds():
    # a 7B PPO step's two updates over many tokens, on one node: each scales with its gang,
    # so two gangs side by side (each at most the pool) are no faster than the two one
    # after the other on the whole pool; the longer alone would be about half of that
    from jigsaw_plugin.core.bounds import _pair_s

    cost, m = _h100(), model_profile("qwen2.5-7b")
    tokens, gpus = 8.0e6, 8
    ov = cost.f.train_stage_overhead_s
    a = _pass_s([cost], m, "update_critic", tokens, gpus)
    b = _pass_s([cost], m, "update_actor", tokens, gpus)
    pair = _pair_s([cost], m, "update_critic", "update_actor", tokens, gpus, a, b)
    assert pair > 1.8 * max(a, b)
    # it is a lower bound: the two side by side on any split of the pool take no less
    lo = cost.min_gang(m, update=True)
    best_split = min(max(cost.train_s(m, g, tokens), cost.train_s(m, gpus - g, tokens)) - ov
                     for g in range(lo, gpus - lo + 1))
    assert pair <= best_split + 1e-9
    # where the longer one dominates (a tiny partner), the pair is the longer one
    assert _pair_s([cost], m, "update_critic", "update_actor", tokens, gpus, a, 0.0) >= a
    # and a PPO pipeline alone on the node, chain-bound, is beaten by no policy
    wl = small_workload(gpus=8, pipelines=1, prompts=16, samples=4, steps=2, median=300,
                        models=("qwen2.5-7b",), algorithms=("ppo",), agentic=(False,), modes=("sync",),
                        staleness=(0,))
    for name in ("verl-sync", "jigsaw"):
        r = Simulation(wl, get_policy(name), seed=0).run()
        assert r["makespan_s"] >= r["bounds"]["makespan_lower_bound_s"] - 1e-6, name


class _OddWidthCost:
    """A hand-built cost model (``_least_compute_device_s`` reads only these) on which a
    pass's device-seconds are not monotone in its gang width: three devices run it at half
    the device-seconds of any other width, as a hybrid-sharding layout or a micro-batch
    count that rounds up can make a width that is no power of two the cheapest."""

    f = EfficiencyFactors()

    def stage_min_gang(self, model, stage):
        return 2

    def train_s(self, model, devices, tokens):
        per_device_s = (1.0 if devices == 3 else 2.0) * tokens / devices
        return self.f.train_stage_overhead_s + per_device_s

    forward_s = train_s


def test_a_pass_least_device_seconds_tries_every_width_not_only_powers_of_two():
    from jigsaw_plugin.core.bounds import _pair_s

    cost, m, tokens = _OddWidthCost(), model_profile("qwen2.5-7b"), 600.0
    assert _pass_device_s([cost], m, "update_actor", tokens, 8) == pytest.approx(tokens)
    assert _pass_device_s([cost], m, "old_log_prob", tokens, 8) == pytest.approx(tokens)
    # on a pool too small for that width, the cheapest that fits (from the fewest that hold its state)
    assert _pass_device_s([cost], m, "update_actor", tokens, 2) == pytest.approx(2 * tokens)
    # the side-by-side floor counts each pass at that width too, plus its fixed cost on two devices
    ov = cost.f.train_stage_overhead_s
    assert _pair_s([cost], m, "update_critic", "update_actor", tokens, 8, 0.0, 0.0) == pytest.approx(
        (2 * tokens + 2 * ov * 2) / 8 - ov)


def test_an_asynchronous_step_beyond_its_staleness_waits_for_training_on_the_chain():
    from jigsaw_plugin.core.bounds import _chain_floor

    # four steps of a 100 s longest trajectory, 10 s of updates, 1 s fixed, 2 s weight sync
    links = [(100.0, 10.0, 1.0, 2.0)] * 3 + [(100.0, 10.0, 1.0, 0.0)]  # no sync after the last
    sync = _chain_floor("p", links, 0)  # each step waits for the one before: all in turn
    assert sync.total_s == pytest.approx(4 * 111 + 3 * 2)
    assert (sync.generation_s, sync.training_s, sync.weight_sync_s) == pytest.approx((400, 44, 6))
    # staleness 1: steps 0 and 1 start at once, step 2 after step 0's sync (113 s), step 3
    # after step 1's (which waits for step 0's training: 100 + 11 + 2 + 11 + 2 = 126 s)
    one = _chain_floor("p", links, 1)
    assert one.total_s == pytest.approx(126 + 100 + 11)
    assert one.generation_s == pytest.approx(200)
    # staleness 3: every step starts at once; the training of all four in turn after the
    # first step's trajectories (the updates run one step after another)
    three = _chain_floor("p", links, 3)
    assert three.total_s == pytest.approx(100 + 4 * 11 + 3 * 2)
    assert three.generation_s == pytest.approx(100)


def test_no_policy_beats_the_chain_of_an_asynchronous_agent_with_long_tool_calls():
    # few trajectories of several turns, each tool call 20-60 s: staleness 1 lets a step
    # start only once the step two before it is trained, so every other step's longest
    # trajectory is on the chain, far above the work spread over the pool
    from jigsaw_plugin.workload import parse_workload

    wl = parse_workload({"version": 1, "cluster": {"gpus": 16, "gpu": "h100", "gpus_per_node": 8}, "pipelines": [{
        "name": "agent", "model": "qwen2.5-7b", "algorithm": "grpo", "mode": "async", "staleness": 1,
        "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_len": 2048, "steps": 4,
        "prompt_len": {"dist": "const", "value": 200}, "response_len": {"dist": "uniform", "low": 50, "high": 400},
        "turns": {"dist": "categorical", "values": [2, 3, 4], "weights": [0.3, 0.4, 0.3]},
        "tool_latency_s": {"dist": "uniform", "low": 20.0, "high": 60.0},
        "observation_len": {"dist": "uniform", "low": 50, "high": 300}}]})
    ran = 0
    for name, sim, r in _every_policy(wl, seed=1):
        ran += 1
        b = compute_bounds(sim.world)
        assert b.critical_path_s > 2 * b.work_s
        # steps 0 and 2 (or 1 and 3) each have their longest trajectory on the chain
        assert b.chains[0].generation_s > 1.5 * _first_longest(sim.world)
        assert r["makespan_s"] >= b.makespan_lower_bound_s, (name, r["makespan_s"], b)
    assert ran >= 4


def _every_policy(wl, seed: int):
    """(name, simulation, result) of each registered policy run on ``wl``; a baseline that
    cannot split the pool as it must (``SpecError``) is not run."""
    from jigsaw_plugin.scheduler import policy_names

    for name in [n for n in policy_names() if not n.startswith("test-")]:
        try:
            sim = Simulation(wl, get_policy(name), seed=seed)
        except SpecError:
            continue
        yield name, sim, sim.run()


def _first_longest(ex) -> float:
    """The first step's longest trajectory's tool calls and reward (a floor of its length)."""
    import numpy as np

    smp = ex.order[0].steps[0].samples
    starts = np.asarray(smp.turn_offset[:-1])
    return float(np.max(np.add.reduceat(smp.tool_latency_s, starts) + smp.reward_latency_s))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_no_policy_beats_a_chain_set_by_each_steps_work_rather_than_its_longest_response(mode):
    # one pipeline alone, many short responses after long prompts: each step's prefill,
    # decode and log-prob pass take the pool far longer than its longest response takes to
    # decode, and all of it runs between the step's generation opening and its update
    from jigsaw_plugin.core.bounds import _tail_token_s, _width_limit, _window_s
    from jigsaw_plugin.workload import parse_workload

    wl = parse_workload({"version": 1, "cluster": {"gpus": 8, "gpu": "h100", "gpus_per_node": 8}, "pipelines": [{
        "name": "bulk", "model": "qwen2.5-7b", "algorithm": "dapo", "mode": mode, "staleness": 1 if mode == "async" else 0,
        "prompts_per_step": 64, "samples_per_prompt": 8, "max_response_len": 1024, "steps": 3,
        "prompt_len": {"dist": "const", "value": 3000},
        "response_len": {"dist": "uniform", "low": 20, "high": 120}}]})
    ran = 0
    for name, sim, r in _every_policy(wl, seed=2):
        ran += 1
        b = compute_bounds(sim.world)
        p = sim.world.order[0]
        tail_token = _tail_token_s(sim.world.cost, p.model, _width_limit([sim.world.cost], p, 8))
        longest = max(float(np.max(np.add.reduceat(s.samples.gen_tokens, np.asarray(s.samples.turn_offset[:-1]))))
                      for s in p.steps.values()) * tail_token
        # the chain's generation is each step's work over the pool (a synchronous pipeline's
        # every step's; an asynchronous one's first step's here), not a response at batch 1
        assert b.chains[0].generation_s > 10 * longest, (name, b.chains[0], longest)
        if mode == "sync":
            assert b.critical_path_s > 1.1 * b.work_s  # the work spread over the run is below it
        assert r["makespan_s"] >= b.makespan_lower_bound_s, (name, r["makespan_s"], b)
    assert ran >= 4
    assert _window_s([sim.world.cost], p, 800.0, 8) == pytest.approx(
        100.0 - sim.world.cost.f.train_stage_overhead_s)  # dapo: one forward pass (old_log_prob)


def test_no_policy_beats_the_chain_of_a_synchronous_agent_whose_sandboxed_rewards_outlast_its_passes():
    # short turns, rewards of 40-80 s in a sandbox: each step's chain is its longest
    # trajectory and reward. Its forward passes may run while that reward is computed (early
    # passes in the reward wait), so the chain holds the longer of the two, not their sum:
    # jigsaw runs them there and ends within the passes' fixed costs of the chain (found by
    # a fuzz of small workloads: 294.8 s against a bound of 295.7 s that summed them)
    from jigsaw_plugin.core.bounds import _step_fixed_s
    from jigsaw_plugin.workload import parse_workload

    steps = 3
    wl = parse_workload({"version": 1, "cluster": {"gpus": 16, "gpu": "h100", "gpus_per_node": 8}, "pipelines": [{
        "name": "swe", "model": "qwen2.5-1.5b", "algorithm": "ppo", "mode": "sync",
        "prompts_per_step": 4, "samples_per_prompt": 2, "max_response_len": 16, "steps": steps,
        "prompt_len": {"dist": "const", "value": 200}, "response_len": {"dist": "uniform", "low": 4, "high": 16},
        "turns": {"dist": "categorical", "values": [2, 3], "weights": [0.5, 0.5]},
        "tool_latency_s": {"dist": "uniform", "low": 0.1, "high": 1.0},
        "observation_len": {"dist": "uniform", "low": 50, "high": 300},
        "reward": {"kind": "sandbox", "latency_s": {"dist": "uniform", "low": 40.0, "high": 80.0}}}]})
    ran = 0
    for name, sim, r in _every_policy(wl, seed=0):
        if name in ("one-step-off", "streamrl", "areal"):
            continue  # they run a synchronous spec a step off-policy, which its bound does not cover
        ran += 1
        b = compute_bounds(sim.world)
        assert b.critical_path_s > 10 * b.work_s
        assert r["makespan_s"] >= b.makespan_lower_bound_s, (name, r["makespan_s"], b)
        if name == "jigsaw":
            _, forward_fixed, _ = _step_fixed_s(sim.world, sim.world.order[0], last=False)
            assert forward_fixed > 0
            # the chain that summed reward and passes is beaten: they did overlap
            assert r["makespan_s"] < b.makespan_lower_bound_s + steps * forward_fixed, (r["makespan_s"], b)
    assert ran >= 3  # jigsaw, verl-sync, rollmux
