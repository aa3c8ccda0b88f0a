"""The same pure policies driving live (EMULATED) engines through the router in real time."""

import pytest

from jigsaw_plugin.costmodel import CostModel, hardware_profile
from jigsaw_plugin.runtime.emulated import EmulatedEngine
from jigsaw_plugin.runtime.live import run_live
from jigsaw_plugin.scheduler import get_policy
from sim_helpers import HookLog, small_workload

COST = CostModel(hardware_profile("h100"))


def factory(pipeline, devices):
    return EmulatedEngine(COST, pipeline.model, tp=len(devices), time_scale=0.02)


@pytest.mark.parametrize("policy", ["verl-sync", "one-step-off", "areal", "streamrl", "jigsaw"])
def test_live_run_processes_every_sample_once(policy):
    wl = small_workload(gpus=8, pipelines=2, prompts=4, samples=4, steps=2, median=200,
                        modes=("sync", "async"), staleness=(0, 1))
    log = HookLog()
    pol = get_policy(policy)
    r = run_live(wl, pol, factory, time_scale=0.02, hooks=log, record_requests=True)
    assert r["backend"] == "emulated"
    assert r["samples"] == 2 * 2 * 16
    finished = [(e["request_id"], e["turn"]) for e in log.by("jigsaw_request_finished")]
    assert len(finished) == len(set(finished))  # exactly once
    bound = {p.name: pol.staleness_bound(type("P", (), {"spec": p})) for p in wl.pipelines}
    for name, pr in r["pipelines"].items():
        assert pr["steps"] == 2
        assert pr["max_staleness"] <= bound[name]
    assert r["scheduler"]["decisions"] > 0
    # where each pipeline's time went, from the live executor's record as from the simulator's
    for name, c in r["chain_split"].items():
        parts = [c[k] for k in ("generation_s", "training_s", "weight_sync_s", "waiting_s")]
        assert min(parts) >= -1e-6 and sum(parts) == pytest.approx(c["finish_s"]), (policy, name, c)
        assert c["generation_s"] > 0 and c["training_s"] > 0


def test_a_live_run_emits_the_hook_events_its_sub_stage_graph_is_built_from():
    from jigsaw_plugin.events import EventRecorder
    from jigsaw_plugin.graph import build_from_events
    from jigsaw_plugin.manager import Emitter, get_plugin_manager, register

    wl = small_workload(gpus=4, pipelines=2, prompts=2, samples=4, steps=2, median=100)
    pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
    rec = EventRecorder(include_progress=False)
    register(pm, rec, name="recorder")
    run_live(wl, get_policy("jigsaw"), factory, time_scale=0.02, hooks=Emitter(pm), record_requests=True)
    hooks = [e["hook"] for e in rec.events]
    assert hooks[:4] == ["jigsaw_register_pipeline", "jigsaw_pipeline_start"] * 2
    # one submission and one finish per turn (samples may have several turns)
    assert hooks.count("jigsaw_request_submitted") == hooks.count("jigsaw_request_finished") >= 2 * 2 * 8
    g = build_from_events(rec.events, pipeline=wl.pipelines[0].name)
    g.validate()
    kinds = [n.kind for n in g.nodes()]
    assert kinds.count("rollout_request") == 2 * 8 and {"update_actor", "weight_sync"} <= set(kinds)


def test_areal_interrupts_live_rollouts_on_a_weight_sync_and_loses_nothing():
    aborts = []

    class Counting(EmulatedEngine):
        async def abort(self, request_id):
            aborts.append(request_id)
            return await super().abort(request_id)

    wl = small_workload(gpus=8, pipelines=2, prompts=4, samples=4, steps=3, median=400,
                        modes=("async", "async"), staleness=(1, 1))
    log = HookLog()
    r = run_live(wl, get_policy("areal"), lambda p, d: Counting(COST, p.model, tp=len(d), time_scale=0.02),
                 time_scale=0.02, hooks=log, record_requests=True)
    assert aborts  # weight syncs landed mid-generation and interrupted running segments
    assert r["samples"] == 2 * 3 * 16
    finished = [(e["request_id"], e["turn"]) for e in log.by("jigsaw_request_finished")]
    assert len(finished) == len(set(finished))  # each turn finished exactly once despite the interrupts


def test_a_live_run_measures_its_tool_calls_from_call_to_return():
    import asyncio

    from jigsaw_plugin.runtime.live import LiveExecutor, run_executor

    wl = small_workload(gpus=8, pipelines=2, prompts=4, samples=2, steps=1, median=100, agentic=(False, True))
    ex = LiveExecutor(wl, get_policy("jigsaw"), factory, 0, time_scale=0.02)
    asyncio.run(run_executor(ex, "emulated"))
    smp = ex.pipelines["p1"].steps[0].samples
    drawn = [float(smp.tool_latency_s[int(smp.turn_offset[i]) + t]) for i in range(len(smp.turns))
             for t in range(int(smp.turns[i]) - 1)]
    seen = ex.pipelines["p1"].observed
    assert seen.tools == len(drawn) > 0 and ex.pipelines["p0"].observed.tools == 0
    mean = sum(drawn) / len(drawn)
    # wall-clock sleeps at 1/50 of workload time: late by scheduling jitter, never early
    assert mean - 1e-3 <= seen.tool_mean_s() <= mean + 0.5
    # and each reward from its trajectory's last token to its score
    rewards = [float(x) for x in smp.reward_latency_s]
    assert seen.rewards == len(rewards)
    assert sum(rewards) / len(rewards) - 1e-3 <= seen.reward_mean_s() <= sum(rewards) / len(rewards) + 0.5


def test_a_spread_replica_takes_live_requests_and_loses_none():
    # LaunchReplica(spread=True) on live engines: once a replica decodes several requests
    # and a device is free, a new replica there takes requests from the most loaded by
    # migration (abort + resume); every sample still finishes exactly once
    from jigsaw_plugin.scheduler import LaunchReplica, RunStage
    from jigsaw_plugin.scheduler.jigsaw import Jigsaw

    class SpreadOnce(Jigsaw):
        def __init__(self):
            super().__init__(critical_spread=False, migration=False)  # no move but the spread's
            self.spread = []

        def decide(self, state):
            out = super().decide(state)
            if self.spread:
                return out
            taken = {d for x in out if isinstance(x, (LaunchReplica, RunStage)) for d in x.devices}
            free = sorted(d for d in state.free if d not in taken)
            for p in state.order:
                crowded = [r for r in p.replicas if not r.retiring and r.load >= 4 and r.tp == 1]
                if p.generating and crowded and free:
                    self.spread.append(LaunchReplica(p.name, (free[0],), spread=True))
                    return out + self.spread
            return out

    wl = small_workload(gpus=8, pipelines=2, prompts=4, samples=4, steps=2, median=400)
    log = HookLog()
    pol = SpreadOnce()
    r = run_live(wl, pol, factory, time_scale=0.02, hooks=log, record_requests=True)
    assert pol.spread  # the decision was made ...
    assert sum(p["migrations"] for p in r["pipelines"].values()) > 0  # ... and moved requests
    assert r["samples"] == 2 * 2 * 16
    finished = [(e["request_id"], e["turn"]) for e in log.by("jigsaw_request_finished")]
    assert len(finished) == len(set(finished))
