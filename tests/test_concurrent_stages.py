"""Stages side by side (``RunStage(alongside=True)``, ``algorithms.ALONGSIDE``): the
log-prob pass beside the reference pass, a PPO step's critic update beside the actor's.
The executor's bookkeeping and checks, the jigsaw policy's split on a hand-built state, and
the bound that stays below every policy (docs/simulator.md, ``concurrent_stages``)."""

import dataclasses

import pytest

from jigsaw_plugin.costmodel import CostModel
from jigsaw_plugin.algorithms import STAGES_BY_ALGORITHM, may_run_alongside
from jigsaw_plugin.core.executor import PolicyViolation
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import RunStage, get_policy
from jigsaw_plugin.scheduler.jigsaw import Jigsaw
from jigsaw_plugin.sim.engine import Simulation
from sim_helpers import HookLog, device_overlaps, small_workload
from test_jigsaw_decide import COST, pipeline, state, step

PPO = STAGES_BY_ALGORITHM["ppo"]


def _ppo_workload():
    # one synchronous PPO pipeline alone on 8 devices: its updates are most of its step
    return small_workload(gpus=8, pipelines=1, prompts=16, samples=4, steps=3, agentic=(False,),
                          algorithms=("ppo",), models=("qwen2.5-7b",), median=300)


def _spans(sim, pipeline_name):
    """(step, stage) -> (start, end, devices) from the simulator's trace."""
    out = {}
    for name, stage, devices, start, end in sim.world.trace:
        pname, _, rest = name.partition(" ")
        if pname != pipeline_name or not rest.startswith(stage + " s"):
            continue
        k = int(rest.rsplit(" s", 1)[1])
        a, b, devs = out.get((k, stage), (start, end, ()))
        out[(k, stage)] = (min(a, start), max(b, end), tuple(sorted(set(devs) | set(devices))))
    return out


def test_only_the_pairs_of_alongside_run_side_by_side():
    assert may_run_alongside("update_critic", PPO, PPO.index("update_critic"))
    assert may_run_alongside("old_log_prob", PPO, PPO.index("old_log_prob"))
    assert not may_run_alongside("ref", PPO, PPO.index("ref"))
    assert not may_run_alongside("old_log_prob", STAGES_BY_ALGORITHM["dapo"], 0)  # DAPO has no reference pass
    assert not may_run_alongside("update_actor", PPO, PPO.index("update_actor"))
    assert not may_run_alongside("update_critic", ("update_critic", "weight_sync"), 0)
    with pytest.raises(SpecError, match="RunStage.alongside"):
        RunStage("p0", 0, "update_critic", (0,), alongside="yes")
    with pytest.raises(SpecError, match="RunStage.alongside"):
        RunStage("p0", 0, "old_log_prob", (0,), early=True, alongside=True)


def test_the_critic_and_actor_updates_overlap_on_disjoint_gangs_and_the_sync_waits_for_both():
    sim = Simulation(_ppo_workload(), get_policy("jigsaw"))
    result = sim.run()
    assert not device_overlaps(sim.world.trace)
    spans = _spans(sim, "p0")
    for k in range(3):
        c0, c1, cd = spans[(k, "update_critic")]
        a0, a1, ad = spans[(k, "update_actor")]
        assert c0 < a1 and a0 < c1  # they ran at once
        assert not set(cd) & set(ad)
        if (k, "weight_sync") in spans:
            assert spans[(k, "weight_sync")][0] >= max(c1, a1) - 1e-9
    assert result["pipelines"]["p0"]["steps"] == 3 and result["pipelines"]["p0"]["samples"] == 3 * 16 * 4


def test_concurrent_stages_shorten_a_ppo_step_and_off_they_run_in_order():
    on = Simulation(_ppo_workload(), get_policy("jigsaw"))
    r_on = on.run()
    off = Simulation(_ppo_workload(), get_policy("jigsaw", concurrent_stages=False))
    r_off = off.run()
    spans = _spans(off, "p0")
    for k in range(3):
        assert spans[(k, "update_actor")][0] >= spans[(k, "update_critic")][1] - 1e-9
    assert r_on["makespan_s"] < r_off["makespan_s"]
    # the bound holds for both (it allows the two updates at once on this executor)
    for r in (r_on, r_off):
        assert r["makespan_s"] >= r["bounds"]["makespan_lower_bound_s"]


def test_the_log_prob_and_reference_passes_overlap_and_each_reads_every_token_once():
    # a 32B GRPO pipeline on two nodes: an early log-prob pass over the first finished
    # trajectories, then the two passes side by side over the rest
    wl = small_workload(gpus=16, pipelines=1, prompts=32, samples=8, steps=2, agentic=(False,),
                        algorithms=("grpo",), models=("qwen2.5-32b",), median=600)
    log = HookLog()
    sim = Simulation(wl, get_policy("jigsaw"), hooks=log)
    result = sim.run()
    assert not device_overlaps(sim.world.trace)
    starts = log.by("jigsaw_stage_start")
    together = {kw["step"] for kw in starts if kw["stage"] == "ref"} & {
        kw["step"] for kw in starts if kw["stage"] == "old_log_prob"
        and any(o["stage"] == "ref" and o["t"] == kw["t"] and o["step"] == kw["step"] for o in starts)}
    assert together  # some step ran them at once
    for k, s in sim.world.pipelines["p0"].steps.items():
        for stage in ("old_log_prob", "ref"):
            assert sum(kw["tokens"] for kw in starts if kw["step"] == k and kw["stage"] == stage) == s.tokens
    assert result["makespan_s"] >= result["bounds"]["makespan_lower_bound_s"]


def test_verl_sync_keeps_verls_order():
    sim = Simulation(_ppo_workload(), get_policy("verl-sync"))
    sim.run()
    spans = _spans(sim, "p0")
    for k in range(3):
        assert spans[(k, "update_actor")][0] >= spans[(k, "update_critic")][1] - 1e-9


class _SendsAlongside(Jigsaw):
    """The jigsaw policy without the split that, when the critic's update is ready, sends it
    ``alongside`` itself (for the executor's checks)."""

    def __init__(self, stage="update_critic"):
        super().__init__(concurrent_stages=False)
        self.stage = stage

    def decide(self, s):
        out = super().decide(s)
        for i, d in enumerate(out):
            if isinstance(d, RunStage) and d.stage == "update_critic":
                out[i] = dataclasses.replace(d, stage=self.stage, alongside=True)
        return out


def test_an_executor_without_the_capability_refuses_a_stage_alongside():
    sim = Simulation(_ppo_workload(), _SendsAlongside())
    sim.world.supports_concurrent_stages = False
    with pytest.raises(PolicyViolation, match="capability 'concurrent_stages'"):
        sim.run()


def test_a_stage_alongside_must_be_the_next_one():
    sim = Simulation(_ppo_workload(), _SendsAlongside(stage="update_actor"))
    with pytest.raises(PolicyViolation, match="RunStage update_actor of step 0 alongside; next is update_critic"):
        sim.run()


# ---- the policy's split on a hand-built state ------------------------------------------
def _ready_for_updates(concurrent=True):
    """p0 (PPO) has its step 0's batch and advantages: its critic update is next; p1 is done,
    so all 8 devices are free for p0."""
    p0 = pipeline(0, range(4), gen_next=1, steps={0: step(0, samples=32, done=32, rewarded=32, tokens=32 * 900)})
    p0 = dataclasses.replace(p0, stages=PPO, stage_next=PPO.index("update_critic"))
    p1 = dataclasses.replace(pipeline(1, range(4, 8)), done=True)
    return dataclasses.replace(state([p0, p1]), concurrent_stages=concurrent)


def test_the_policy_splits_the_free_devices_between_the_two_updates():
    out = [d for d in get_policy("jigsaw").decide(_ready_for_updates()) if isinstance(d, RunStage)]
    critic = [d for d in out if d.stage == "update_critic"]
    actor = [d for d in out if d.stage == "update_actor"]
    assert len(critic) == 1 and critic[0].alongside and len(actor) == 1 and not actor[0].alongside
    assert critic[0].devices and actor[0].devices and not set(critic[0].devices) & set(actor[0].devices)
    assert out.index(critic[0]) < out.index(actor[0])  # the executor checks them in this order


def test_the_split_is_priced_with_the_load_of_the_training_state():
    # a host link a tenth of the usual (2.5 GB/s: 24 s to load the 7B's training state onto
    # two devices, 6 s onto eight): where every device holds p0's state the updates still
    # split; where all but one hold another pipeline's, each gang of the pair would load
    # it, where the two in turn load it once: the critic's update runs first, alone
    slow = CostModel(dataclasses.replace(COST.hw, host_gbps=2.5))
    st = _ready_for_updates()
    holding = lambda ids: dataclasses.replace(st, cost=slow, devices=tuple(
        dataclasses.replace(d, train_resident="p0" if d.id in ids else "p1") for d in st.devices))
    stages = lambda s: [(d.stage, d.alongside) for d in get_policy("jigsaw").decide(s) if isinstance(d, RunStage)]
    assert stages(holding(range(8))) == [("update_critic", True), ("update_actor", False)]
    assert stages(holding({0})) == [("update_critic", False)]


@pytest.mark.parametrize("concurrent, option", [(False, True), (True, False)])
def test_without_the_capability_or_the_option_the_critic_update_runs_first_alone(concurrent, option):
    out = [d for d in get_policy("jigsaw", concurrent_stages=option).decide(_ready_for_updates(concurrent))
           if isinstance(d, RunStage)]
    assert [d.stage for d in out] == ["update_critic"] and not out[0].alongside


def test_later_stages_wait_for_the_stage_alongside():
    p0 = dataclasses.replace(_ready_for_updates().order[0], alongside_stage="update_critic",
                             alongside_end_t=150.0)
    assert dataclasses.replace(p0, stage_next=PPO.index("update_actor")).next_stage == "update_actor"
    assert dataclasses.replace(p0, stage_next=PPO.index("weight_sync")).next_stage is None
    assert dataclasses.replace(p0, stage_next=PPO.index("weight_sync"), alongside_stage=None,
                               alongside_end_t=None).next_stage == "weight_sync"


def _pair_ready_beside_its_rollout(predicted: int):
    """p0 (PPO) has its critic update next with 2 of its 8 home devices free; its own replica
    holds the other 6 with one request of ``predicted`` tokens left. Seen on synthetic mix
    s21033: a 72B's critic update started alone on 17 devices 5 s before its async rollout
    freed 24 more, and its actor's update waited out the critic's whole 273-s pass."""
    from test_jigsaw_decide import _busy_with_replicas, _trained_on, replica

    tail = [replica("p0", 1, tuple(range(2, 8)), generated=[500], predicted=[predicted])]
    p0 = pipeline(0, range(8), replicas=tail, gen_next=1,
                  steps={0: step(0, samples=32, done=32, rewarded=32, tokens=32 * 900)})
    p0 = dataclasses.replace(p0, stages=PPO, stage_next=PPO.index("update_critic"))
    return _trained_on(dataclasses.replace(state([p0], busy=_busy_with_replicas([p0])), concurrent_stages=True))


def test_the_pair_waits_for_home_devices_about_to_free_rather_than_start_the_critic_alone():
    soon, late = _pair_ready_beside_its_rollout(500), _pair_ready_beside_its_rollout(4000)
    assert late.order[0].replicas[0].predicted_drain_s() > 5 * soon.order[0].replicas[0].predicted_drain_s()

    def stages(option, st):
        return [(d.stage, len(d.devices), d.alongside) for d in get_policy("jigsaw", alongside_wait=option).decide(st)
                if isinstance(d, RunStage)]

    # off: the critic starts alone on the 2 free devices, and its partner waits for its whole pass
    assert stages(False, soon) == [("update_critic", 2, False)]
    # on: nothing starts; the pair goes once the 6 free up (1.4 s)
    assert stages(True, soon) == []
    # ... but not for devices 12 s away: the critic starts alone as before
    assert stages(True, late) == [("update_critic", 2, False)]
