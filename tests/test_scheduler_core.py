"""The scheduler core: decisions depend on observations only, both executors go through
the hooks, no policy code reads a true length, the runtime does not import the simulator."""

import ast
from pathlib import Path

import numpy as np
import pytest

from jigsaw_plugin import workload as workload_mod
from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.manager import get_plugin_manager, register
from jigsaw_plugin.runtime.emulated import EmulatedEngine
from jigsaw_plugin.runtime.live import run_live
from jigsaw_plugin.scheduler import RetireReplica, get_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica, ResizeStage, RunStage, StartGen
from jigsaw_plugin.scheduler.jigsaw import Jigsaw
from jigsaw_plugin.sim import Simulation
from sim_helpers import small_workload

PKG = Path(__file__).resolve().parents[1] / "jigsaw_plugin"


class _DecisionLog:
    """Records every decide round's time and decisions (defers to the policy)."""

    def __init__(self, policy):
        self.policy, self.rounds, self.finished = policy, [], {}

    def __getattr__(self, hook):  # the executor's event sink: keeps when each request ended
        if hook == "jigsaw_request_finished":
            return lambda request_id, t, **_: self.finished.__setitem__(request_id, t)
        if hook.startswith("jigsaw_"):
            return lambda **_: None
        raise AttributeError(hook)

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        out = self.policy.decide(state)
        self.rounds.append((state.t, tuple(out)))
        return out


def _run(wl, sampler, seed=1, predictor="history"):
    pm = get_plugin_manager(load_entrypoints=False)
    policy = get_policy("jigsaw")
    log = _DecisionLog(policy)
    register(pm, log, "decision-log")
    original = workload_mod.sample_step
    workload_mod.sample_step = sampler
    try:
        sim = Simulation(wl, policy, seed=seed, pm=pm, predictor=predictor, hooks=log, record_requests=True)
        sim.run()
    finally:
        workload_mod.sample_step = original
    sim.finished_t = log.finished  # trajectory id -> when its last turn ended
    return sim, log.rounds


def test_decisions_depend_only_on_observations():
    """Two runs whose hidden lengths differ only for the longest request of step 0 (still
    in flight when the others end) decide identically until that request's original end,
    the first event at which the runs differ observably."""
    # tail-heavy, three pipelines (one async): migrations and widening act in the tails; no
    # length near the budget, so the perturbation stays hidden (with the oracle predictor
    # these runs diverge at t=16 s, long before the first observable difference at ~95 s)
    wl = small_workload(gpus=16, pipelines=3, prompts=16, samples=8, steps=2, median=1200, agentic=(False, False),
                        modes=("sync", "sync", "async"), staleness=(0, 0, 1), max_len=32768)
    original = workload_mod.sample_step
    longest = {}

    def longer(spec, step, seed):
        s = original(spec, step, seed)
        if step == 0:
            k = int(np.argmax(s.gen_tokens))
            longest[spec.name] = (k, int(s.gen_tokens[k]))
            s.gen_tokens[k] += 6000  # hidden: nothing observable changes before it would have ended
        return s

    sim_a, rounds_a = _run(wl, original)
    sim_b, rounds_b = _run(wl, longer)
    _, oracle_a = _run(wl, original, predictor="oracle")
    _, oracle_b = _run(wl, longer, predictor="oracle")
    # when the perturbed requests end in run A: the first observable difference
    first_diff_t = min(sim_a.finished_t[f"{name}/0/{k}"] for name, (k, _) in longest.items())
    before_a = [r for r in rounds_a if r[0] < first_diff_t]
    before_b = [r for r in rounds_b if r[0] < first_diff_t]
    assert len(before_a) > 5
    assert before_a == before_b
    # the check can fail: the oracle ablation, which reads true lengths, decides differently
    assert [r for r in oracle_a if r[0] < first_diff_t] != [r for r in oracle_b if r[0] < first_diff_t]


def test_no_policy_code_reads_a_true_length():
    forbidden = ("target", "finish_p", "max_finish_p", "gen_tokens", "remaining_s", "true_length")
    for path in (PKG / "scheduler").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert node.attr not in forbidden, f"{path.name}:{node.lineno} reads .{node.attr}"


def test_runtime_imports_nothing_from_the_simulator():
    for path in (PKG / "runtime").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                assert not n.startswith("jigsaw_plugin.sim"), f"{path}:{node.lineno} imports {n}"


def test_both_executors_decide_through_jigsaw_schedule():
    wl = small_workload(gpus=4, pipelines=1, prompts=2, samples=2, steps=1, median=50)
    cost = CostModel(hardware_profile("h100"))
    for run in ("sim", "live"):
        policy = get_policy("jigsaw")
        pm = get_plugin_manager(load_entrypoints=False)
        log = _DecisionLog(policy)
        register(pm, log, "decision-log")
        if run == "sim":
            r = Simulation(wl, policy, pm=pm).run()
        else:
            r = run_live(wl, policy, lambda p, d: EmulatedEngine(cost, p.model, tp=len(d), time_scale=0.02),
                         time_scale=0.02, pm=pm)
        assert r["samples"] == 4 and log.rounds and r["scheduler"]["decisions"] == len(log.rounds)


def test_a_tryfirst_duration_plugin_changes_simulated_durations():
    wl = small_workload(gpus=4, pipelines=1, prompts=2, samples=2, steps=1, median=50)

    class Slow:
        @hookimpl(tryfirst=True)
        def jigsaw_predict_duration(self, kind, pipeline, sizes, devices):
            return 100.0 if kind == "update_actor" else None

    base = Simulation(wl, get_policy("verl-sync")).run()
    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, Slow(), "slow")
    slow = Simulation(wl, get_policy("verl-sync"), pm=pm).run()
    assert slow["pipelines"]["p0"]["stage_s"]["update_actor"] == pytest.approx(100.0, abs=1.0)
    assert base["pipelines"]["p0"]["stage_s"]["update_actor"] < 50
    assert slow["makespan_s"] > base["makespan_s"] + 50


def test_the_predictor_is_a_default_plugin_and_the_oracle_is_labelled():
    wl = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=2, median=800)
    default = Simulation(wl, get_policy("jigsaw"), seed=1).run()
    oracle = Simulation(wl, get_policy("jigsaw"), seed=1, predictor="oracle").run()
    assert default["predictor"]["name"] == "history" and oracle["predictor"]["name"] == "oracle"
    assert default["predictor"]["notes"] > 0
    assert oracle["predictor"]["remaining_tokens_mae"] == pytest.approx(0.0, abs=1.0)
    assert default["predictor"]["remaining_tokens_mae"] > 1.0
    assert default["samples"] == oracle["samples"]


class _ResizeOnce:
    """verl-sync, but the first update_actor is shrunk to one device at its first boundary,
    then paused, then resumed on all of them (what micro-batch loans do)."""

    def __init__(self, plan):
        self.inner, self.plan, self.seen = get_policy("verl-sync"), list(plan), []

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        from jigsaw_plugin.scheduler import ResizeStage

        p = state.order[0]
        if p.stage_running and p.stages[p.stage_next] == "update_actor" and p.train_next == 0 and self.plan:
            devs = self.plan.pop(0)
            self.seen.append((state.t, devs))
            return [ResizeStage(p.name, 0, "update_actor", devs)]
        return self.inner.decide(state)


def test_a_stage_resizes_and_pauses_at_micro_batch_boundaries():
    from jigsaw_plugin.scheduler import ResizeStage

    # a compute-bound update whose training state fits on one device (a 7B's does not)
    wl = small_workload(gpus=4, pipelines=1, prompts=16, samples=8, steps=1, median=2000, algorithms=("grpo",),
                        models=("qwen2.5-3b",), agentic=(False,))
    base = Simulation(wl, get_policy("verl-sync")).run()["pipelines"]["p0"]["stage_s"]["update_actor"]
    pm = get_plugin_manager(load_entrypoints=False)
    spy = _ResizeOnce([(0,)])
    register(pm, spy, "resize")
    sim = Simulation(wl, get_policy("verl-sync"), pm=pm)
    narrow = sim.run()["pipelines"]["p0"]["stage_s"]["update_actor"]
    # one micro-batch of eight on 4 devices, seven on one: slower than all eight on four
    assert narrow > base * 2
    spans = [x for x in sim.world.trace if x[1] == "update_actor"]
    assert [len(x[2]) for x in spans] == [4, 1]
    assert spans[0][4] == pytest.approx(spans[1][3])  # devices 1-3 freed at the boundary
    # pausing (no devices) and resuming later keeps the update whole
    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, _ResizeOnce([()]), "pause")
    with pytest.raises(Exception, match="stalled"):  # paused and never resumed: the run cannot finish
        Simulation(wl, get_policy("verl-sync"), pm=pm).run()
    assert ResizeStage("p0", 0, "update_actor", ()).devices == ()


def test_a_training_pass_on_fewer_devices_than_hold_its_state_is_refused():
    from jigsaw_plugin.core.executor import PolicyViolation
    from jigsaw_plugin.errors import SpecError

    # a 7B's training state (16 bytes a parameter: 122 GB) needs two 80 GB devices
    wl = small_workload(gpus=4, pipelines=1, prompts=16, samples=8, steps=1, median=2000, algorithms=("grpo",),
                        models=("qwen2.5-7b",), agentic=(False,))
    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, _ResizeOnce([(0,)]), "resize")
    with pytest.raises(PolicyViolation, match=r"ResizeStage.devices: 1 devices .* allowed: at least 2 devices"):
        Simulation(wl, get_policy("verl-sync"), pm=pm).run()
    # its log-prob pass holds the bf16 weights only: one device is enough
    assert CostModel(hardware_profile("h100")).min_gang(model_profile("qwen2.5-7b"), update=False) == 1
    # a share that cannot hold the training state is refused before the run
    with pytest.raises(SpecError, match=r"pipelines\[0\].gpus.*at least 17 h100 devices"):
        Simulation(small_workload(gpus=16, pipelines=1, prompts=4, samples=4, steps=1, median=500,
                                  models=("qwen2.5-72b",), agentic=(False,)), get_policy("verl-sync"))
    # a 32B on 8 devices trains colocated (its state fills 8), but not beside its own rollout
    wl = small_workload(gpus=8, pipelines=1, prompts=4, samples=4, steps=1, median=500, models=("qwen2.5-32b",),
                        agentic=(False,), modes=("async",), staleness=(1,))
    Simulation(wl, get_policy("verl-sync"))
    for name in ("one-step-off", "streamrl", "areal"):
        with pytest.raises(SpecError, match=r"pipelines\[0\].gpus.*at least 12 devices for " + name):
            Simulation(wl, get_policy(name))
    with pytest.raises(SpecError, match=r"one-step-off.rollout_gpus.*in 4..8"):
        Simulation(small_workload(gpus=16, pipelines=1, prompts=4, samples=4, steps=1, median=500,
                                  models=("qwen2.5-32b",), agentic=(False,), modes=("async",), staleness=(1,)),
                   get_policy("one-step-off", rollout_gpus=12))


def test_no_policy_beats_the_makespan_lower_bound():
    from jigsaw_plugin.scheduler import policy_names
    from jigsaw_plugin.workload import load_workload

    # the third is bound by its chain (a few samples on many devices: the critical path,
    # with each step's fixed stage costs and weight syncs, is above the work bound)
    chain_bound = small_workload(gpus=16, pipelines=2, prompts=2, samples=2, steps=3, median=600,
                                 modes=("sync", "async"), staleness=(0, 1))
    for wl in (load_workload(PKG.parent / "examples" / "workloads" / "demo.yaml"),
               small_workload(gpus=16, pipelines=3, prompts=16, samples=8, steps=2, median=1200,
                              modes=("sync", "sync", "async"), staleness=(0, 0, 1)), chain_bound):
        # the registry's policies (tests elsewhere may register their own "test-*" ones)
        runs = [(name, "history") for name in policy_names() if not name.startswith("test-")] + [("jigsaw", "oracle")]
        for name, predictor in runs:
            r = Simulation(wl, get_policy(name), seed=2, predictor=predictor).run()
            b = r["bounds"]
            assert 0 < b["work_s"] <= b["makespan_lower_bound_s"] and b["critical_path_s"] <= b["makespan_lower_bound_s"]
            assert r["makespan_s"] >= b["makespan_lower_bound_s"], (name, r["makespan_s"], b)
            if wl is chain_bound:
                assert b["critical_path_s"] > b["work_s"], b
            assert 0 < r["effective_utilisation"] <= 1.0
            # the device-seconds above the ideal, split four ways, each >= 0, summing to the gap
            g = r["gap_breakdown"]
            parts = [g["idle_device_s"], g["rollout_above_ideal_device_s"], g["training_above_ideal_device_s"],
                     g["weight_sync_device_s"]]
            assert min(parts) >= -1e-6 * g["gap_device_s"], (name, g)
            assert sum(parts) == pytest.approx(g["gap_device_s"])
            # ... the rollout and training parts split by pipeline, each pipeline's own ideal
            # a floor on what it held (no co-location here: a device's time is one replica's)
            mine = g["pipelines"]
            assert set(mine) == set(r["pipelines"])
            for kind in ("rollout", "training"):
                assert sum(v[f"{kind}_above_ideal_device_s"] for v in mine.values()) == pytest.approx(
                    g[f"{kind}_above_ideal_device_s"], rel=1e-9, abs=1e-6)
                assert all(v[f"{kind}_device_s"] >= v[f"ideal_{kind}_device_s"] * (1 - 1e-9) for v in mine.values()), \
                    (name, kind, mine)
            assert sum(v["weight_sync_device_s"] for v in mine.values()) == pytest.approx(g["weight_sync_device_s"])
            # the idle device-seconds, placed by gap length and by what came before and after
            idle = r["idle_gaps"]
            assert sum(idle["by_length_s"].values()) == pytest.approx(g["idle_device_s"], rel=1e-6, abs=1e-6)
            assert sum(idle["by_transition"].values()) == pytest.approx(g["idle_device_s"], rel=1e-6, abs=1e-6)
            assert 0.0 <= idle["during_weight_sync_s"] <= g["idle_device_s"] * (1 + 1e-9)
            assert r["active_samples_per_s"] > 0


def test_a_replica_vllm_cannot_shard_is_refused():
    # Qwen2.5-7B on 8 devices: 28 attention heads do not divide; the executor names the widths
    from jigsaw_plugin.core.executor import PolicyViolation
    from jigsaw_plugin.scheduler.decisions import LaunchReplica
    from jigsaw_plugin.sim.world import World

    wl = small_workload(gpus=8, pipelines=1, models=("qwen2.5-7b",), algorithms=("grpo",), agentic=(False,),
                        modes=("sync",), staleness=(0,))
    world = World(wl, get_policy("verl-sync"), lambda ev: None)
    with pytest.raises(PolicyViolation, match=r"allowed widths: \[1, 2, 4\]"):
        world.apply(LaunchReplica("p0", tuple(range(8))))


@pytest.mark.parametrize("make, field", [
    (lambda: LaunchReplica("p0", 0), "LaunchReplica.devices"),
    (lambda: LaunchReplica("p0", ()), "LaunchReplica.devices"),
    (lambda: LaunchReplica("p0", (0, 0)), "LaunchReplica.devices"),
    (lambda: RunStage("p0", 0, "ref", "01"), "RunStage.devices"),
    (lambda: ResizeStage("p0", 0, "ref", (1, True)), "ResizeStage.devices"),
    (lambda: RunStage("p0", 0, "ref", (-1,)), "RunStage.devices"),
])
def test_a_decision_with_malformed_devices_is_refused_when_built(make, field):
    from jigsaw_plugin.errors import SpecError

    with pytest.raises(SpecError, match=field):
        make()


def test_devices_given_as_a_list_or_numpy_ints_are_held_as_a_tuple_of_ints():
    d = LaunchReplica("p0", [np.int64(2), 3])
    assert d.devices == (2, 3) and all(type(x) is int for x in d.devices)
    assert ResizeStage("p0", 0, "ref", ()).devices == ()  # a pause


def test_a_decision_naming_no_pipeline_of_the_run_or_a_device_outside_the_pool_is_refused():
    from jigsaw_plugin.core.executor import PolicyViolation
    from jigsaw_plugin.sim.world import World

    wl = small_workload(gpus=4, pipelines=1, agentic=(False,))
    world = World(wl, get_policy("verl-sync"), lambda ev: None)
    with pytest.raises(PolicyViolation, match=r"StartGen.pipeline: 'nope' is no pipeline of this run; allowed: \['p0'\]"):
        world.apply(StartGen("nope", 0))
    with pytest.raises(PolicyViolation, match=r"LaunchReplica.devices: device 4 is not in the pool; allowed: 0 to 3"):
        world.apply(LaunchReplica("p0", (4,)))


class _GrowInLastMicroBatch:
    """verl-sync, but the first update_actor shrinks to one device at its first boundary
    and asks for all four again during its last micro-batch (a loan that never applies)."""

    def __init__(self):
        self.inner, self.asked = get_policy("verl-sync"), []

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        from jigsaw_plugin.scheduler import ResizeStage

        p = state.order[0]
        rs = p.running_stage
        if rs is not None and rs.stage == "update_actor" and p.train_next == 0:
            if not self.asked:
                self.asked.append("shrink")
                return [ResizeStage(p.name, 0, "update_actor", (0,))]
            if rs.micro_batches_left == 1 and rs.resize_to is None and len(self.asked) == 1:
                self.asked.append("grow")
                return [ResizeStage(p.name, 0, "update_actor", (0, 1, 2, 3))]
        return self.inner.decide(state)


def test_a_resize_asked_in_the_last_micro_batch_gives_its_devices_back():
    wl = small_workload(gpus=4, pipelines=1, prompts=16, samples=8, steps=2, median=2000, algorithms=("grpo",),
                        models=("qwen2.5-3b",), agentic=(False,))
    pm = get_plugin_manager(load_entrypoints=False)
    spy = _GrowInLastMicroBatch()
    register(pm, spy, "grow-late")
    sim = Simulation(wl, get_policy("verl-sync"), pm=pm)
    # two micro-batches a stage: the shrink applies at the only boundary, whose round (devices
    # freed) falls in the last micro-batch
    sim.world.micro_batches = 2
    r = sim.run()  # stalled before the fix: devices 1-3 stayed claimed by the finished stage
    assert spy.asked == ["shrink", "grow"]
    assert r["pipelines"]["p0"]["steps"] == 2
    assert sorted(sim.world.free) == [0, 1, 2, 3]


def test_the_state_shows_the_mean_latency_of_returned_tool_calls():
    # agentic p1 (tools 0.05-2.0 s); p0 calls none. Measured from call to return, so only
    # calls that have returned count: never a latency drawn for one still out
    wl = small_workload(gpus=8, prompts=4, samples=2, steps=1, agentic=(False, True))
    sim = Simulation(wl, get_policy("jigsaw"))
    sim.run()
    tools, plain = sim.world.pipelines["p1"].observed, sim.world.pipelines["p0"].observed
    assert tools.tools > 0 and 0.05 <= tools.tool_mean_s() <= 2.0
    assert plain.tools == 0 and plain.tool_mean_s() == 0.0
    smp = sim.world.pipelines["p1"].steps[0].samples
    drawn = [float(smp.tool_latency_s[int(smp.turn_offset[i]) + t]) for i in range(len(smp.turns))
             for t in range(int(smp.turns[i]) - 1)]
    assert tools.tools == len(drawn) and tools.tool_mean_s() == pytest.approx(sum(drawn) / len(drawn))


def test_the_state_shows_the_mean_latency_of_computed_rewards():
    # p1's sandboxed rewards take their drawn latencies from each trajectory's last token;
    # the state shows their mean (what the jigsaw policy's reward-wait horizon reads)
    wl = small_workload(gpus=8, prompts=4, samples=2, steps=1, agentic=(False, True))
    sim = Simulation(wl, get_policy("jigsaw"))
    sim.run()
    p1 = sim.world.pipelines["p1"]
    drawn = [float(x) for x in p1.steps[0].samples.reward_latency_s]
    assert p1.observed.rewards == len(drawn) and p1.observed.reward_mean_s() == pytest.approx(sum(drawn) / len(drawn))
    assert sim.world.snapshot().pipelines["p1"].lengths.reward_s == pytest.approx(sum(drawn) / len(drawn))


class _RetireEmpty(Jigsaw):
    """The jigsaw policy, retiring every empty replica of a generating pipeline as soon as
    it is empty (its trajectories in tool calls then come back to no replica)."""

    retired = 0

    def decide(self, state):
        out = super().decide(state)
        gone = {d.replica for d in out if isinstance(d, RetireReplica)}
        for p in state.order:
            for r in p.replicas:
                if p.generating and not r.load and not r.retiring and r.id not in gone:
                    out.append(RetireReplica(r.id))
                    self.retired += 1
        return out


def test_a_turn_that_returns_to_no_replica_gets_a_decide_round():
    # a trajectory back from its tool call with no replica left waits in ``pending``; the
    # simulator must ask the policy then (it stalled when no other event was due)
    wl = small_workload(gpus=4, pipelines=1, prompts=4, samples=2, steps=2, agentic=(True,), algorithms=("grpo",))
    policy = _RetireEmpty()
    r = Simulation(wl, policy).run()
    assert policy.retired and r["pipelines"]["p0"]["steps"] == 2
