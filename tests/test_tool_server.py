"""The tool server (runtime/tool_server.py) as a real process on loopback, and the agentic
adapter (runtime/reference/agentic.py) with LiveExecutor on EMULATED engines."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.reference.agentic import AgenticTools, SandboxReward
from jigsaw_plugin.runtime.reference.reward import low_id_reward
from jigsaw_plugin.runtime.tool_server import (
    ToolClient,
    ToolPipelineConfig,
    ToolServer,
    ToolServerConfig,
    ToolServerError,
    needs_tool_server,
    tool_server_config,
)

AGENT = ToolPipelineConfig("agent", {"dist": "uniform", "low": 0.02, "high": 0.1}, {"dist": "const", "value": 7},
                           {"dist": "const", "value": 0.05})
PLAIN = ToolPipelineConfig("plain", None, None, {"dist": "const", "value": 0.0})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of this process still answers kill(0): ask the OS for its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def server():
    with ToolServer(ToolServerConfig((AGENT, PLAIN), seed=3, sandbox_timeout_s=0.5)) as s:
        yield s


@pytest.fixture(scope="module")
def roomy_server():
    """For runs of the executor: a sandbox limit no loaded machine reaches (starting the
    sandbox's subprocess alone took over 0.5 s at a load average of 9)."""
    with ToolServer(ToolServerConfig((AGENT, PLAIN), seed=3, sandbox_timeout_s=30.0)) as s:
        yield s


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_tool_latencies_follow_the_workload_distribution_and_calls_overlap(server):
    client = ToolClient(server.url)

    async def many():
        return await asyncio.gather(*(client.tool("agent", f"r{i}", 1, [5, 6, i]) for i in range(40)))

    t0 = time.perf_counter()
    replies = _run(many())
    wall = time.perf_counter() - t0
    lat = [r.latency_s for r in replies]
    assert all(0.02 <= x <= 0.1 for x in lat)
    assert abs(sum(lat) / len(lat) - 0.06) < 0.015  # uniform(0.02, 0.1): mean 0.06, sd of 40 draws' mean 0.004
    assert all(r.wall_s >= r.latency_s for r in replies)  # the server really waited
    assert all(len(r.observation) == 7 for r in replies)  # observation_len: const 7
    assert wall < sum(lat)  # 40 calls waited at once, not one after another
    again = _run(client.tool("agent", "r3", 1, [5, 6, 3]))  # seeded per (pipeline, request, turn)
    assert again.latency_s == replies[3].latency_s and again.observation == replies[3].observation
    other = _run(client.tool("agent", "r3", 2, [5, 6, 3]))
    assert other.latency_s != replies[3].latency_s


def test_the_callers_latency_and_observation_length_are_used(server):
    reply = _run(ToolClient(server.url).tool("agent", "x", 0, [1], latency_s=0.15, observation_tokens=3))
    assert reply.latency_s == 0.15 and reply.wall_s >= 0.15 and len(reply.observation) == 3
    assert all(0 <= t < 2048 for t in reply.observation)


def test_sandboxed_reward_runs_the_rule_in_a_subprocess(server):
    response, mask = [1, 2000, 3, 1500, 7], [1, 1, 0, 1, 1]
    reply = _run(ToolClient(server.url).reward("agent", "q0", response, mask, latency_s=0.1))
    want = low_id_reward().batch([([0], response, 0, mask)])[0]
    assert reply.reward == want == 0.5
    assert reply.latency_s == 0.1 and reply.sandbox_s >= 0.1 and reply.wall_s >= reply.sandbox_s


def test_sandbox_timeout_is_a_clear_failure(server):
    t0 = time.perf_counter()
    with pytest.raises(ToolServerError) as err:
        _run(ToolClient(server.url).reward("agent", "slow", [1, 2], latency_s=5.0))
    assert time.perf_counter() - t0 < 4.0  # killed at the 0.5 s limit, not waited out
    msg = str(err.value)
    assert "504" in msg and "sandbox_timeout_s=0.5" in msg and "slow" in msg and "killed" in msg


@pytest.mark.parametrize("path, body, words", [
    ("/tool", {"pipeline": "agent", "request_id": "a", "turn": "one", "query": [1]}, ["turn", "'one'", "integer"]),
    ("/tool", {"pipeline": "nope", "request_id": "a", "turn": 0, "query": [1]}, ["pipeline", "'nope'", "agent, plain"]),
    ("/tool", {"pipeline": "plain", "request_id": "a", "turn": 0, "query": [1]}, ["pipeline", "no turns"]),
    ("/tool", {"pipeline": "agent", "request_id": "a", "turn": 0}, ["query", "required"]),
    ("/tool", {"pipeline": "agent", "request_id": "a", "turn": 0, "query": [1, -2]}, ["query", "token ids"]),
    ("/reward", {"pipeline": "agent", "request_id": "a", "response": [1, 2], "mask": [1]}, ["mask", "length (2)"]),
    ("/reward", {"pipeline": "agent", "request_id": "a", "response": [1], "latency_s": -1}, ["latency_s", "-1"]),
    ("/nothing", {}, ["path", "/nothing", "/tool"]),
])
def test_a_bad_request_gets_a_message_naming_the_field(server, path, body, words):
    with pytest.raises(ToolServerError) as err:
        _run(ToolClient(server.url).post(path, body))
    assert all(w in str(err.value) for w in words), str(err.value)


def test_bad_configuration_is_a_spec_error():
    with pytest.raises(SpecError, match="sandbox_timeout_s"):
        ToolServerConfig((AGENT,), sandbox_timeout_s=0)
    with pytest.raises(SpecError, match="loopback"):
        ToolServerConfig((AGENT,), host="0.0.0.0")
    with pytest.raises(SpecError, match="tool_server_url"):
        ToolClient("localhost:80")


def test_stop_ends_the_process_and_frees_the_port():
    s = ToolServer(ToolServerConfig((AGENT,))).start()
    pid, url = s.pid, s.url
    assert _alive(pid)
    s.stop()
    assert not _alive(pid)
    with pytest.raises(OSError):
        _run(ToolClient(url).post("/tool", {}))
    s.stop()  # twice is fine


def test_no_orphan_when_the_runner_is_killed(tmp_path):
    """The server exits by itself when the process that started it dies (SIGKILL: no clean-up ran)."""
    script = textwrap.dedent("""
        import sys, time
        from jigsaw_plugin.runtime.tool_server import ToolPipelineConfig, ToolServer, ToolServerConfig
        s = ToolServer(ToolServerConfig((ToolPipelineConfig("a", None, None, {"dist": "const", "value": 0}),)))
        s.start()
        print(s.pid, flush=True)
        time.sleep(60)
    """)
    runner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(runner.stdout.readline())
        assert _alive(pid)
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.stdout.close()


def test_needs_and_config_from_a_workload():
    from jigsaw_plugin.workload import load_workload

    wl = load_workload("examples/workloads/real_ab_agentic_2cpu.yaml")
    assert needs_tool_server(wl)
    cfg = tool_server_config(wl, seed=2)
    agent, grpo = cfg.pipelines
    assert agent.tool_latency_s["dist"] == "quantiles" and agent.reward_latency_s["dist"] == "lognormal"
    assert grpo.tool_latency_s is None and cfg.seed == 2
    assert ToolServerConfig.from_json(cfg.to_json()) == cfg
    assert not needs_tool_server(load_workload("examples/workloads/real_ab_2cpu.yaml"))


def test_agentic_pipeline_on_emulated_engines_calls_the_tool_server(roomy_server):
    """LiveExecutor with ``tools``: every tool call of the workload goes to the server (the
    observation it answers is what the next turn reads), every sandboxed trajectory's reward
    comes from the sandbox, and the event log shows the turns and the tool waits."""
    from jigsaw_plugin.costmodel import CostModel, hardware_profile
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
    from jigsaw_plugin.runtime.emulated import EmulatedEngine
    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.runtime.reference import ReferenceStageRunner
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.workload import parse_workload

    spec = {"version": 1, "cluster": {"gpus": 2, "gpu": "h100"}, "pipelines": [{
        "name": "agent", "model": "qwen2.5-0.5b", "algorithm": "grpo", "prompts_per_step": 2,
        "samples_per_prompt": 2, "max_response_len": 512, "prompt_len": 8, "response_len": 10,
        "turns": {"dist": "categorical", "values": [2, 3], "weights": [0.5, 0.5]},
        "tool_latency_s": 0.5, "observation_len": 4,
        "reward": {"kind": "sandbox", "latency_s": 0.5}, "steps": 2}]}
    wl = parse_workload(spec)
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    rec = EventRecorder(include_progress=False)
    register(pm, rec, name="recorder")
    tools = AgenticTools(ToolClient(roomy_server.url))

    class Trainer:  # a stand-in trainer: no torch in the core suite
        version = 0

        def old_log_prob(self, batch):
            return None

        def ref_log_prob(self, batch):
            return None

        def update_actor(self, batch, old, adv, ref):
            self.version += 1
            return {}

        def state_dict_bf16(self):
            return {}

        def get_version(self):
            return self.version

    runner = ReferenceStageRunner(Trainer(), reward=SandboxReward(tools))
    cost = CostModel(hardware_profile("h100"))
    live = LiveExecutor(wl, get_policy("verl-sync"), lambda p, d: EmulatedEngine(cost, p.model, tp=len(d),
                                                                                time_scale=0.02),
                        seed=0, time_scale=0.02, stage_runner=runner, tools=tools, hooks=Emitter(pm),
                        record_requests=True)
    asyncio.run(asyncio.wait_for(live.run(), 60))

    turns = sum(int(live.pipelines["agent"].steps[k].samples.turns.sum()) for k in (0, 1))
    starts = [e for e in rec.events if e["hook"] == "jigsaw_tool_call_start"]
    ends = [e for e in rec.events if e["hook"] == "jigsaw_tool_call_end"]
    submitted = [e for e in rec.events if e["hook"] == "jigsaw_request_submitted"]
    assert len(starts) == len(ends) == turns - 8 > 0  # a tool call after every turn but the last
    assert len(submitted) == turns
    assert all(e["observation_tokens"] == 4 for e in ends)
    assert {(e["request_id"], e["turn"]) for e in starts} == {(e["request_id"], e["turn"]) for e in ends}
    summary = tools.summary()["agent"]
    assert summary["tool"]["calls"] == turns - 8 and summary["reward"]["calls"] == 8
    assert runner.reward.from_sandbox == 8 and len(runner.rewards) == 2


def test_sandbox_reward_hands_out_each_answer_once_and_the_rule_for_the_rest():
    tools = AgenticTools(client=None)
    key = ((1, 2), (5, 1500))
    tools.sandbox_rewards[key] = [0.25, 0.75]  # two samples of one prompt with the same tokens
    reward = SandboxReward(tools)
    batch = [([1, 2], [5, 1500], 0, [1, 1]), ([1, 2], [5, 1500], 0, [1, 1]), ([3], [7, 9], 1, [1, 0])]
    assert reward.batch(batch) == [0.25, 0.75, 1.0]  # the third: the rule (mask-1 tokens < 1024)
    assert reward.from_sandbox == 2 and tools.sandbox_rewards == {}


# ---- a second replica of the agentic pipeline, launched mid-rollout ------------------------------
class _Engine:
    """EMULATED engine with the weight interface a pooled vLLM engine has (runtime/engine_pool.py
    lends it through the same ``PooledEngine``); records what each segment was asked to continue."""

    def __init__(self, cost, model, device: int, seen: list):
        from jigsaw_plugin.runtime.emulated import EmulatedEngine

        self.inner, self.device, self.seen = EmulatedEngine(cost, model, time_scale=0.02), device, seen
        self.loaded: list = []  # versions loaded, in order
        self.version = 0  # the run's initial weights (the pool's reset)

    async def generate(self, request_id, prompt_token_ids, max_tokens, **sampling):
        version = self.version  # the weights this segment is generated with
        out = await self.inner.generate(request_id, prompt_token_ids, max_tokens)
        self.seen.append((self.device, request_id, list(prompt_token_ids), list(out), version))
        return out

    async def abort(self, request_id, missing_ok=True):
        return await self.inner.abort(request_id)

    async def load_weights(self, state_dict, version=None):
        self.loaded.append(version)
        self.version = version


def _second_replica_policy(rebalance: bool):
    """verl-sync on the agent's static share (device 0), plus a hand-built decision: while a
    step generates on its one replica and some of its trajectories wait on a tool, launch
    a second replica on the idle device 1 (what jigsaw's idle fill decides)."""
    from jigsaw_plugin.scheduler.baselines import VerlSync
    from jigsaw_plugin.scheduler.decisions import LaunchReplica

    class SecondReplica(VerlSync):
        name = "test-second-replica"

        def decide(self, state) -> list:
            out = super().decide(state)
            p = state.order[0]
            step = p.steps.get(p.gen_next - 1)
            if (p.generating and len(p.replicas) == 1 and 1 in state.free and step is not None
                    and state.t > step.gen_start_t + 0.3  # a turn has ended: trajectories wait on tools
                    and 0 < p.replicas[0].load < step.samples - step.gen_done):
                out.append(LaunchReplica(p.name, (1,), rebalance=rebalance))
            return out

    return SecondReplica()


def _run_second_replica(server, rebalance: bool):
    from jigsaw_plugin.costmodel import CostModel, hardware_profile
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register
    from jigsaw_plugin.runtime.engine_pool import PooledEngine
    from jigsaw_plugin.runtime.live import LiveExecutor
    from jigsaw_plugin.runtime.reference import ReferenceStageRunner
    from jigsaw_plugin.workload import parse_workload

    wl = parse_workload({"version": 1, "cluster": {"gpus": 2, "gpu": "h100"}, "pipelines": [{
        "name": "agent", "model": "qwen2.5-0.5b", "algorithm": "grpo", "prompts_per_step": 4,
        "samples_per_prompt": 2, "max_response_len": 2048, "prompt_len": 8,
        "response_len": {"dist": "uniform", "low": 20, "high": 200},
        "turns": {"dist": "categorical", "values": [3, 4], "weights": [0.5, 0.5]},
        "tool_latency_s": {"dist": "uniform", "low": 0.2, "high": 1.0}, "observation_len": 4,
        "reward": {"kind": "rule", "latency_s": 0.0}, "steps": 2, "gpus": 1}]})
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    rec = EventRecorder(include_progress=False)
    register(pm, rec, name="recorder")
    tools = AgenticTools(ToolClient(server.url))
    trained: dict = {}

    class Trainer:  # a stand-in trainer: no torch in the core suite
        version = 0

        def old_log_prob(self, batch):
            return None

        def ref_log_prob(self, batch):
            return None

        def update_actor(self, batch, old, adv, ref):
            trained.setdefault(self.version, []).append(list(batch))
            self.version += 1
            return {}

        def state_dict_bf16(self):
            return {}

        def get_version(self):
            return self.version

    runner = ReferenceStageRunner(Trainer(), reward=SandboxReward(tools))
    cost = CostModel(hardware_profile("h100"))
    seen: list = []  # (device, segment id, prompt, output, weight version), per finished segment
    engines: dict = {}  # device -> its engine, made at the first lend (the pool starts them up front)
    state = {d: {"version": 0} for d in (0, 1)}  # the pool's per-device record, shared across lends

    def lend(p, devices):
        engine = engines.setdefault(devices[0], _Engine(cost, p.model, devices[0], seen))
        return PooledEngine(engine, p.name, runner.latest_weights, state[devices[0]])

    live = LiveExecutor(wl, _second_replica_policy(rebalance), lend, seed=0, time_scale=0.02, stage_runner=runner,
                        tools=tools, hooks=Emitter(pm), record_requests=True)
    asyncio.run(asyncio.wait_for(live.run(), 60))
    return live, rec.events, seen, trained, engines


@pytest.mark.parametrize("rebalance", [True, False])
def test_a_second_replica_launched_mid_rollout_takes_over_tool_waiting_trajectories(roomy_server, rebalance):
    """LaunchReplica(agent, device 1, rebalance=True) while the step generates on device 0:
    trajectories waiting on a tool resume on the new replica with their whole context (prompt,
    earlier turns, observations), on the step's weights (loaded into the parked engine before its
    first request), and every sample is trained once at its full length. Without rebalance the
    turns stay on their replica (sticky), and the new one gets nothing: the mechanism is what moves them."""
    from jigsaw_plugin.ids import RequestId

    live, events, seen, trained, engines = _run_second_replica(roomy_server, rebalance)
    launches = [e for e in events if e["hook"] == "jigsaw_lease_granted" and tuple(e["devices"]) == (1,)]
    assert len(launches) == 2  # once per step, mid-rollout
    gen_start = {e["step"]: e["t"] for e in events if e["hook"] == "jigsaw_request_submitted" and e["turn"] == 0}
    assert all(e["t"] > min(gen_start.values()) for e in launches)
    on_new = [(RequestId.parse(r.split("#")[0]), prompt, out) for d, r, prompt, out, _ in seen if d == 1]
    if not rebalance:
        assert on_new == []  # sticky: every turn stays where its trajectory started
        return
    resumed = [x for x in on_new if x[0].turn > 0]
    assert resumed, "no tool-waiting trajectory resumed on the new replica"
    earlier = {(RequestId.parse(r.split("#")[0]).trajectory, RequestId.parse(r.split("#")[0]).turn): d
               for d, r, _, _, _ in seen}
    assert any(earlier[(rid.trajectory, rid.turn - 1)] == 0 for rid, _, _ in resumed)  # moved from device 0
    # each resumed turn continued its trajectory: the prompt it got is the trained sample's prefix
    for rid, prompt, out in resumed:
        (batch,) = trained[rid.step]
        sp, resp, _, _ = batch[rid.sample]
        full = list(sp) + list(resp)
        assert full[:len(prompt)] == prompt and full[len(prompt):len(prompt) + len(out)] == out
    # weights: every segment of step k ran on version k; the parked engine loaded version 1 itself
    assert {RequestId.parse(r.split("#")[0]).step: v for _, r, _, _, v in seen} == {0: 0, 1: 1}
    assert all(v == RequestId.parse(r.split("#")[0]).step for _, r, _, _, v in seen)
    assert 1 in engines[1].loaded
    # nothing lost: each sample trained once, at its full length
    for k in (0, 1):
        smp = live.pipelines["agent"].steps[k].samples
        (batch,) = trained[k]
        generated = smp.generated_per_sample()
        assert len(batch) == smp.n == 8
        for i, (_, response, _, mask) in enumerate(batch):
            assert sum(mask) == int(generated[i]) and len(response) == len(mask)
