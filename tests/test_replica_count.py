"""The jigsaw policy starts no more rollout replicas for a step than it has requests: an
engine started for none is retired empty in the same instant, and a live pool pays its
start (weights loaded, CUDA graphs captured) for nothing."""

from __future__ import annotations

from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import parse_workload


def _workload(samples: int):
    return parse_workload({"version": 1, "cluster": {"gpus": 16, "gpu": "h100", "gpus_per_node": 8}, "pipelines": [
        {"name": "big", "model": "qwen2.5-7b", "algorithm": "grpo", "mode": "sync", "prompts_per_step": 1,
         "samples_per_prompt": samples, "max_response_len": 512, "gpus": 16, "rollout_tp": 2,
         "prompt_len": {"dist": "const", "value": 200},
         "response_len": {"dist": "lognormal", "median": 200, "sigma": 0.4, "min": 1}, "steps": 2}]})


def _launches(samples: int) -> list:
    pol = get_policy("jigsaw")
    seen: list = []
    decide = pol.decide

    def recording(state):
        out = decide(state)
        # a step's starts (a tail re-sharded wider absorbs replicas: not a start)
        seen.extend((state.t, a) for a in out if isinstance(a, LaunchReplica) and not a.rebalance and not a.absorb)
        return out

    pol.decide = recording
    res = Simulation(_workload(samples), pol, seed=0).run()
    assert res["pipelines"]["big"]["samples"] == 2 * samples
    return seen


def test_a_step_of_fewer_requests_than_home_groups_starts_one_replica_a_request():
    # a home of 8 tp2 groups, 4 samples a step: 4 replicas each step, not 8
    starts: dict = {}
    for t, a in _launches(4):
        starts[t] = starts.get(t, 0) + 1
    assert starts and max(starts.values()) <= 4


def test_a_step_of_more_requests_than_home_groups_still_fills_its_home():
    starts: dict = {}
    for t, a in _launches(64):
        starts[t] = starts.get(t, 0) + 1
    assert max(starts.values()) >= 8
