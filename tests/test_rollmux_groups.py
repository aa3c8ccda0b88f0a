"""RollMux's inter-group plan (scheduler/groups.py): which jobs share a co-execution group
and how each group's devices split into rollout and training pools."""

from __future__ import annotations

import pytest

from jigsaw_plugin.core.snapshot import build_state
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.scheduler.estimates import gen_profile_s
from jigsaw_plugin.scheduler.groups import _groupings, plan_groups, round_robin_period_s
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import parse_workload


def _pipe(name, model, algorithm, gpus, prompts, samples, max_len, median, steps=2):
    return {"name": name, "model": model, "algorithm": algorithm, "mode": "sync",
            "prompts_per_step": prompts, "samples_per_prompt": samples, "max_response_len": max_len,
            "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "min": 8},
            "response_len": {"dist": "lognormal", "median": median, "sigma": 0.9, "min": 1},
            "steps": steps, "gpus": gpus}


def _workload(pipes, gpu="h100"):
    return parse_workload({"version": 1, "cluster": {"gpus": sum(p["gpus"] for p in pipes), "gpu": gpu,
                                                     "gpus_per_node": 8}, "pipelines": pipes})


def _state(wl, policy="verl-sync"):
    return build_state(Simulation(wl, get_policy(policy)).world)


# long responses, a light update: generation dominates its step
def _rollout_heavy(name):
    return _pipe(name, "qwen2.5-1.5b", "dapo", 8, 64, 16, 16384, 4000)


# short responses, PPO's actor and critic on a 7B: training dominates its step
def _training_heavy(name):
    return _pipe(name, "qwen2.5-7b", "ppo", 8, 1024, 1, 1024, 150)


def test_round_robin_period():
    # each pool serves both jobs once a period; a job's next rollout waits for its training
    assert round_robin_period_s([10.0, 20.0], [30.0, 5.0]) == 40.0  # job 0: 10 + 30
    assert round_robin_period_s([10.0, 20.0], [5.0, 5.0]) == 30.0  # the rollout pool: 10 + 20
    assert round_robin_period_s([7.0], [3.0]) == 10.0  # alone: disaggregated, in sequence


def test_groupings_cover_every_job_once():
    got = list(_groupings(["a", "b", "c", "d"]))
    assert len(got) == 10  # the involutions of 4: every way to cut into singles and pairs
    for grouping in got:
        assert sorted(x for g in grouping for x in g) == ["a", "b", "c", "d"]
        assert all(1 <= len(g) <= 2 for g in grouping)


def test_plan_pairs_complementary_jobs():
    # listed so that pairing in order would put like with like (both rollout-heavy jobs on
    # one rollout pool): the plan pairs each rollout-heavy job with a training-heavy one
    wl = _workload([_rollout_heavy("r0"), _rollout_heavy("r1"), _training_heavy("t0"), _training_heavy("t1")])
    state = _state(wl)
    plan = plan_groups(list(state.order), state.cost)
    assert sorted(sorted(g.names) for g in plan) == [["r0", "t0"], ["r1", "t1"]] or \
        sorted(sorted(g.names) for g in plan) == [["r0", "t1"], ["r1", "t0"]]
    for g in plan:
        assert len(g.devices) == 16 and 0 < g.rollout < 16
        assert g.period_s > 0 and g.estimate_s >= g.period_s


def test_training_pool_is_not_starved():
    # a long-response 14B DAPO job beside a 32B PPO job with 2,048 prompts a step: sizing the
    # pair's pools by the larger of the jobs' own splits left the PPO job's actor and critic
    # updates two devices (6,729 s, 10x verl-sync's makespan). RollMux cannot match verl-sync
    # here (its rollout pool serves one job at a time and the DAPO job's generation is its
    # tail, about 220 s on any pool), but the round-robin's pools keep it within 2x (1,258 s)
    pipes = [_pipe("long-dapo", "qwen3-14b", "dapo", 10, 32, 1, 32768, 9600),
             _pipe("big-ppo", "qwen2.5-32b", "ppo", 30, 2048, 1, 8192, 1700)]
    wl = _workload(pipes)
    rollmux = Simulation(wl, get_policy("rollmux")).run()
    verl = Simulation(wl, get_policy("verl-sync")).run()
    assert rollmux["makespan_s"] < 2.0 * verl["makespan_s"], (rollmux["makespan_s"], verl["makespan_s"])
    for p in wl.pipelines:
        assert rollmux["pipelines"][p.name]["samples"] == p.steps * p.samples_per_step


def test_generation_profile_tracks_the_simulated_generation():
    # the planner's profile of a step's generation against the simulator's, one job alone on
    # a disaggregated rollout pool of n devices (one-step-off with that split)
    pipe = _pipe("dapo", "qwen2.5-1.5b", "dapo", 16, 64, 16, 8192, 1500, steps=2)
    for n in (2, 8):
        wl = _workload([pipe])
        sim = Simulation(wl, get_policy("one-step-off", rollout_gpus=n))
        state = build_state(sim.world)
        profiled = gen_profile_s(state.order[0], state.cost, n)
        simulated = sim.run()["pipelines"]["dapo"]["stage_s"]["gen"]
        assert 0.6 * simulated < profiled < 1.5 * simulated, (n, profiled, simulated)


def test_too_small_a_group_is_a_clear_error():
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.gpus"):
        Simulation(_workload([_pipe("one", "qwen2.5-1.5b", "grpo", 1, 8, 4, 1024, 200)]), get_policy("rollmux"))
