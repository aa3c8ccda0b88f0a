"""The disaggregated baselines size their rollout and training pools as the systems do,
from an offline profile of the workload (``estimates.balanced_split``): the split they
choose must be about as good as the best a sweep of every split finds, or jigsaw is
compared with a weakened baseline."""

import pytest

from jigsaw_plugin.costmodel import CostModel, hardware_profile
from jigsaw_plugin.core.pipelines import build_pipelines
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.scheduler.estimates import balanced_split
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import parse_workload


def _agentic_async(gpus: int) -> object:
    # a search agent: short turns, tool calls of seconds, long observations to prefill (what the
    # former estimate, the bulk decode and the longest response, left out: it chose 1 rollout
    # device of 8, 1.46x the best split's makespan under one-step-off)
    return parse_workload({"version": 1, "cluster": {"gpus": gpus, "gpu": "h100", "gpus_per_node": 8}, "pipelines": [{
        "name": "agent", "model": "qwen2.5-7b", "algorithm": "grpo", "mode": "async", "staleness": 1,
        "prompts_per_step": 128, "samples_per_prompt": 8, "max_response_len": 4096,
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.3, "min": 16},
        "response_len": {"dist": "lognormal", "median": 120, "sigma": 1.0, "min": 1},
        "turns": {"dist": "categorical", "values": [1, 2, 3, 4], "weights": [0.1, 0.4, 0.4, 0.1]},
        "tool_latency_s": {"dist": "lognormal", "median": 2.0, "sigma": 0.8, "min": 0},
        "observation_len": {"dist": "lognormal", "median": 1500, "sigma": 0.5, "min": 1},
        "steps": 4}]})


@pytest.mark.parametrize("policy", ["one-step-off", "areal"])
def test_the_profiled_split_is_about_as_good_as_the_best_of_a_sweep(policy):
    wl = _agentic_async(8)
    sweep = {r: Simulation(wl, get_policy(policy, rollout_gpus=r), seed=0).run()["makespan_s"] for r in range(1, 7)}
    p, = build_pipelines(wl)
    chosen = balanced_split(p, CostModel.for_nodes(hardware_profile("h100"), 8), 8)
    default = Simulation(wl, get_policy(policy), seed=0).run()["makespan_s"]
    assert default == pytest.approx(sweep[chosen])  # the default is the profiled split
    assert default <= 1.1 * min(sweep.values()), (chosen, sweep)


def test_the_split_may_be_given_per_pipeline():
    from jigsaw_plugin.errors import SpecError

    wl = _agentic_async(8)
    one = Simulation(wl, get_policy("one-step-off", rollout_gpus=3), seed=0).run()["makespan_s"]
    assert Simulation(wl, get_policy("one-step-off", rollout_gpus={"agent": 3}), seed=0).run()["makespan_s"] == one
    with pytest.raises(SpecError, match=r"one-step-off.rollout_gpus.*'nope'.*a pipeline of the workload: agent"):
        Simulation(wl, get_policy("one-step-off", rollout_gpus={"nope": 3}))
    with pytest.raises(SpecError, match=r"one-step-off.rollout_gpus.*'3'.*a multiple of 1 in 1..6"):
        Simulation(wl, get_policy("one-step-off", rollout_gpus={"agent": "3"}))


def test_streamrl_streams_forward_passes_over_the_batch_still_generating():
    # 2 rollout devices of 8 for long responses: the trainer waits on the next batch, so
    # StreamRL reads what has finished of it; one-step-off waits for the whole batch
    from tests.sim_helpers import small_workload

    wl = small_workload(gpus=8, pipelines=1, prompts=32, samples=8, steps=4, median=2500, max_len=16384,
                        models=("qwen2.5-7b",), algorithms=("grpo",), agentic=(False,), modes=("async",),
                        staleness=(1,))
    runs = {name: Simulation(wl, get_policy(name, rollout_gpus=2), seed=0).run() for name in ("one-step-off", "streamrl")}
    assert runs["one-step-off"]["pipelines"]["p0"]["early_passes"] == 0
    assert runs["streamrl"]["pipelines"]["p0"]["early_passes"] >= 3  # the next batch, while the last sync waits
    for r in runs.values():
        assert r["samples"] == 32 * 8 * 4 and r["pipelines"]["p0"]["max_staleness"] <= 1


def test_an_early_pass_two_steps_ahead_or_before_the_last_stage_is_refused():
    from jigsaw_plugin.core.executor import PolicyViolation
    from jigsaw_plugin.scheduler.decisions import RunStage
    from jigsaw_plugin.sim.world import World
    from tests.sim_helpers import small_workload

    wl = small_workload(gpus=8, pipelines=1, models=("qwen2.5-1.5b",), algorithms=("grpo",), agentic=(False,),
                        modes=("async",), staleness=(1,))
    world = World(wl, get_policy("one-step-off"), lambda ev: None)
    # step 1 is not the step to train next (0), and step 0 has more than its weight sync left
    with pytest.raises(PolicyViolation, match=r"early old_log_prob of step 1: only the step to train next \(0\), "
                                              r"or the one after when only its weight sync is left"):
        world.apply(RunStage("p0", 1, "old_log_prob", (0,), colocated=False, early=True))
