"""The executor's record of each step's wait on its rewards (``stage_history_s["reward"]``),
which ``reward_wait`` reads: from the step's last generated trajectory to its last reward."""

from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import parse_workload


def _workload(reward_s: float):
    pipe = {"name": "p0", "model": "qwen2.5-1.5b", "algorithm": "grpo", "mode": "sync", "prompts_per_step": 8,
            "samples_per_prompt": 4, "max_response_len": 1024, "steps": 3,
            "prompt_len": {"dist": "const", "value": 100}, "response_len": {"dist": "lognormal", "median": 200,
                                                                            "sigma": 0.5, "min": 1},
            "reward": {"kind": "sandbox", "latency_s": {"dist": "const", "value": reward_s}}}
    return parse_workload({"version": 1, "cluster": {"gpus": 4, "gpu": "h100", "gpus_per_node": 4},
                           "pipelines": [pipe]})


def test_each_step_records_its_wait_from_the_last_trajectory_to_the_last_reward():
    sim = Simulation(_workload(7.0), get_policy("jigsaw"), 0)
    sim.run()
    p = sim.world.pipelines["p0"]
    waits = p.stage_history["reward"]
    assert len(waits) == 3
    for w, k in zip(waits, sorted(p.steps)):
        s = p.steps[k]
        assert abs(w - (s.reward_end_t - s.gen_end_t)) < 1e-9
        # the last trajectory's reward takes its whole 7 s after the generation ends
        assert 7.0 - 1e-9 <= w < 7.0 + 1e-6
