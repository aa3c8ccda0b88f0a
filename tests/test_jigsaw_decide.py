"""The jigsaw policy's ``decide`` on small hand-built states: one test per mechanism.

The states are built from the typed views a live executor would hand over (observed
loads, tokens so far, predicted remaining tokens); no simulator runs here.
"""

import dataclasses

import numpy as np
import pytest

from jigsaw_plugin.algorithms import STAGES_BY_ALGORITHM
from jigsaw_plugin.costmodel import CostModel, EfficiencyFactors, hardware_profile, model_profile
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.scheduler import LaunchReplica, Migrate, RetireReplica, RunStage, StartGen, get_policy
from jigsaw_plugin.scheduler.decisions import ResizeStage
from jigsaw_plugin.scheduler.jigsaw import JigsawMemo
from jigsaw_plugin.scheduler.state import (
    DeviceClassView,
    DeviceTask,
    DeviceView,
    LengthSummary,
    PipelineView,
    PreemptionsSeen,
    ReplicaView,
    RequestView,
    RunningStageView,
    SchedulerState,
    StepView,
)
from sim_helpers import small_workload

COST = CostModel(hardware_profile("h100"))
MODEL = model_profile("qwen2.5-7b")  # big enough that a wider replica decodes a tail faster
SPECS = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, algorithms=("grpo", "grpo"),
                       agentic=(False, False)).pipelines


class _Requests:
    """A replica's request source: fixed observations and predictions."""

    def __init__(self, name, replica, generated, predicted):
        self.pred = np.asarray(predicted, float)
        self.rows = tuple(RequestView(RequestId(name, 0, i, 0), i // 4, None, 200, g, 4096, 10.0, replica, False, p)
                          for i, (g, p) in enumerate(zip(generated, predicted)))

    def predicted(self, replica=None):
        return self.pred

    def views(self, replica=None):
        return self.rows


def replica(name, rid, devices, generated=(), predicted=(), retiring=False):
    n = len(generated)
    kv = float(sum(200 + g for g in generated))
    step_s = COST.decode_step_s(MODEL, len(devices), max(1, n), kv)
    return ReplicaView(rid, name, tuple(devices), n, 0, kv, float(COST.kv_capacity_tokens(MODEL, len(devices))),
                       256, retiring, step_s, 0.0, _Requests(name, rid, generated, predicted))


def step(k=0, samples=32, done=0, rewarded=0, tokens=0):
    return StepView(k, samples, done, rewarded, tokens, 0.0, {}, {}, 0)


def pipeline(i, share, replicas=(), steps=None, gen_next=0, train_next=0, stage_next=0, generating=False,
             stage_running=False, version=0, running_end=None, running_stage=None, spec=None):
    spec = spec or SPECS[i]
    return PipelineView(
        name=spec.name, index=i, spec=spec, model=MODEL, stages=("old_log_prob", "ref", "adv", "update_actor",
                                                                   "weight_sync"),
        static_devices=tuple(share), gen_next=gen_next, train_next=train_next, stage_next=stage_next,
        stage_running=stage_running, version=version, rollout_version=version, done=False, generating=generating,
        pending=0, replicas=tuple(replicas), steps=steps or {}, history=None,
        lengths=LengthSummary(100, 150.0, 600.0, 750.0, 1.0, 3000.0), stage_history_s={},
        running_stage_end_t=running_end, running_stage=running_stage)


def state(pipes, busy=None, t=100.0):
    busy = busy or {}
    owner = {d: p.name for p in pipes for d in p.static_devices}
    home = {p.name: (p.static_devices, p.static_devices) for p in pipes}
    devices = tuple(DeviceView(d, 0, busy.get(d), (owner[d],) if d in owner else (), owner.get(d)) for d in range(8))
    return SchedulerState(t=t, gpus=8, gpus_per_node=8, devices=devices,
                          free=frozenset(d for d in range(8) if d not in busy), order=tuple(pipes), cost=COST,
                          max_num_seqs=256, memo=JigsawMemo(home, owner))


def _trained_on(st, name="p0"):
    """``st`` with every device holding ``name``'s training state (as if its gangs had run
    on all of them): for the tests of who lends whom which devices, apart from what
    loading the state onto a device costs (priced since stop 69:
    test_a_gang_leaves_out_devices_without_its_state_...)."""
    return dataclasses.replace(st, devices=tuple(dataclasses.replace(d, train_resident=name) for d in st.devices))


def _busy_with_replicas(pipes):
    return {d: DeviceTask("replica", p.name, replica=r.id) for p in pipes for r in p.replicas for d in r.devices}


def test_starts_generation_with_replicas_on_its_home():
    p0 = pipeline(0, range(4))
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    out = get_policy("jigsaw").decide(state([p0, p1]))
    assert StartGen("p0", 0) in out
    launched = [d for d in out if isinstance(d, LaunchReplica) and d.pipeline == "p0"]
    assert launched and all(set(d.devices) <= {0, 1, 2, 3} for d in launched)


def test_retires_a_drained_replica_after_generation():
    reps = [replica("p0", 1, (0,)), replica("p0", 2, (1,))]
    p0 = pipeline(0, range(4), replicas=reps, gen_next=1, steps={0: step(0, done=32, rewarded=10)})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    out = get_policy("jigsaw").decide(state([p0, p1], busy=_busy_with_replicas([p0])))
    assert {RetireReplica(1), RetireReplica(2)} <= set(out)


def _agent_between_turns(empty_on, p0_critical=True, running=64):
    """A synchronous agent p0 generates its step 1 on two replicas: replica 1 (device 0)
    runs ``running`` requests, replica 2 (``empty_on``) holds none, the rest of the step's
    84 open trajectories are in tool calls of 0.3 s. p1 owns devices 4-7 and runs its
    update of step 1 on them to the end of the run. p0's first step took 300 s and p1's
    100 s (``p0_critical``: p0's chain sets the makespan), or the other way round."""
    spec = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, algorithms=("grpo", "grpo"),
                          agentic=(True, False)).pipelines[0]
    slow, fast = (300.0, 100.0) if p0_critical else (100.0, 300.0)
    reps = [replica("p0", 1, (0,), generated=[100] * running, predicted=[300] * running),
            replica("p0", 2, (empty_on,))]
    p0 = pipeline(0, range(4), replicas=reps, gen_next=2, train_next=1, version=1, generating=True, spec=spec,
                  steps={1: _paced(step(1, samples=100, done=16), slow)})
    p0 = dataclasses.replace(p0, lengths=dataclasses.replace(p0.lengths, turns=3.0, tool_s=0.3))
    p1 = pipeline(1, range(4, 8), gen_next=2, train_next=1, stage_next=3, version=1, stage_running=True,
                  running_end=1e6, steps={1: _paced(step(1, done=32, rewarded=32, tokens=32 * 900), fast)})
    busy = _busy_with_replicas([p0]) | {d: DeviceTask("stage", "p1") for d in range(4, 8) if d != empty_on}
    return _trained_on(state([p0, p1], busy=busy, t=360.0), "p1")


def test_an_empty_replica_stays_for_the_next_turns_while_nothing_takes_its_devices():
    # p0's chain sets the makespan and nothing this round wants device 1: the empty
    # replica stays, and the trajectories in tool calls come back to it (off: it goes,
    # their turns queue on replica 1 and device 1 stands idle)
    retired = lambda st, **o: [d for d in get_policy("jigsaw", **o).decide(st) if isinstance(d, RetireReplica)]
    assert retired(_agent_between_turns(1)) == []
    assert retired(_agent_between_turns(1), keep_between_turns=False) == [RetireReplica(2)]
    # off the critical path p0 packs its returning turns onto replica 1 and frees device 1
    assert retired(_agent_between_turns(1, p0_critical=False)) == [RetireReplica(2)]


def test_an_empty_replica_kept_for_next_turns_goes_first_when_a_decision_takes_its_device():
    # replica 1 runs a tail of 4 requests, re-sharded wider onto devices 1 and 2: device 1
    # is the empty replica's, so it is retired, ahead of the launch that takes the device
    out = get_policy("jigsaw").decide(_agent_between_turns(1, running=4))
    wider = [d for d in out if isinstance(d, LaunchReplica) and d.pipeline == "p0"]
    assert wider and 1 in wider[0].devices
    assert out.index(RetireReplica(2)) < out.index(wider[0])
    # an empty replica on devices p0 borrowed (p1's device 4) goes back when empty
    assert RetireReplica(2) in get_policy("jigsaw").decide(_agent_between_turns(4))


def test_consolidates_a_tail_replica_onto_a_sibling():
    # replica 1 holds one short request in its tail, replica 2 a few long ones: moving the
    # short one frees a device for a whole predicted drain of replica 2
    reps = [replica("p0", 1, (0,), generated=[900], predicted=[100]),
            replica("p0", 2, (1,), generated=[800, 700, 600], predicted=[2000, 1800, 1500])]
    p0 = pipeline(0, range(4), replicas=reps, gen_next=1, generating=True, steps={0: step(0, done=28)})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, generating=False,
                  steps={1: step(1, samples=32, done=32, rewarded=32, tokens=32 * 900)})
    out = get_policy("jigsaw", resize=False).decide(state([p0, p1], busy=_busy_with_replicas([p0])))
    assert Migrate(1, 2) in out and RetireReplica(1) in out


def test_the_last_pipeline_merges_no_tail_while_devices_stand_idle():
    # the other pipeline is done: what a merge of p0's tail frees serves only p0 itself; with
    # five devices idle already, the merge would only slow the replica it merges into. With
    # every device busy (p0's other replicas, none of them a tail, on all of them) it merges
    tail = [replica("p0", 1, (0,), generated=[900], predicted=[100]),
            replica("p0", 2, (1,), generated=[800, 700, 600], predicted=[2000, 1800, 1500])]
    full = [replica("p0", r, (r - 1,), generated=[500] * 40, predicted=[3000] * 40) for r in range(3, 9)]
    p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, generating=False,
                                      steps={1: step(1, samples=32, done=32, rewarded=32, tokens=32 * 900)}),
                             done=True)

    def merged(reps):
        p0 = pipeline(0, range(8), replicas=reps, gen_next=1, generating=True, steps={0: step(0, done=28)})
        out = get_policy("jigsaw", resize=False).decide(state([p0, p1], busy=_busy_with_replicas([p0])))
        return any(isinstance(d, Migrate) and d.src == 1 for d in out)

    assert not merged(tail + full[:1])  # replica 3 ends last: the merge would not stretch the step
    assert merged(tail + full)


def test_replicas_at_their_steps_start_are_not_merged_as_tails():
    # two replicas of 16 requests each, none decoded yet, 8K tokens predicted each: under
    # tail_requests, but merging them doubles the KV every step reads as it grows by 16 x
    # 8K tokens, so the merged replica would end long after either (the steps are priced
    # at the KV halfway through the predicted work, not at the prompts' KV now)
    reps = [replica("p0", 1, (0,), generated=[0] * 16, predicted=[8000] * 16),
            replica("p0", 2, (1,), generated=[0] * 16, predicted=[8000] * 16)]
    p0 = pipeline(0, range(4), replicas=reps, gen_next=1, generating=True, steps={0: step(0, samples=32)})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    out = get_policy("jigsaw", resize=False).decide(state([p0, p1], busy=_busy_with_replicas([p0])))
    assert not [d for d in out if isinstance(d, (Migrate, RetireReplica))]


def test_widens_a_long_tail_onto_free_home_devices():
    reps = [replica("p0", 1, (0,), generated=[3000], predicted=[20000])]
    p0 = pipeline(0, range(4), replicas=reps, gen_next=1, generating=True, steps={0: step(0, done=31)})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    out = get_policy("jigsaw").decide(state([p0, p1], busy=_busy_with_replicas([p0])))
    wide = [d for d in out if isinstance(d, LaunchReplica) and d.absorb]
    assert wide and wide[0].absorb == (1,) and len(wide[0].devices) > 1
    assert set(wide[0].devices) <= {1, 2, 3}


def test_the_same_tail_is_not_widened_when_predicted_short():
    reps = [replica("p0", 1, (0,), generated=[3000], predicted=[20])]
    p0 = pipeline(0, range(4), replicas=reps, gen_next=1, generating=True, steps={0: step(0, done=31)})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    out = get_policy("jigsaw").decide(state([p0, p1], busy=_busy_with_replicas([p0])))
    assert not [d for d in out if isinstance(d, LaunchReplica) and d.absorb]


def test_a_ready_stage_borrows_devices_its_owner_can_spare():
    # p1 is in a long predicted rollout tail on one device: its three idle devices are lent
    # to p0's ready training stage, which then runs on 4 + 3 devices
    tail = [replica("p1", 5, (4,), generated=[3000], predicted=[30000])]
    p0 = pipeline(0, range(4), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    p1 = pipeline(1, range(4, 8), replicas=tail, gen_next=1, generating=True, steps={0: step(0, done=31)})
    out = get_policy("jigsaw", migration=False).decide(_trained_on(state([p0, p1], busy=_busy_with_replicas([p1]))))
    stage = [d for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]
    assert stage and stage[0].stage == "old_log_prob"
    assert set(range(4)) < set(stage[0].devices) and set(stage[0].devices) - set(range(4)) <= {5, 6, 7}
    # without multiplexing it stays on its home
    out = get_policy("jigsaw", migration=False, multiplex=False).decide(state([p0, p1], busy=_busy_with_replicas([p1])))
    assert [d.devices for d in out if isinstance(d, RunStage)] == [(0, 1, 2, 3)]


def _one_home_device_about_to_free():
    """Three of p0's four home devices are free; the fourth ends a predicted-short tail in a
    moment; p1 holds the other four in a long stage."""
    tail = [replica("p0", 1, (3,), generated=[500], predicted=[1])]
    p0 = pipeline(0, range(4), replicas=tail, gen_next=1,
                  steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, stage_running=True, running_end=1e6,
                  steps={1: step(1, done=32, rewarded=32)})
    busy = {**_busy_with_replicas([p0]), **{d: DeviceTask("stage", "p1", stage="old_log_prob") for d in range(4, 8)}}
    return state([p0, p1], busy=busy)


def test_lookahead_waits_for_a_home_device_about_to_free():
    # the look-ahead waits rather than starting the stage on three
    out = get_policy("jigsaw", migration=False).decide(_one_home_device_about_to_free())
    assert not [d for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]
    out = get_policy("jigsaw", migration=False, lookahead=False).decide(_one_home_device_about_to_free())
    assert [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"] == [(0, 1, 2)]


def test_lookahead_does_not_wait_for_a_home_device_that_left_the_pool():
    # device 3 was preempted: no task and not free (its replacement's arrival is not in the
    # state); the look-ahead priced it as free now and waited, round after round, while
    # preemptions kept some home device down (odd_workloads --preempt seed 200)
    p0 = pipeline(0, range(4), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, stage_running=True, running_end=1e6,
                  steps={1: step(1, done=32, rewarded=32)})
    busy = {d: DeviceTask("stage", "p1", stage="old_log_prob") for d in range(4, 8)}
    down = dataclasses.replace(state([p0, p1], busy=busy), free=frozenset({0, 1, 2}))
    out = get_policy("jigsaw", migration=False).decide(down)
    assert [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"] == [(0, 1, 2)]


def _agent_step_ready_own_replica_busy(in_tools, tool_s):
    """An asynchronous agent: step 0 is ready to train on its three free home devices; step
    1 generates on the fourth, its one replica, with one request predicted to end in a
    moment, while ``in_tools`` of its trajectories wait on tools (``tool_s`` the mean tool
    call observed so far, 9 turns a trajectory on average)."""
    spec = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, algorithms=("grpo", "grpo"),
                          modes=("async", "sync"), staleness=(1, 0), agentic=(True, False)).pipelines[0]
    tail = [replica("p0", 1, (3,), generated=[500], predicted=[1])]
    p0 = pipeline(0, range(4), replicas=tail, gen_next=2, generating=True, spec=spec,
                  steps={0: step(0, done=32, rewarded=32, tokens=32 * 900), 1: step(1, done=31 - in_tools)})
    p0 = dataclasses.replace(p0, lengths=dataclasses.replace(p0.lengths, turns=9.0, tool_s=tool_s))
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, stage_running=True, running_end=1e6,
                  steps={1: step(1, done=32, rewarded=32)})
    busy = {**_busy_with_replicas([p0]), **{d: DeviceTask("stage", "p1", stage="old_log_prob") for d in range(4, 8)}}
    return state([p0, p1], busy=busy)


def test_lookahead_does_not_wait_on_a_replica_whose_trajectories_are_in_slow_tools():
    # the replica's one running request says when it empties only if no trajectory comes
    # back to it for another turn: with most in tool calls of 30 s it stays busy for minutes,
    # so the stage starts now on what is free; with tools of 10 ms it waits, as for a drain
    gang = lambda out: [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]
    decide = lambda *a: get_policy("jigsaw", migration=False).decide(_agent_step_ready_own_replica_busy(*a))
    assert gang(decide(0, 30.0)) == []
    assert gang(decide(20, 30.0)) == [(0, 1, 2)]
    assert gang(decide(20, 0.01)) == []


def test_width_bounds_the_candidate_gangs_the_lookahead_weighs():
    # width 1: the only candidate is "start now" on the three free devices
    out = get_policy("jigsaw", migration=False, width=1).decide(_one_home_device_about_to_free())
    assert [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"] == [(0, 1, 2)]


def _narrow_home_beside_a_finished_owners_devices(predicted, p2_started=None):
    """p0's update_actor over 8M tokens is ready on its 2-device home; p1 has finished, and
    its home (devices 2-5) runs p2's rollout replicas, each with one request predicted to
    end in ``predicted`` tokens, as p2's home (6, 7) does. With
    ``p2_started``, p2 has trained its first of two steps and started its second then: its
    pace projects its finish at twice that."""
    specs = small_workload(gpus=8, pipelines=3, prompts=8, samples=4, algorithms=("grpo",),
                           agentic=(False,)).pipelines
    p0 = pipeline(0, (0, 1), gen_next=1, stage_next=3, spec=specs[0],
                  steps={0: step(0, done=32, rewarded=32, tokens=8_000_000)})
    p1 = dataclasses.replace(pipeline(1, range(2, 6), gen_next=2, train_next=2, spec=specs[1]), done=True)
    tails = [replica("p2", 10 + d, (d,), generated=[500], predicted=[predicted]) for d in range(2, 8)]
    p2 = pipeline(2, (6, 7), replicas=tails, gen_next=1, generating=True, spec=specs[2], steps={0: step(0, done=26)})
    if p2_started is not None:
        p2 = dataclasses.replace(p2, gen_next=2, train_next=1, version=1, rollout_version=1,
                                 steps={1: _paced(step(1, done=26), p2_started)})
    return state([p0, p1, p2], busy=_busy_with_replicas([p2]))


def test_a_ready_stage_waits_for_devices_a_finished_owner_frees_in_a_moment():
    # on its two home devices the pass's first micro-batch alone runs longer than the
    # whole pass on seven once p2's tails end in a moment: it waits for them; with the rule
    # off, or when the tails run for long, it starts now on its home
    gang = lambda out: [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]
    decide = lambda predicted, **kw: get_policy("jigsaw", migration=False, **kw).decide(
        _narrow_home_beside_a_finished_owners_devices(predicted))
    assert gang(decide(1)) == []
    assert gang(decide(1, wait_for_freed=False)) == [(0, 1)]
    assert gang(decide(200_000)) == [(0, 1)]


def test_a_ready_stage_off_the_critical_path_does_not_wait_for_freed_devices():
    # p2's pace projects it to finish long after p0's pass on its two devices would end:
    # p0 is off the critical path and starts now, whatever a wait would save it
    state_ = _narrow_home_beside_a_finished_owners_devices(1, p2_started=1e6)
    out = get_policy("jigsaw", migration=False).decide(state_)
    assert [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"] == [(0, 1)]


def _update_actor_running(devices, t=100.0, left=6, resize_to=None):
    """p0's update_actor of step 0 running micro-batch by micro-batch on ``devices``."""
    rs = RunningStageView(0, "update_actor", tuple(devices), resize_to, left, 8, t + 5.0, True)
    return pipeline(0, range(4), gen_next=1, stage_next=3, stage_running=True, running_end=t + 200.0,
                    running_stage=rs, steps={0: step(0, done=32, rewarded=32, tokens=8_000_000)})


def test_a_running_stage_grows_onto_devices_lent_for_a_micro_batch():
    # p1 is in a long predicted tail on device 4: devices 5-7 are lent to p0's running
    # update_actor, which takes them at its next micro-batch boundary
    tail = [replica("p1", 5, (4,), generated=[3000], predicted=[30000])]
    p0 = _update_actor_running(range(4))
    p1 = pipeline(1, range(4, 8), replicas=tail, gen_next=1, generating=True, steps={0: step(0, done=31)})
    busy = {**_busy_with_replicas([p1]), **{d: DeviceTask("stage", "p0", stage="update_actor") for d in range(4)}}
    out = get_policy("jigsaw", migration=False, loans=True).decide(state([p0, p1], busy=busy))
    assert ResizeStage("p0", 0, "update_actor", (0, 1, 2, 3, 5, 6, 7)) in out
    # micro-batch loans off: the stage keeps its width
    out = get_policy("jigsaw", migration=False, loans=False).decide(state([p0, p1], busy=busy))
    assert not [d for d in out if isinstance(d, ResizeStage)]


def test_an_owner_with_a_ready_stage_reclaims_its_lent_devices_at_the_boundary():
    # p0's stage borrowed p1's devices 4 and 5; p1's batch is ready: p0 shrinks back
    p0 = _update_actor_running((0, 1, 2, 3, 4, 5))
    p1 = pipeline(1, range(4, 8), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    busy = {d: DeviceTask("stage", "p0", stage="update_actor") for d in range(6)}
    out = get_policy("jigsaw", loans=True).decide(state([p0, p1], busy=busy))
    assert ResizeStage("p0", 0, "update_actor", (0, 1, 2, 3)) in out
    # already asked (resize_to pending): not asked again
    p0 = _update_actor_running((0, 1, 2, 3, 4, 5), resize_to=(0, 1, 2, 3))
    out = get_policy("jigsaw", loans=True).decide(state([p0, p1], busy=busy))
    assert not [d for d in out if isinstance(d, ResizeStage)]


def test_devices_a_reclaim_takes_from_a_pending_growth_are_free_in_the_same_round():
    # p0's stage was to grow onto p1's devices 4 and 5 at its next boundary (a ResizeStage
    # not applied yet: the executor holds them for it); p1's batch is ready: the reclaim
    # takes them back before the stage ever ran on them, so the executor frees them at once
    # and p1's gang of this round may start on them with its other home devices
    p0 = _update_actor_running((0, 1, 2, 3), resize_to=(0, 1, 2, 3, 4, 5))
    p1 = pipeline(1, range(4, 8), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    busy = {d: DeviceTask("stage", "p0", stage="update_actor") for d in range(6)}
    out = get_policy("jigsaw", loans=True).decide(state([p0, p1], busy=busy))
    assert ResizeStage("p0", 0, "update_actor", (0, 1, 2, 3)) in out
    gang = [d for d in out if isinstance(d, RunStage) and d.pipeline == "p1"]
    assert gang and set(gang[0].devices) == {4, 5, 6, 7}
    # applied in order: the shrink (which releases 4 and 5) before the gang that takes them
    assert out.index(ResizeStage("p0", 0, "update_actor", (0, 1, 2, 3))) < out.index(gang[0])


def _reclaim_from_a_running_update(cost, gpn: int, split: int, stage_on: int, classes=()) -> SchedulerState:
    """16 devices in nodes of ``gpn``: p0's update_actor (1M tokens) runs on devices
    ``0 .. stage_on - 1`` and its home is ``0 .. split - 1``; p1, whose home is the rest, has
    its batch ready (and wants its devices back)."""
    rs = RunningStageView(0, "update_actor", tuple(range(stage_on)), None, 6, 8, 105.0, True)
    p0 = pipeline(0, range(split), gen_next=1, stage_next=3, stage_running=True, running_end=300.0, running_stage=rs,
                  steps={0: step(0, done=32, rewarded=32, tokens=1_000_000)})
    p1 = pipeline(1, range(split, 16), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    owner = {d: p.name for p in (p0, p1) for d in p.static_devices}
    busy = {d: DeviceTask("stage", "p0", stage="update_actor") for d in range(stage_on)}
    devices = tuple(DeviceView(d, d // gpn, busy.get(d), (), "p0" if d < stage_on else None) for d in range(16))
    return SchedulerState(t=100.0, gpus=16, gpus_per_node=gpn, devices=devices,
                          free=frozenset(d for d in range(16) if d not in busy), order=(p0, p1), cost=cost,
                          max_num_seqs=256, classes=classes,
                          memo=JigsawMemo({p.name: (p.static_devices,) * 2 for p in (p0, p1)}, owner))


def test_a_reclaimed_stage_keeps_the_fastest_gang_of_the_devices_left():
    # four nodes of 4 H100: p0's update_actor (1M tokens) runs on 0-13 and p1, whose home is
    # 13-15, has its batch ready and takes 13 back. The 13 devices left (4, 4, 4 and 1 a
    # node) can shard only over all 13, across the node NICs (15.9 s a pass); the 12 of
    # nodes 0-2 shard in node-local groups of 4 (9.3 s): the stage shrinks to those 12 and
    # device 12 is left free, not to the 13 that a reclaim of exactly p1's device leaves
    cost = CostModel.for_nodes(hardware_profile("h100"), 4)
    assert cost.train_s(MODEL, 12, 1e6, nodes=(4, 4, 4)) < cost.train_s(MODEL, 13, 1e6, nodes=(4, 4, 4, 1))
    out = get_policy("jigsaw", loans=True).decide(_reclaim_from_a_running_update(cost, 4, 13, 14))
    assert ResizeStage("p0", 0, "update_actor", tuple(range(12))) in out


def test_a_reclaimed_stage_on_two_classes_keeps_the_gang_that_is_fastest_at_its_classes_prices():
    # two nodes of 8: H100 (0-7, the pool's first class) and A100 (8-15). p0's update runs
    # on all 16; p1 takes its home 14 and 15 back. Priced as H100 throughout, the 14 left
    # (8 + 6) beat the 8 H100; but a gang runs at its slowest class's pace (the simulator's
    # ``ClassPricer``), and 8 H100 + 6 A100 run at the A100's: the stage shrinks to the 8 H100
    h100 = CostModel.for_nodes(hardware_profile("h100"), 8)
    a100 = CostModel.for_nodes(hardware_profile("a100"), 8)
    assert h100.train_s(MODEL, 14, 1e6, nodes=(8, 6)) < h100.train_s(MODEL, 8, 1e6, nodes=(8,)) \
        < a100.train_s(MODEL, 14, 1e6, nodes=(8, 6))
    classes = (DeviceClassView(0, "h", "h100", range(0, 8), h100, None, False, None),
               DeviceClassView(1, "a", "a100", range(8, 16), a100, None, False, None))
    out = get_policy("jigsaw", loans=True).decide(_reclaim_from_a_running_update(h100, 8, 14, 16, classes))
    assert ResizeStage("p0", 0, "update_actor", tuple(range(8))) in out


def _critical_stage_on_a_ready_owners_devices(resize_to):
    """p0, paced to finish last, runs its update on its home and p1's devices 4 and 5; p1's
    batch is ready, its devices 6 and 7 free or (``resize_to``) claimed by p0's stage for
    its next boundary."""
    rs = RunningStageView(1, "update_actor", (0, 1, 2, 3, 4, 5), resize_to, 6, 8, 105.0, True)
    p0 = pipeline(0, range(4), gen_next=2, train_next=1, stage_next=3, stage_running=True, running_end=300.0,
                  running_stage=rs, version=1,
                  steps={1: _paced(step(1, done=32, rewarded=32, tokens=8_000_000), 300.0)})
    p1 = pipeline(1, range(4, 8), gen_next=2, train_next=1, version=1,
                  steps={1: _paced(step(1, done=32, rewarded=32, tokens=32 * 900), 100.0)})
    busy = {d: DeviceTask("stage", "p0", stage="update_actor") for d in set(range(6)) | set(resize_to or ())}
    return _trained_on(state([p0, p1], busy=busy, t=350.0))


def test_a_reclaim_and_a_growth_that_undo_each_other_emit_nothing():
    # p1 takes 4 and 5 back; the critical p0's stage grows onto p1's free 6 and 7
    # (lend_to_critical) while p1's gang waits for its whole home
    grows = (0, 1, 2, 3, 6, 7)
    out = get_policy("jigsaw").decide(_critical_stage_on_a_ready_owners_devices(None))
    assert [d.devices for d in out if isinstance(d, ResizeStage)] == [(0, 1, 2, 3), grows]
    # the next round, that growth pending: the same shrink and growth would only restate it
    # (they came back every round of the instant: 3,183 in (a)'s run, 183 without them)
    out = get_policy("jigsaw").decide(_critical_stage_on_a_ready_owners_devices(grows))
    assert not [d for d in out if isinstance(d, ResizeStage)]


def test_a_paused_stage_resumes_on_its_home_devices():
    p0 = _update_actor_running(())
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    out = get_policy("jigsaw", loans=True).decide(state([p0, p1]))
    resumed = [d for d in out if isinstance(d, ResizeStage) and d.pipeline == "p0"]
    assert resumed and set(range(4)) <= set(resumed[0].devices)


def test_a_large_rollout_borrows_replicas_beyond_its_home():
    # 1024 samples on a one-device home: replicas go onto devices p1 can spare (it is in a
    # long predicted tail), each near its ideal batch
    big = small_workload(gpus=8, pipelines=2, prompts=128, samples=8, algorithms=("grpo", "grpo"),
                         agentic=(False, False)).pipelines[0]
    tail = [replica("p1", 5, (4,), generated=[3000], predicted=[30000])]
    p0 = pipeline(0, (0,), spec=big)
    p1 = pipeline(1, range(4, 8), replicas=tail, gen_next=1, generating=True, steps={0: step(0, done=31)})
    st = state([p0, p1], busy=_busy_with_replicas([p1]))
    out = get_policy("jigsaw", migration=False).decide(st)
    devs = {d for x in out if isinstance(x, LaunchReplica) and x.pipeline == "p0" for d in x.devices}
    assert 0 in devs and devs & {5, 6, 7}
    out = get_policy("jigsaw", migration=False, borrow=False).decide(st)
    devs = {d for x in out if isinstance(x, LaunchReplica) and x.pipeline == "p0" for d in x.devices}
    assert devs and not devs & {4, 5, 6, 7}


def test_apportion_and_assign_move_devices_to_the_pipeline_with_more_work_left():
    from jigsaw_plugin.scheduler.jigsaw import apportion, assign_devices

    counts = apportion({"a": 300.0, "b": 100.0}, {"a": 2, "b": 2}, 8)
    assert counts == {"a": 6, "b": 2}
    shares = assign_devices({"a": (0, 1, 2, 3), "b": (4, 5, 6, 7)}, counts, [0] * 8)
    assert shares == {"a": (0, 1, 2, 3, 6, 7), "b": (4, 5)}
    # a finished pipeline (no work, no floor) gives up everything
    assert apportion({"a": 5.0, "b": 0.0}, {"a": 2, "b": 0}, 8) == {"a": 8, "b": 0}


def test_balance_gives_a_ready_stage_the_devices_of_a_pipeline_near_its_end():
    # p1 is on its last step, in a short predicted tail on device 4 (so without balance its
    # free devices are not lent: it wants them back for its training soon); p0 has its whole
    # run ahead: with makespan-aware shares some of p1's devices become p0's home
    last = SPECS[1].steps - 1
    tail = [replica("p1", 5, (4,), generated=[300], predicted=[5])]
    p0 = pipeline(0, range(4), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    p1 = pipeline(1, range(4, 8), replicas=tail, gen_next=last + 1, train_next=last, generating=True,
                  steps={last: step(last, done=31)})
    st = _trained_on(state([p0, p1], busy=_busy_with_replicas([p1])))
    # predicted_pace off: p0 (no step finished) would be critical by its projected
    # finish, and lend_to_critical would give it p1's devices without balance
    off = [d for d in get_policy("jigsaw", migration=False, balance=False, predicted_pace=False).decide(st)
           if isinstance(d, RunStage)]
    on = [d for d in get_policy("jigsaw", migration=False, balance=True, min_share=0.5, predicted_pace=False).decide(st)
          if isinstance(d, RunStage)]
    assert off and set(off[0].devices) == {0, 1, 2, 3}
    assert on and {0, 1, 2, 3} < set(on[0].devices) and 4 not in on[0].devices


def _paced(view, started):
    return type(view)(**{**{f: getattr(view, f) for f in view.__slots__}, "gen_start_t": started})


def _critical_gang_state(p0_started, p1_started):
    """p0's step 1 is ready to train on its idle home (0-3); p1 generates its step 1 on
    devices 4-5, its rollout about to end (it wants 6-7 back at once)."""
    ready = _paced(step(1, samples=32, done=32, rewarded=32, tokens=32 * 900), p0_started)
    p0 = pipeline(0, range(4), gen_next=2, train_next=1, version=1, steps={1: ready})
    reps = [replica("p1", 1, (4,), generated=[100], predicted=[20]), replica("p1", 2, (5,), generated=[100],
                                                                            predicted=[20])]
    p1 = pipeline(1, range(4, 8), replicas=reps, gen_next=2, train_next=1, version=1, generating=True,
                  steps={1: _paced(step(1, samples=32, done=30), p1_started)})
    return _trained_on(state([p0, p1], busy=_busy_with_replicas([p1]), t=max(p0_started, p1_started) + 60.0))


def test_a_critical_pipelines_gang_takes_devices_an_owner_with_slack_wants_back():
    # p0 took 300 s for its first step, p1 100 s: p0 is projected last, p1 has slack
    stage = [d for d in get_policy("jigsaw").decide(_critical_gang_state(300.0, 100.0)) if isinstance(d, RunStage)]
    assert stage and set(stage[0].devices) == {0, 1, 2, 3, 6, 7}
    # switched off, or when the owner is the critical one, p1 keeps them
    off = [d for d in get_policy("jigsaw", lend_to_critical=False).decide(_critical_gang_state(300.0, 100.0))
           if isinstance(d, RunStage)]
    assert off and set(off[0].devices) == {0, 1, 2, 3}
    swapped = [d for d in get_policy("jigsaw").decide(_critical_gang_state(100.0, 300.0)) if isinstance(d, RunStage)]
    assert swapped and set(swapped[0].devices) == {0, 1, 2, 3}


def _async_pace_state(p0_trained_at):
    """p0, asynchronous at staleness 1, has step 2 ready to train on its idle home (0-3):
    its generation started at ``p0_trained_at``, when its first trained step's weights were
    synced (step 1's started at 0, beside step 0's). p1, synchronous, took 100 s for its
    first step and decodes its second's tail on devices 4-5 (it wants 6-7 back at once).
    Both runs are 10 steps long."""
    spec0 = dataclasses.replace(SPECS[0], mode="async", staleness=1, steps=10)
    ready = _paced(step(2, samples=32, done=32, rewarded=32, tokens=32 * 900), p0_trained_at)
    p0 = pipeline(0, range(4), gen_next=3, train_next=2, version=1, steps={2: ready}, spec=spec0)
    reps = [replica("p1", 1, (4,), generated=[100], predicted=[20]), replica("p1", 2, (5,), generated=[100],
                                                                            predicted=[20])]
    p1 = pipeline(1, range(4, 8), replicas=reps, gen_next=2, train_next=1, version=1, generating=True,
                  steps={1: _paced(step(1, samples=32, done=30), 100.0)}, spec=dataclasses.replace(SPECS[1], steps=10))
    return _trained_on(state([p0, p1], busy=_busy_with_replicas([p1]), t=200.0))


def test_an_asynchronous_pipelines_pace_counts_its_trained_steps_not_those_generated_ahead():
    # p0's one trained step took 150 s, p1's 100 s: p0 is projected last and its gang takes
    # the devices p1 wants back (lend_to_critical). Its step 2 started one step ahead of
    # training (staleness 1), so 150 s is one step's pace, not two's: read as two, p0's pace
    # was 75 s a step and p1 the critical one
    stage = [d for d in get_policy("jigsaw").decide(_async_pace_state(150.0)) if isinstance(d, RunStage)]
    assert stage and set(stage[0].devices) == {0, 1, 2, 3, 6, 7}
    # p0 faster than p1 (80 s a trained step) is not on the critical path: p1 keeps them
    stage = [d for d in get_policy("jigsaw").decide(_async_pace_state(80.0)) if isinstance(d, RunStage)]
    assert stage and set(stage[0].devices) == {0, 1, 2, 3}


def test_only_the_critical_pipelines_running_stage_grows_onto_lent_devices():
    # p0's update_actor runs on its home 0-3; p1 decodes a long tail on device 4, devices
    # 5-7 free. With critical_loans (loans off), p0's stage grows onto 5-7 when p0 is the
    # pipeline projected last, and keeps its width when p1 is.
    rs = RunningStageView(1, "update_actor", (0, 1, 2, 3), None, 6, 8, 105.0, True)
    tail = [replica("p1", 5, (4,), generated=[3000], predicted=[30000])]
    busy = {4: DeviceTask("replica", "p1", replica=5), **{d: DeviceTask("stage", "p0", stage="update_actor")
                                                           for d in range(4)}}

    def decide(p0_start, p1_start, **opts):
        # each pipeline's observed pace projects its run to end at gen_start_t x steps / train_next
        ready = _paced(step(1, samples=32, done=32, rewarded=32, tokens=8_000_000), p0_start)
        p0 = pipeline(0, range(4), gen_next=2, train_next=1, version=1, stage_next=3, stage_running=True,
                      running_end=300.0, running_stage=rs, steps={1: ready})
        p1 = pipeline(1, range(4, 8), replicas=tail, gen_next=3, train_next=2, version=2, generating=True,
                      steps={2: StepView(2, 32, 31, 31, 0, p1_start, {}, {}, 1)})
        out = get_policy("jigsaw", migration=False, **opts).decide(state([p0, p1], busy=busy))
        return [d for d in out if isinstance(d, ResizeStage)]

    assert decide(90.0, 20.0) == [ResizeStage("p0", 1, "update_actor", (0, 1, 2, 3, 5, 6, 7))]
    assert decide(90.0, 20.0, critical_loans=False) == []
    assert decide(20.0, 90.0) == []  # p1 projected last: p0 has slack, its stage keeps its width


def test_a_long_context_rollout_decodes_on_wider_replicas():
    # 1024 samples of a 7B: at a 15K-token observed context a one-device replica's cache
    # holds about 47 sequences, each decode step reading the weights for them alone; a
    # two- or four-device replica holds several times as many per copy of the weights
    big = small_workload(gpus=8, pipelines=2, prompts=128, samples=8, algorithms=("grpo", "grpo"),
                         agentic=(False, False)).pipelines[0]
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)})

    def widths(context, **opts):
        p0 = pipeline(0, range(4), spec=big)
        p0 = type(p0)(**{**{f: getattr(p0, f) for f in p0.__dataclass_fields__},
                         "lengths": LengthSummary(100, 150.0, context - 150.0, context, 1.0, 16000.0)})
        out = get_policy("jigsaw", **opts).decide(state([p0, p1]))
        return {len(d.devices) for d in out if isinstance(d, LaunchReplica) and d.pipeline == "p0"}

    assert widths(750.0) == {1}  # a short context: the batch is not held back by the cache
    wide = widths(15150.0)
    assert wide and min(wide) >= 2
    assert widths(15150.0, bulk_width=False) == {1}


def test_a_small_rollout_off_the_critical_path_decodes_at_the_width_its_home_fills():
    # 32 samples of a 7B on a 4-device home: one-device replicas would run 8 each (a step
    # reading the weights for 8 sequences, 6.7 ms, 0.84 device-ms a token at the observed
    # 750-token context), one 4-device replica runs all 32 (3.5 ms, 0.43 device-ms a token).
    # The batch the cache holds (256 at either width) made the narrowest width cheapest
    def launched(p0_step, p1_step, **opts):
        pipes = [pipeline(i, range(4 * i, 4 * i + 4), gen_next=k, train_next=k, version=k, steps={k: step(k)})
                 for i, k in enumerate((p0_step, p1_step))]
        out = get_policy("jigsaw", **opts).decide(state(pipes))
        return [d.devices for d in out if isinstance(d, LaunchReplica) and d.pipeline == "p0"]

    # p0 a step ahead: p1 is projected last, p0's rollout stays on its home
    assert launched(1, 0) == [(0, 1, 2, 3)]
    assert launched(1, 0, fill_width=False) == [(0,), (1,), (2,), (3,)]
    # p0 a step behind, projected last: the critical rollout is the one the spreads may
    # widen beyond its home, so its width stays priced at the batch its cache holds
    assert launched(0, 1) == [(0,), (1,), (2,), (3,)]


def _critical_borrower_state(p1_ready):
    """p0 (projected last at its observed pace) runs update_actor on its home 0-3 and on
    p1's devices 4-5; p1 (with slack) runs old_log_prob on 6-7, or (``p1_ready``) has its
    next stage ready and nothing running."""
    ready = _paced(step(1, samples=32, done=32, rewarded=32, tokens=8_000_000), 90.0)
    rs0 = RunningStageView(1, "update_actor", (0, 1, 2, 3, 4, 5), None, 6, 8, 105.0, True)
    p0 = pipeline(0, range(4), gen_next=2, train_next=1, version=1, stage_next=3, stage_running=True,
                  running_end=300.0, running_stage=rs0, steps={1: ready})
    theirs = _paced(step(1, samples=32, done=32, rewarded=32, tokens=8_000_000), 20.0)
    busy = {d: DeviceTask("stage", "p0", stage="update_actor") for d in range(6)}
    if p1_ready:
        p1 = pipeline(1, range(4, 8), gen_next=2, train_next=1, version=1, steps={1: theirs})
    else:
        rs1 = RunningStageView(1, "old_log_prob", (6, 7), None, 6, 8, 104.0, True)
        p1 = pipeline(1, range(4, 8), gen_next=2, train_next=1, version=1, stage_running=True,
                      running_end=200.0, running_stage=rs1, steps={1: theirs})
        busy.update({d: DeviceTask("stage", "p1", stage="old_log_prob") for d in (6, 7)})
    return state([p0, p1], busy=busy)


def test_an_owner_whose_stage_cannot_grow_leaves_the_critical_pipeline_its_loan():
    # p1's running stage may not grow (loans off, p1 off the critical path): taking 4-5 back
    # would leave them idle, so p0 keeps them; switched off, p1 reclaims as before
    shrinks = lambda out: [d for d in out if isinstance(d, ResizeStage) and d.pipeline == "p0"]
    assert shrinks(get_policy("jigsaw", migration=False).decide(_critical_borrower_state(False))) == []
    off = get_policy("jigsaw", migration=False, keep_critical_loans=False).decide(_critical_borrower_state(False))
    assert shrinks(off) == [ResizeStage("p0", 1, "update_actor", (0, 1, 2, 3))]
    # with its next stage ready, p1 reclaims them at p0's next boundary
    ready = get_policy("jigsaw", migration=False).decide(_critical_borrower_state(True))
    assert shrinks(ready) == [ResizeStage("p0", 1, "update_actor", (0, 1, 2, 3))]


def test_a_stage_off_the_critical_path_grows_onto_its_own_free_home_devices_only():
    # p0's update_actor runs on half its home (0-1); 2-3 came back free. p1, projected last,
    # decodes a long tail on device 4 with 5-7 free. p0 is off the critical path, so no
    # loan: it grows onto its own 2-3 alone (``grow_at_home``), never onto p1's 5-7
    rs = RunningStageView(1, "update_actor", (0, 1), None, 6, 8, 105.0, True)
    tail = [replica("p1", 5, (4,), generated=[3000], predicted=[30000])]
    busy = {4: DeviceTask("replica", "p1", replica=5), **{d: DeviceTask("stage", "p0", stage="update_actor")
                                                           for d in (0, 1)}}
    ready = _paced(step(1, samples=32, done=32, rewarded=32, tokens=8_000_000), 20.0)
    p0 = pipeline(0, range(4), gen_next=2, train_next=1, version=1, stage_next=3, stage_running=True,
                  running_end=300.0, running_stage=rs, steps={1: ready})
    p1 = pipeline(1, range(4, 8), replicas=tail, gen_next=3, train_next=2, version=2, generating=True,
                  steps={2: StepView(2, 32, 31, 31, 0, 90.0, {}, {}, 1)})

    def grown(**opts):
        out = get_policy("jigsaw", migration=False, **opts).decide(state([p0, p1], busy=busy))
        return [d for d in out if isinstance(d, ResizeStage)]

    assert grown() == [ResizeStage("p0", 1, "update_actor", (0, 1, 2, 3))]
    assert grown(grow_at_home=False) == []


def _update_beside_free_home(micro_batches_left, tokens):
    """p0's update_actor runs on devices 0-1 of its home 0-3 until t = 300 (now 100), 2-3
    free beside it; p1 decodes a tail on device 4 of its home 4-7."""
    rs = RunningStageView(1, "update_actor", (0, 1), None, micro_batches_left, 8, 105.0, True)
    tail = [replica("p1", 5, (4,), generated=[3000], predicted=[30000])]
    busy = {4: DeviceTask("replica", "p1", replica=5), **{d: DeviceTask("stage", "p0", stage="update_actor")
                                                           for d in (0, 1)}}
    ready = _paced(step(1, samples=32, done=32, rewarded=32, tokens=tokens), 20.0)
    p0 = pipeline(0, range(4), gen_next=2, train_next=1, version=1, stage_next=3, stage_running=True,
                  running_end=300.0, running_stage=rs, steps={1: ready})
    p1 = pipeline(1, range(4, 8), replicas=tail, gen_next=3, train_next=2, version=2, generating=True,
                  steps={2: StepView(2, 32, 31, 31, 0, 90.0, {}, {}, 1)})
    return state([p0, p1], busy=busy)


def test_a_stage_that_would_not_grow_lends_its_free_home_to_rollout_replicas_until_it_ends():
    from jigsaw_plugin.scheduler.jigsaw.round import Round

    def lendable(st, duration, replica, **opts):
        home = {p.name: (p.static_devices, p.static_devices) for p in st.order}
        owner = {d: p.name for p in st.order for d in p.static_devices}
        return get_policy("jigsaw", migration=False, **opts)._lendable(Round(st, home, owner), st.order[1],
                                                                        duration, replica=replica)

    # a short update (100k tokens): growing onto 2-3 would not repay its switch, so p0 does
    # not grow, and its 2-3 are p1's replicas' for as long as the update runs (200 s, the
    # look-ahead's margin 1.2 on top)
    short = _update_beside_free_home(2, 100_000)
    assert not [d for d in get_policy("jigsaw", migration=False).decide(short) if isinstance(d, ResizeStage)]
    assert lendable(short, 100.0, replica=True) == [2, 3]
    assert lendable(short, 200.0, replica=True) == []  # past the update's end
    # a training gang still sees them wanted now; switched off, so does a replica
    assert lendable(short, 100.0, replica=False) == []
    assert lendable(short, 100.0, replica=True, lend_beside_stages=False) == []
    # a long update (8M tokens, 6 micro-batches left) grows onto them: not lent
    long = _update_beside_free_home(6, 8_000_000)
    assert [d for d in get_policy("jigsaw", migration=False).decide(long) if isinstance(d, ResizeStage)]
    assert lendable(long, 100.0, replica=True) == []


def test_a_replica_lent_beside_a_stage_is_not_evicted_before_the_stage_ends():
    # p0's short update (on 0-1, it would not grow) lends its free home to p1's replicas until
    # it ends; p1 took device 2. The reclaim must agree with that loan: the replica stays
    # (it was evicted in the round after each launch, its requests moved back and forth:
    # held-out mix s21008, 35,306 moves of one pipeline's requests in three steps)
    rs = RunningStageView(1, "update_actor", (0, 1), None, 2, 8, 105.0, True)
    reps = [replica("p1", 5, (4,), generated=[3000], predicted=[30000]),
            replica("p1", 6, (2,), generated=[2000], predicted=[30000])]
    busy = {4: DeviceTask("replica", "p1", replica=5), 2: DeviceTask("replica", "p1", replica=6),
            **{d: DeviceTask("stage", "p0", stage="update_actor") for d in (0, 1)}}
    ready = _paced(step(1, samples=32, done=32, rewarded=32, tokens=100_000), 20.0)
    p0 = pipeline(0, range(4), gen_next=2, train_next=1, version=1, stage_next=3, stage_running=True,
                  running_end=300.0, running_stage=rs, steps={1: ready})
    p1 = pipeline(1, range(4, 8), replicas=reps, gen_next=3, train_next=2, version=2, generating=True,
                  steps={2: StepView(2, 32, 30, 30, 0, 90.0, {}, {}, 1)})
    st = state([p0, p1], busy=busy)
    # (keep_critical_loans off: p1 keeps its loan here by the stage's lending alone)
    evicted = lambda **opts: [d for d in get_policy("jigsaw", keep_critical_loans=False, **opts).decide(st)
                              if isinstance(d, RetireReplica) and d.replica == 6]
    assert evicted() == []
    assert evicted(lend_beside_stages=False) == [RetireReplica(6)]


def _rollout_ready_home_returning(boundary_in_s):
    """p0's step 1 may start generating; its home device 0 is free, devices 1-3 are lent to
    p1's update_actor, which hands them back at its boundary ``boundary_in_s`` from now."""
    rs1 = RunningStageView(0, "update_actor", (1, 2, 3, 4, 5, 6, 7), (4, 5, 6, 7), 6, 8, 100.0 + boundary_in_s,
                           True)
    p0 = pipeline(0, range(4), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    p1 = pipeline(1, range(4, 8), gen_next=1, stage_next=3, stage_running=True, running_end=400.0,
                  running_stage=rs1, steps={0: step(0, done=32, rewarded=32, tokens=8_000_000)})
    busy = {d: DeviceTask("stage", "p1", stage="update_actor") for d in range(1, 8)}
    return state([p0, p1], busy=busy)


def test_a_rollout_waits_a_moment_for_its_home_rather_than_start_on_one_replica():
    starts = lambda out: [d for d in out if isinstance(d, StartGen)]
    # devices 1-3 are back in 0.2 s: the step waits, then starts on all four
    assert starts(get_policy("jigsaw").decide(_rollout_ready_home_returning(0.2))) == []
    assert starts(get_policy("jigsaw", wait_for_home=False).decide(_rollout_ready_home_returning(0.2))) == [
        StartGen("p0", 1)]
    # back only after much of the projected generation: it starts now on device 0
    assert starts(get_policy("jigsaw").decide(_rollout_ready_home_returning(60.0))) == [StartGen("p0", 1)]


def test_balance_counts_tool_calls_as_seconds_no_device_count_shortens():
    # a sandboxed agent's steps wait on its tools whatever its share: without them its
    # projection looked short and balance took its devices (a random mix, m13: +5.6%)
    policy = get_policy("jigsaw", balance=True)
    st = state([pipeline(0, range(4)), pipeline(1, range(4, 8))])
    p0 = st.order[0]
    agent = dataclasses.replace(p0, lengths=dataclasses.replace(p0.lengths, turns=9.0, tool_s=30.0))
    work, fixed = policy._work_left(st, p0)
    work_agent, fixed_agent = policy._work_left(st, agent)
    assert work_agent == work
    assert fixed_agent == pytest.approx(fixed + p0.spec.steps * 8 * 30.0)


def test_the_last_pipeline_spreads_its_rollout_over_the_devices_left_idle():
    # 512 samples of a 7B at a 6K-token observed context, the other pipeline finished:
    # every device is free and no one else will ask for them, so the step starts on as many
    # replicas as the devices allow, each at a smaller batch whose decode steps read less KV
    # (idle_spread); while another pipeline still runs, replicas keep the efficient batch
    big = small_workload(gpus=8, pipelines=2, prompts=64, samples=8, algorithms=("grpo", "grpo"),
                         agentic=(False, False)).pipelines[0]

    def launched(p1_done, **opts):
        p0 = pipeline(0, range(4), spec=big)
        p0 = dataclasses.replace(p0, lengths=LengthSummary(100, 150.0, 5850.0, 6000.0, 1.0, 16000.0))
        p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                                 done=p1_done)
        out = get_policy("jigsaw", bulk_width=False, **opts).decide(state([p0, p1]))
        return sum(len(d.devices) for d in out if isinstance(d, LaunchReplica) and d.pipeline == "p0")

    assert launched(True) == 8
    assert launched(True, idle_spread=False) == 4  # its home: about 128 sequences a replica
    assert launched(False) == 4


def _full_shard(gpus_per_node: int) -> CostModel:
    """H100 nodes of ``gpus_per_node`` whose gangs shard over all their devices (no hybrid
    sharding): past a node a pass's all-gathers cross the NICs, the regime these width
    rules are for (with hybrid sharding a forward pass whose weights fit one device runs
    data parallel, with no collectives, and the widest gang is the fastest)."""
    return CostModel.for_nodes(hardware_profile("h100"), gpus_per_node,
                               dataclasses.replace(EfficiencyFactors(), hybrid_shard=False))


def _ready_stage_gang(p1_done, **opts):
    """The gang p0's ready forward pass (32 trajectories of 900 tokens) gets on 8 free
    devices on nodes of 4, while p1 runs (``p1_done`` False) or after it finished."""
    cost = _full_shard(4)
    p0 = pipeline(0, range(8), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    p1 = dataclasses.replace(pipeline(1, (), gen_next=1, train_next=1, version=1, steps={1: step(1)}), done=p1_done)
    st = dataclasses.replace(state([p0, p1]), gpus_per_node=4, cost=cost)
    out = get_policy("jigsaw", migration=False, **opts).decide(st)
    return [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]


def test_a_gang_takes_no_more_devices_than_its_fastest_width():
    # on nodes of 4 a gang of 8 moves its all-gathers over the node NICs: over a few
    # thousand tokens one node's 4 devices finish the pass sooner than all 8, so a ready
    # stage takes 4 on one node (fastest_width), while another pipeline runs as well as
    # for the run's last one; with the rule off it takes every free device
    cost = _full_shard(4)
    assert cost.forward_s(MODEL, 4, 32 * 900) < cost.forward_s(MODEL, 8, 32 * 900)
    for p1_done in (False, True):
        got = _ready_stage_gang(p1_done, idle_spread=False)
        assert len(got) == 1 and len(got[0]) == 4 and len({d // 4 for d in got[0]}) == 1
        assert [len(g) for g in _ready_stage_gang(p1_done, idle_spread=False, fastest_width=False)] == [8]


def test_the_fastest_width_is_any_count_not_only_a_power_of_two():
    # on nodes of 6 the pass is fastest on one whole node: 6 devices beat 4 (fewer devices
    # computing) and 8 (the all-gathers cross the NICs); the gang takes those 6
    cost = _full_shard(6)
    times = {w: cost.forward_s(MODEL, w, 32 * 900) for w in range(1, 9)}
    assert min(times, key=times.get) == 6
    p0 = pipeline(0, range(8), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    p1 = pipeline(1, (), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    st = dataclasses.replace(state([p0, p1]), gpus_per_node=6, cost=cost)
    out = get_policy("jigsaw", migration=False, idle_spread=False).decide(st)
    got = [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]
    assert len(got) == 1 and len(got[0]) == 6 and len({d // 6 for d in got[0]}) == 1


def test_a_gang_leaves_out_devices_without_its_state_where_loading_it_costs_more_than_they_gain():
    # p0's update is ready with its home (0-3, holding its training state) and the devices
    # of p1, done (4-7, holding p1's), free: on 8 the pass is 4.2 -> 3.3 s, and loading the
    # 7B's state onto them 0.6 s at 25 GB/s from the host, 6.1 s at 2.5 GB/s, where the
    # gang of the 4 that hold it loads nothing
    ppo = STAGES_BY_ALGORITHM["ppo"]
    p0 = pipeline(0, range(4), gen_next=1, steps={0: step(0, samples=32, done=32, rewarded=32, tokens=100000)})
    p0 = dataclasses.replace(p0, stages=ppo, stage_next=ppo.index("update_critic"))
    p1 = dataclasses.replace(pipeline(1, range(4, 8)), done=True)
    st = dataclasses.replace(state([p0, p1]), concurrent_stages=False)
    slow = CostModel(dataclasses.replace(COST.hw, host_gbps=2.5))
    gangs = [[d.devices for d in get_policy("jigsaw").decide(dataclasses.replace(st, cost=cost))
              if isinstance(d, RunStage)] for cost in (COST, slow)]
    assert gangs == [[tuple(range(8))], [(0, 1, 2, 3)]]


def test_a_forward_pass_on_the_devices_holding_the_state_is_priced_with_the_updates_reload():
    # p0's log-prob pass over 2,000 tokens is ready; only device 0 holds its training state
    # (1-7 hold p1's, done). On device 0 alone the pass takes 2.06 s, on all 8 2.01 s plus
    # 0.61 s loading the state; but the 7B's update needs 2 devices, and its gang would
    # reach one without the state, loading it onto both (2.44 s): the pass takes all 8
    p0 = pipeline(0, range(4), gen_next=1, steps={0: step(0, samples=32, done=32, rewarded=32, tokens=2000)})
    p1 = dataclasses.replace(pipeline(1, range(4, 8)), done=True)
    st = dataclasses.replace(state([p0, p1]), concurrent_stages=False)
    st = dataclasses.replace(st, devices=tuple(
        dataclasses.replace(d, train_resident="p0" if d.id == 0 else "p1") for d in st.devices))
    assert COST.stage_min_gang(MODEL, "update_actor") == 2
    gangs = [d.devices for d in get_policy("jigsaw").decide(st) if isinstance(d, RunStage)]
    assert gangs == [tuple(range(8))]


def test_a_paused_stage_resumes_on_no_more_devices_than_its_fastest_width():
    # p0's update over 32 x 900 tokens, paused by a reclaim, resumes with its 8-device home
    # free on nodes of 4: 3 devices of one node end the pass sooner than all 8 (their
    # all-gathers cross the NICs) and than 4 (fastest_width)
    cost = CostModel.for_nodes(hardware_profile("h100"), 4)
    times = {w: cost.train_s(MODEL, w, 32 * 900) for w in range(1, 9)}
    assert min(times, key=times.get) == 3
    rs = RunningStageView(0, "update_actor", (), None, 6, 8, float("inf"), True)
    p0 = pipeline(0, range(8), gen_next=1, stage_next=3, stage_running=True, running_stage=rs,
                  steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    p1 = pipeline(1, (), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    st = dataclasses.replace(state([p0, p1]), gpus_per_node=4, cost=cost)

    def resumed(**opts):
        out = get_policy("jigsaw", migration=False, **opts).decide(st)
        return [d.devices for d in out if isinstance(d, ResizeStage) and d.pipeline == "p0"]

    got = resumed()
    assert len(got) == 1 and len(got[0]) == 3 and len({d // 4 for d in got[0]}) == 1
    assert [len(g) for g in resumed(fastest_width=False)] == [8]


def _wide_update_gang(cost):
    """The gang a 32B update (3M tokens) starts on with 32 of its 40 home devices free on
    nodes of 8: nodes 0-2 whole, 4 devices each of nodes 3 and 4 (the others decode another
    pipeline's long responses)."""
    m32 = model_profile("qwen2.5-32b")
    p1 = pipeline(1, (), [replica("p1", 1, (28, 29, 30, 31), [100] * 4, [20000.0] * 4),
                          replica("p1", 2, (36, 37, 38, 39), [100] * 4, [20000.0] * 4)],
                  generating=True, gen_next=1, steps={0: step(0, samples=8)})
    p0 = dataclasses.replace(pipeline(0, range(40), gen_next=1, stage_next=3,
                                      steps={0: step(0, done=32, rewarded=32, tokens=3_000_000)}), model=m32)
    busy = _busy_with_replicas([p1])
    devices = tuple(DeviceView(d, d // 8, busy.get(d), (), "p0") for d in range(40))
    home = {"p0": (p0.static_devices, p0.static_devices), "p1": ((), ())}
    st = SchedulerState(t=100.0, gpus=40, gpus_per_node=8, devices=devices,
                        free=frozenset(d for d in range(40) if d not in busy), order=(p0, p1), cost=cost,
                        max_num_seqs=256, memo=JigsawMemo(home, {d: "p0" for d in range(40)}))
    out = get_policy("jigsaw", migration=False).decide(st)
    return [set(d.devices) for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]


def test_a_wide_gang_takes_whole_nodes_where_hybrid_sharding_pays():
    # all 32 free devices shard over the whole gang, across the NICs (nodes 3 and 4 hold 4
    # each: no groups of 8, the fewest that hold a 32B's training state); the 24 of nodes
    # 0-2 shard in a group per node and finish sooner, so the gang is those 24
    cost = CostModel.for_nodes(hardware_profile("h100"), 8)
    m32 = model_profile("qwen2.5-32b")
    assert cost.train_s(m32, 24, 3e6, nodes=(8, 8, 8)) < cost.train_s(m32, 32, 3e6, nodes=(8, 8, 8, 4, 4))
    assert _wide_update_gang(cost) == [set(range(24))]
    # sharded over whole gangs only, it takes the narrowest gang of its fastest width
    got = _wide_update_gang(_full_shard(8))
    assert len(got) == 1 and len(got[0]) < 24


def test_a_gang_narrower_than_its_home_takes_whole_nodes_for_its_hybrid_shard_groups():
    # a 32B's update over 330K tokens with its home of 32 free devices starting mid-node
    # (2-33 on nodes of 8: 6, 8, 8, 8, 2): its fastest width is 16, sharded in two node-local
    # groups of 8 (11 s); the first 16 of its home (6, 8 and 2 on three nodes) form no such
    # groups and shard over all 16 across the NICs (63 s), so the gang is two whole nodes
    cost = CostModel.for_nodes(hardware_profile("h100"), 8)
    m32 = model_profile("qwen2.5-32b")
    tokens = 330_000
    assert cost.train_s(m32, 16, tokens, nodes=(8, 8)) < 0.5 * cost.train_s(m32, 16, tokens, nodes=(6, 8, 2))
    assert min(range(8, 33), key=lambda w: cost.train_s(m32, w, tokens)) == 16
    p0 = dataclasses.replace(pipeline(0, range(2, 34), gen_next=1, stage_next=3,
                                      steps={0: step(0, done=32, rewarded=32, tokens=tokens)}), model=m32)
    p1 = pipeline(1, (), gen_next=1, train_next=1, version=1, steps={1: step(1)})
    devices = tuple(DeviceView(d, d // 8, None, (), "p0" if d >= 2 else None) for d in range(40))
    home = {"p0": (p0.static_devices, p0.static_devices), "p1": ((), ())}
    st = SchedulerState(t=100.0, gpus=40, gpus_per_node=8, devices=devices, free=frozenset(range(40)),
                        order=(p0, p1), cost=cost, max_num_seqs=256,
                        memo=JigsawMemo(home, {d: "p0" for d in range(2, 34)}))
    out = get_policy("jigsaw", migration=False, idle_spread=False).decide(st)
    got = [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]
    assert len(got) == 1 and len(got[0]) == 16
    per_node = {}
    for d in got[0]:
        per_node[d // 8] = per_node.get(d // 8, 0) + 1
    assert sorted(per_node.values()) == [8, 8]


def test_the_last_pipelines_gang_takes_the_width_priced_fastest():
    # idle_spread on its own (fastest_width off): the run's last pipeline takes the
    # narrowest gang that ends as soon as all 8 would, 4 on one node; while another
    # pipeline runs, or with the rule off, a ready stage takes every free device
    got = _ready_stage_gang(True, fastest_width=False)
    assert len(got) == 1 and len(got[0]) == 4 and len({d // 4 for d in got[0]}) == 1
    assert [len(g) for g in _ready_stage_gang(True, idle_spread=False, fastest_width=False)] == [8]
    assert [len(g) for g in _ready_stage_gang(False, fastest_width=False)] == [8]


def _crowded_rollout(p1, p0_steps=None):
    # p0 decodes 2 x 128 requests 6K tokens into their responses on two devices; 4K more
    # tokens each are predicted: at that batch a step reads ~0.8M tokens of KV
    reps = [replica("p0", 1, (0,), [6000] * 128, [4000.0] * 128),
            replica("p0", 2, (1,), [6000] * 128, [4000.0] * 128)]
    spec = SPECS[0] if p0_steps is None else dataclasses.replace(SPECS[0], steps=p0_steps)
    p0 = pipeline(0, range(4), reps, generating=True, gen_next=1, steps={0: step(0, samples=256)}, spec=spec)
    busy = _busy_with_replicas([p0, p1])
    return state([p0, p1], busy=busy)


def test_the_critical_crowded_rollout_spreads_onto_devices_no_one_wants():
    # the other pipeline is done: p0 sets the makespan, and new replicas on the free devices
    # take running requests from the crowded two (each decodes a smaller batch faster).
    # (Its 256 requests, with nothing else ready, count as a tail to re-shard wider first:
    # ``widen_when_idle``, off here to see the spread alone.)
    p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                             done=True)
    st = _crowded_rollout(p1)
    out = get_policy("jigsaw", widen_when_idle=False).decide(st)
    spread = [d for d in out if isinstance(d, LaunchReplica) and d.spread]
    assert spread and all(d.pipeline == "p0" and not d.absorb for d in spread)
    assert {x for d in spread for x in d.devices} <= set(st.free)
    assert not [d for d in get_policy("jigsaw", critical_spread=False, widen_when_idle=False).decide(st)
                if isinstance(d, LaunchReplica) and d.spread]


def test_a_crowded_rollout_off_the_critical_path_does_not_spread():
    # p1 has 20 steps ahead where p0 is in its last: p1 is projected to finish last, and
    # p0's replicas keep their batch (the free devices are worth more to p1)
    lone = replica("p1", 3, (4,), [100], [20.0])
    p1 = pipeline(1, range(4, 8), [lone], generating=True, gen_next=1, steps={0: step(0, samples=1)},
                  spec=dataclasses.replace(SPECS[1], steps=20))
    out = get_policy("jigsaw").decide(_crowded_rollout(p1, p0_steps=1))
    assert not [d for d in out if isinstance(d, LaunchReplica) and d.spread]
    p1 = dataclasses.replace(p1, spec=dataclasses.replace(SPECS[1], steps=1))
    out = get_policy("jigsaw").decide(_crowded_rollout(p1, p0_steps=20))  # swapped: p0 spreads
    assert [d for d in out if isinstance(d, LaunchReplica) and d.spread]


def _crowded_tail(per_replica):
    """p0, the run's last pipeline, decodes 2 x ``per_replica`` requests 12K tokens into
    their responses on two devices (few enough to count as a tail: ``widen_requests``),
    4K more tokens each predicted; the other six devices are free."""
    reps = [replica("p0", 1, (0,), [12000] * per_replica, [4000.0] * per_replica),
            replica("p0", 2, (1,), [12000] * per_replica, [4000.0] * per_replica)]
    p0 = pipeline(0, range(4), reps, generating=True, gen_next=1, steps={0: step(0, samples=2 * per_replica)})
    p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                             done=True)
    return state([p0, p1], busy=_busy_with_replicas([p0, p1]))


def test_a_crowded_tail_spreads_where_no_wider_replica_can_take_it():
    # 40 long-context requests a replica, each decode step reading their KV, on nodes of
    # one device (as a 4-wide replica on 4-GPU nodes: no wider width to re-shard to).
    # Under spread_in_tail new single-device replicas on the free devices take running
    # requests; without it the tail keeps its two replicas while six devices stand idle
    st = dataclasses.replace(_crowded_tail(40), gpus_per_node=1)
    assert sum(r.load for r in st.order[0].replicas) <= 128  # a tail by its request count
    out = get_policy("jigsaw").decide(st)
    spread = [d for d in out if isinstance(d, LaunchReplica) and d.spread]
    assert len(spread) >= 2 and all(len(d.devices) == 1 and not d.absorb for d in spread)
    assert {x for d in spread for x in d.devices} <= set(st.free)
    assert not [d for d in get_policy("jigsaw", spread_in_tail=False).decide(st) if isinstance(d, LaunchReplica)]


def test_a_thin_tail_is_still_resharded_wider():
    # 8 requests a replica: not crowded on one device, so no spread; the tail is re-sharded
    # onto one wider replica (its steps read the weights for few sequences) with or without
    # spread_in_tail
    st = _crowded_tail(8)
    for opts in ({}, {"spread_in_tail": False}):
        out = get_policy("jigsaw", **opts).decide(st)
        assert not [d for d in out if isinstance(d, LaunchReplica) and d.spread]
        assert [d.absorb for d in out if isinstance(d, LaunchReplica)] == [(1, 2)]


def test_a_spread_is_priced_on_the_new_replicas_width():
    # p0, the run's last pipeline, decodes 32 requests 30K tokens into their responses on
    # one widened replica, as wide as its node. Spread onto single devices (its launch
    # width), 4-8 requests each would decode slower than the 32 do 4-wide: no spread;
    # 2-wide, the single devices end sooner and it spreads
    def spread_of(devices):
        reps = [replica("p0", 1, devices, [30000] * 32, [4000.0] * 32)]
        p0 = pipeline(0, range(4), reps, generating=True, gen_next=1, steps={0: step(0, samples=32)})
        p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                                 done=True)
        st = state([p0, p1], busy=_busy_with_replicas([p0, p1]))
        # nodes as wide as the replica: no wider re-shard to take the tail instead; the
        # launch width held at the cheapest token's (``alone_width`` would launch p0, alone,
        # 4-wide at this context, and a spread 4-wide onto devices 4-7 ends sooner)
        out = get_policy("jigsaw", alone_width=False).decide(dataclasses.replace(st, gpus_per_node=len(devices)))
        return [d.devices for d in out if isinstance(d, LaunchReplica) and d.spread]

    assert spread_of((0, 1, 2, 3)) == []
    got = spread_of((0, 1))
    assert got and all(len(g) == 1 for g in got)
    # the premise: on one device even 8 of them decode a step slower than all 32 do 4-wide
    assert COST.decode_step_s(MODEL, 1, 8, 8 * 30200.0) > COST.decode_step_s(MODEL, 4, 32, 32 * 30200.0)


def test_a_spread_leaves_out_devices_whose_class_holds_few_of_the_requests():
    # the crowded p0 of ``_crowded_rollout`` (2 x 128 requests at 6-10K tokens of context on
    # H100) beside a finished p1 whose home (4-7) is a 24 GB class: a one-device replica
    # there holds 27K tokens of KV, two or three of the 32 requests a spread replica takes,
    # and would drain them in waves slower than the replica it relieves. Priced as the
    # pool's first class (H100) it spread onto all six free devices; at each class's own
    # price, onto the two H100 only (on one class, still all six)
    p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                             done=True)
    st = _crowded_rollout(p1)
    small = CostModel.for_nodes(hardware_profile({"name": "rtx4090", "flops_tflops": 165.0, "hbm_tbps": 1.008,
                                                  "memory_gb": 24.0, "link_gbps": 32.0}, "gpu"), 8)
    assert small.kv_capacity_tokens(MODEL, 1) < 3 * 10_000
    classes = (DeviceClassView(0, "h", "h100", range(0, 4), COST, None, False, None),
               DeviceClassView(1, "s", "rtx4090", range(4, 8), small, None, False, None))

    def spread(s):
        # the launch width held at the cheapest token's (``alone_width`` would launch p0,
        # alone, wider at this context, and ``widen_when_idle`` re-shard its 256 requests
        # wider: the class pricing is what this test is of)
        return [d.devices for d in get_policy("jigsaw", alone_width=False, widen_when_idle=False).decide(s)
                if isinstance(d, LaunchReplica) and d.spread]

    assert spread(st) == [(2,), (3,), (4,), (5,), (6,), (7,)]
    assert spread(dataclasses.replace(st, classes=classes)) == [(2,), (3,)]


def _wide_replica_state(busy=()):
    """p0, the run's last pipeline, decodes 200 requests on one 4-wide replica (its spec's
    ``rollout_tp``) on nodes of two devices: the replica spans nodes 0 and 1. Nodes 2 and 3
    (devices 4-7) are free but for ``busy``."""
    n = 200
    reps = [replica("p0", 1, (0, 1, 2, 3), [8000] * n, [4000.0] * n)]
    p0 = pipeline(0, range(4), reps, generating=True, gen_next=1, steps={0: step(0, samples=n)},
                  spec=dataclasses.replace(SPECS[0], rollout_tp=4))
    p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                             done=True)
    taken = _busy_with_replicas([p0])
    taken.update({d: DeviceTask("stage", "p1") for d in busy})
    st = state([p0, p1], busy=taken)
    return dataclasses.replace(st, gpus_per_node=2, devices=tuple(dataclasses.replace(v, node=v.id // 2)
                                                                   for v in st.devices))


def test_a_replica_wider_than_a_node_spreads_onto_whole_free_nodes():
    # a spread replica as wide as the crowded one takes two whole free nodes (a node-local
    # group of 4 never exists on nodes of 2: such a rollout never grew past its launch);
    # with a device of one of them busy, no two whole nodes are free and nothing launches
    out = get_policy("jigsaw").decide(_wide_replica_state())
    assert [d.devices for d in out if isinstance(d, LaunchReplica) and d.spread] == [(4, 5, 6, 7)]
    assert not [d for d in get_policy("jigsaw").decide(_wide_replica_state(busy=(5,)))
                if isinstance(d, LaunchReplica)]


def _first_step_gang_state(p0_steps):
    """Both pipelines in their first step (no pace observed): p0's step 0 is ready to train
    on its idle home (0-3), with ``p0_steps`` steps in its run; p1, a one-step run, decodes
    a short tail on devices 4-5 and wants 6-7 back at once."""
    ready = step(0, samples=32, done=32, rewarded=32, tokens=32 * 900)
    p0 = pipeline(0, range(4), gen_next=1, steps={0: ready}, spec=dataclasses.replace(SPECS[0], steps=p0_steps))
    reps = [replica("p1", 1, (4,), generated=[100], predicted=[20]),
            replica("p1", 2, (5,), generated=[100], predicted=[20])]
    p1 = pipeline(1, range(4, 8), replicas=reps, gen_next=1, generating=True, steps={0: step(0, samples=32, done=30)},
                  spec=dataclasses.replace(SPECS[1], steps=1))
    return _trained_on(state([p0, p1], busy=_busy_with_replicas([p1])))


def test_a_pipeline_predicted_to_finish_clearly_last_is_critical_from_its_first_step():
    # p0 has 20 steps ahead, p1 is in its last one's tail: before any pace is observed, p0's
    # finish projected from its observed lengths is far past p1's, so its gang takes the devices p1 wants back
    # (lend_to_critical); without predicted_pace, or when p0's run is as short, no one is
    # critical before a step ends and p0 keeps to its home
    def gang(p0_steps, **opts):
        out = get_policy("jigsaw", **opts).decide(_first_step_gang_state(p0_steps))
        return [set(d.devices) for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]

    assert gang(20) == [{0, 1, 2, 3, 6, 7}]
    assert gang(20, predicted_pace=False) == [{0, 1, 2, 3}]
    assert gang(1) == [{0, 1, 2, 3}]


def test_a_training_gang_never_takes_fewer_devices_than_hold_its_state():
    # a 7B update's training state (16 bytes a parameter, 122 GB) needs two 80 GB devices
    assert COST.min_gang(MODEL, update=True) == 2 and COST.min_gang(MODEL, update=False) == 1
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, stage_running=True, running_end=1e6,
                  steps={1: step(1, done=32, rewarded=32)})

    def ready(free):
        p0 = pipeline(0, range(4), gen_next=1, stage_next=3, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
        busy = {d: DeviceTask("stage", "p1", stage="old_log_prob") for d in range(4, 8)}
        busy.update({d: DeviceTask("stage", "p1", stage="old_log_prob") for d in range(4) if d not in free})
        return state([p0, p1], busy=busy)

    gang = lambda out: [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]
    for lookahead in (True, False):
        assert gang(get_policy("jigsaw", lookahead=lookahead).decide(ready({0}))) == []
        assert gang(get_policy("jigsaw", lookahead=lookahead).decide(ready({0, 1}))) == [(0, 1)]
    # a reclaim that would leave a running update one device pauses it instead
    p0 = _update_actor_running((0, 4))
    p1 = pipeline(1, range(4, 8), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    busy = {d: DeviceTask("stage", "p0", stage="update_actor") for d in (0, 4)}
    out = get_policy("jigsaw", loans=True).decide(state([p0, p1], busy=busy))
    assert ResizeStage("p0", 0, "update_actor", ()) in out


def _waiting_rollout(running: int, queued: int, generated: int):
    """p0 decodes its step on one replica (device 0) at ``running`` sequences, ``generated``
    tokens each, with ``queued`` more waiting for a batch slot; the rest of its home (1-3)
    is free. p1 trains its step 0 on its own home."""
    rep = dataclasses.replace(replica("p0", 1, (0,), [generated] * running, [3000.0] * running), queued=queued)
    p0 = pipeline(0, range(4), [rep], generating=True, gen_next=1, steps={0: step(0, samples=running + queued)})
    p1 = pipeline(1, range(4, 8), gen_next=1, stage_next=3, stage_running=True, running_end=400.0,
                  steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    return state([p0, p1], busy=_busy_with_replicas([p0]) | {d: DeviceTask("stage", "p1") for d in range(4, 8)})


def _grown(out):
    return [d for d in out if isinstance(d, LaunchReplica) and d.pipeline == "p0" and d.rebalance]


def test_a_rollout_grows_by_the_replicas_its_waiting_requests_fill():
    # a replica at its batch limit (256) with 300 more waiting: two new replicas admit
    # them at the context the running ones hold (the third free device would start empty,
    # be retired, and the rollout grow again the next round)
    grown = _grown(get_policy("jigsaw").decide(_waiting_rollout(256, 300, generated=50)))
    assert len(grown) == 2 and {x for d in grown for x in d.devices} <= {1, 2, 3}
    # 600 waiting fill all three
    assert len(_grown(get_policy("jigsaw").decide(_waiting_rollout(256, 600, generated=50)))) == 3


def test_a_rollout_whose_kv_cache_holds_few_long_contexts_grows_onto_more_replicas():
    # 40K tokens a running request: an engine admits far fewer of the 300 waiting than
    # its batch limit, so the rollout takes every free device of its home
    per = COST.kv_capacity_tokens(MODEL, 1) // (200 + 40000)
    assert 3 * per < 300
    assert len(_grown(get_policy("jigsaw").decide(_waiting_rollout(40, 300, generated=40000)))) == 3


def test_replicas_evicted_in_one_round_do_not_pile_onto_one_sibling():
    # p0's rollout runs on its home (devices 0 and 1) and on two replicas borrowed from p1
    # (devices 4 and 5), 100 requests each; p1's batch is ready and it reclaims its home.
    # Each evicted replica's requests fit any home replica alone (200 of 256 sequences),
    # but not both together: the engines' reports do not show the first move yet, so the
    # second must count it and take the other home replica
    def busy_replica(rid, device):
        return replica("p0", rid, (device,), generated=[500] * 100, predicted=[2000] * 100)

    reps = [busy_replica(1, 0), busy_replica(2, 1), busy_replica(3, 4), busy_replica(4, 5)]
    p0 = pipeline(0, range(4), replicas=reps, gen_next=1, generating=True, steps={0: step(0, samples=400)})
    p1 = pipeline(1, range(4, 8), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    out = get_policy("jigsaw").decide(state([p0, p1], busy=_busy_with_replicas([p0])))
    moves = {d.src: d.dst for d in out if isinstance(d, Migrate)}
    assert {RetireReplica(3), RetireReplica(4)} <= set(out)
    assert set(moves) == {3, 4} and sorted(moves.values()) == [1, 2]


def test_an_owner_waiting_on_its_rewards_lends_its_home_for_the_wait_it_has_seen():
    # p1 generated its whole step 10 s ago and waits on a sandbox scoring it; its earlier
    # steps waited at least 100 s for their last reward, so its free home (devices 4-7) is
    # lendable for 90 s more: p0's starting rollout, wider than its one-device home,
    # borrows it. Before any step's rewards were in (no history), or with the switch off,
    # p1 wants its home at once
    big = small_workload(gpus=8, pipelines=2, prompts=128, samples=8, algorithms=("grpo", "grpo"),
                         agentic=(False, False)).pipelines[0]
    p0 = pipeline(0, (0,), spec=big)
    waiting = dataclasses.replace(step(0, samples=32, done=32, rewarded=20), gen_end_t=90.0)
    p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, steps={0: waiting}),
                             stage_history_s={"reward": (100.0, 140.0)})

    def borrowed(pipes, **options):
        out = get_policy("jigsaw", migration=False, **options).decide(state(pipes, t=100.0))
        return {d for x in out if isinstance(x, LaunchReplica) and x.pipeline == "p0" for d in x.devices} & {4, 5, 6, 7}

    assert borrowed([p0, p1])
    assert not borrowed([p0, p1], reward_wait=False)
    assert not borrowed([p0, dataclasses.replace(p1, stage_history_s={})])
    # the wait it has seen is over: it wants its home back
    late = dataclasses.replace(p1, steps={0: dataclasses.replace(waiting, gen_end_t=-10.0)})
    assert not borrowed([p0, late])


def test_a_spread_counts_the_requests_queued_behind_a_full_kv_cache():
    # p0, the run's last pipeline, has 4 single-device replicas whose KV caches are full:
    # each runs 32 requests 24K tokens into their responses and queues 32 more. On the 4
    # free devices each replica would hold 32 requests, as many as it runs now, but none
    # queued: its load drains in one wave instead of two, so the rollout spreads (priced on
    # the decode step alone it would not: the batch each replica runs stays the same)
    def crowded(rid, device):
        run, queued, ctx = 32, 32, 24000.0
        kv = run * ctx
        return ReplicaView(rid, "p0", (device,), run, queued, kv, float(COST.kv_capacity_tokens(MODEL, 1)), 256,
                           False, COST.decode_step_s(MODEL, 1, run, kv), 0.0,
                           _Requests("p0", rid, [23800] * (run + queued), [4000.0] * (run + queued)))

    reps = [crowded(i + 1, i) for i in range(4)]
    assert all(r.kv_tokens > 0.95 * r.kv_capacity for r in reps)
    p0 = pipeline(0, range(4), reps, generating=True, gen_next=1, steps={0: step(0, samples=256)})
    p1 = dataclasses.replace(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                             done=True)
    st = state([p0, p1], busy=_busy_with_replicas([p0, p1]))
    # the spread rule on its own: with ``grow_on_queue`` the queued requests grow the
    # rollout onto the free devices first, in the same round
    out = get_policy("jigsaw", grow_on_queue=False).decide(st)
    spread = [d for d in out if isinstance(d, LaunchReplica) and d.spread]
    assert spread and {x for d in spread for x in d.devices} <= {4, 5, 6, 7}
    grown = [d for d in get_policy("jigsaw").decide(st) if isinstance(d, LaunchReplica) and d.pipeline == "p0"]
    assert grown and {x for d in grown for x in d.devices} <= {4, 5, 6, 7}


def test_an_agent_whose_trajectories_are_in_tool_calls_lends_its_home_for_their_turns():
    # p1, an agent off the critical path, decodes one last short turn on device 4 while 11
    # of its step's trajectories are in tool calls (30 s each, 5 turns a trajectory:
    # ``tool_wait`` projects 60 s before its rollout can end); its drain alone says a
    # second. p0's update (loans on) grows onto p1's free 5-7 for its micro-batches;
    # without ``tool_wait`` p1 looks about to want them back and p0 keeps its width, and
    # so it does when p1 is the pipeline projected last (its turns must not wait on a loan)
    rs = RunningStageView(1, "update_actor", (0, 1, 2, 3), None, 6, 8, 105.0, True)
    last = [replica("p1", 5, (4,), generated=[3000], predicted=[50])]
    busy = {4: DeviceTask("replica", "p1", replica=5), **{d: DeviceTask("stage", "p0", stage="update_actor")
                                                           for d in range(4)}}

    def grown(p0_start=90.0, p1_start=20.0, **opts):
        # each pipeline's observed pace projects its run to end at gen_start_t x steps / train_next
        ready = _paced(step(1, samples=32, done=32, rewarded=32, tokens=800_000), p0_start)
        p0 = pipeline(0, range(4), gen_next=2, train_next=1, version=1, stage_next=3, stage_running=True,
                      running_end=300.0, running_stage=rs, steps={1: ready})
        p1 = pipeline(1, range(4, 8), replicas=last, gen_next=3, train_next=2, version=2, generating=True,
                      steps={2: _paced(step(2, samples=32, done=20), p1_start)})
        p1 = dataclasses.replace(p1, lengths=dataclasses.replace(p1.lengths, turns=5.0, tool_s=30.0))
        out = get_policy("jigsaw", migration=False, loans=True, **opts).decide(state([p0, p1], busy=busy))
        return [d for d in out if isinstance(d, ResizeStage)]

    assert grown() == [ResizeStage("p0", 1, "update_actor", (0, 1, 2, 3, 5, 6, 7))]
    assert grown(tool_wait=False) == []
    assert grown(p0_start=20.0, p1_start=90.0) == []


def test_the_critical_pipelines_next_gang_is_not_lent_away_while_its_advantages_compute():
    # p1 (home 2-3) is projected last at its observed pace; p0 (home 0-1) has slack and its
    # step's log-prob pass is ready; devices 4-7 belong to no one. With p1 in its
    # advantage computation (host side, ending in 0.05 s) and its update next, p0's pass
    # keeps to its home: a gang on 4-7 would hold them through p1's update. Switched off,
    # or when p0 is the one projected last, p0 borrows them. When both passes are ready in
    # one round (their steps' projected ends tie: p0 would go first), p1's gang forms first.
    def decide(p1_stage, p0_start=100.0, p1_start=300.0, **opts):
        def ready(started):
            return _paced(step(1, samples=32, done=32, rewarded=32, tokens=32 * 900), started)

        running = p1_stage == "adv"
        p0 = pipeline(0, range(2), gen_next=2, train_next=1, version=1, steps={1: ready(p0_start)})
        p1 = pipeline(1, range(2, 4), gen_next=2, train_next=1, version=1, stage_next=2 if running else 3,
                      stage_running=running, running_end=100.05 if running else None, steps={1: ready(p1_start)})
        out = get_policy("jigsaw", migration=False, **opts).decide(_trained_on(state([p0, p1])))
        return {d.pipeline: (d.stage, set(d.devices)) for d in out if isinstance(d, RunStage)}

    assert decide("adv") == {"p0": ("old_log_prob", {0, 1})}
    off = decide("adv", critical_claim=False)
    assert off["p0"][1] > {0, 1, 4}
    assert decide("adv", p0_start=300.0, p1_start=100.0)["p0"][1] > {0, 1, 4}
    first = decide("update_actor")["p1"]  # its narrowest gang that is no slower: 3 devices
    assert first[0] == "update_actor" and len(first[1]) > 2
    off = decide("update_actor", critical_claim=False)
    assert off["p0"][1] >= {0, 1, 4, 5, 6, 7} and off["p1"] == ("update_actor", {2, 3})


def test_a_rollout_whose_engines_queue_requests_grows_onto_devices_left_idle():
    # p0 (asynchronous: no rule for the run's last synchronous pipeline applies) has four
    # one-device replicas running 40 long sequences each (their caches nearly full at a
    # context far past the 750-token mean of the trajectories finished so far) with 30
    # more queued on each; p1 has finished, its devices 4-7 idle. From the mean context
    # the four replicas would hold all 280 requests; the queues say they do not
    cap = float(COST.kv_capacity_tokens(MODEL, 1))
    reps = []
    for rid in range(4):
        rows = tuple(RequestView(RequestId("p0", 0, 70 * rid + i, 0), i // 4, None, 200, 6000 if i < 40 else 0, 16000,
                                 300.0, rid, i >= 40, 4000.0) for i in range(70))
        src = type("Src", (), {"views": lambda self, replica=None, rows=rows: rows,
                               "predicted": lambda self, replica=None: np.full(70, 4000.0)})()
        step_s = COST.decode_step_s(MODEL, 1, 40, 0.95 * cap)
        reps.append(ReplicaView(rid, "p0", (rid,), 40, 30, 0.95 * cap, cap, 256, False, step_s, 0.0, src))
    spec = dataclasses.replace(SPECS[0], mode="async", staleness=1)
    p0 = pipeline(0, range(4), replicas=reps, generating=True, gen_next=2, steps={0: step(0, samples=280, done=0)},
                  spec=spec)
    p1 = dataclasses.replace(pipeline(1, range(4, 8)), done=True)
    st = state([p0, p1], busy=_busy_with_replicas([p0]))

    def grown(**opts):
        # critical_spread off: it would spread p0, the last pipeline left, onto them anyway
        out = get_policy("jigsaw", critical_spread=False, **opts).decide(st)
        return {d for x in out if isinstance(x, LaunchReplica) and x.pipeline == "p0" for d in x.devices}

    assert grown() and grown() <= {4, 5, 6, 7}
    assert grown(grow_on_queue=False) == set()


def _orphans_state(p0_steps, p2_steps, with_p1=True):
    """p0 (two home devices) starts a step of 512 requests at long contexts; p1 has
    finished, its four devices free (``with_p1`` False: no pipeline's home holds them);
    p2 trains on the last two."""
    spec0 = dataclasses.replace(SPECS[0], prompts_per_step=64, samples_per_prompt=8, steps=p0_steps)
    p0 = dataclasses.replace(pipeline(0, range(2), spec=spec0),
                             lengths=LengthSummary(100, 150.0, 2850.0, 3000.0, 1.0, 3000.0))
    p1 = dataclasses.replace(pipeline(1, range(2, 6), gen_next=1, train_next=1, version=1, steps={1: step(1)}),
                             done=True)
    p2 = dataclasses.replace(pipeline(1, range(6, 8), gen_next=1, stage_next=3, stage_running=True, running_end=160.0,
                                      steps={0: step(0, done=32, rewarded=32)},
                                      spec=dataclasses.replace(SPECS[1], steps=p2_steps)), name="p2", index=2)
    return state([p0, p1, p2] if with_p1 else [p0, p2],
                 busy={d: DeviceTask("stage", "p2", stage="update_actor") for d in (6, 7)})


def test_the_critical_pipelines_step_starts_on_the_devices_finished_pipelines_left():
    # p0 has ten steps ahead, p2 its last: p0 is projected last, and its step's rollout
    # also takes p1's free devices, at the batch below which halving it buys little speed
    def launched(st, **kw):
        return sorted(x for d in get_policy("jigsaw", **kw).decide(st) if isinstance(d, LaunchReplica)
                      and d.pipeline == "p0" for x in d.devices)

    st = _orphans_state(10, 1)
    assert launched(st, orphan_spread=True) == [0, 1, 2, 3]
    assert launched(st) == [0, 1]  # off (the default): at the batch its token costs near ideal
    # off the critical path (p2 has twenty steps ahead) it keeps that batch
    assert launched(_orphans_state(1, 20), orphan_spread=True) == [0, 1]
    # devices in no pipeline's home are no one's to want back either
    assert launched(_orphans_state(10, 1, with_p1=False), orphan_spread=True) == [0, 1, 2, 3]


def _ready_beside_a_running_stage(preemptions, classes=(), concurrent=False, share=range(4), tokens=32 * 900):
    """p0's step 0 is ready for its log-prob pass on its free home ``share``; p1 trains on
    devices 4-7 where ``share`` leaves them; the pool has seen ``preemptions``."""
    p0 = pipeline(0, share, gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=tokens)})
    pipes = [p0]
    busy = {}
    if len(share) <= 4:
        pipes.append(pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, stage_running=True,
                              running_end=1e6, steps={1: step(1, done=32, rewarded=32)}))
        busy = {d: DeviceTask("stage", "p1", stage="old_log_prob") for d in range(4, 8)}
    return dataclasses.replace(state(pipes, busy=busy), preemptions=preemptions, classes=classes,
                               concurrent_stages=concurrent)


def test_a_gang_on_devices_preempted_often_is_narrow():
    # a pass restarts whenever one of its devices is preempted (its update's start is its
    # only checkpoint): 4 devices each preempted every 20 s (as seen so far), down 10 s,
    # make the 2.2 s pass on 4 take 8.3 s expected against 4.6 s on one; at one preemption
    # in 1,000 device-seconds the 4 still win. Nothing seen: the look-ahead's gang as before
    gang = lambda seen: [d.devices for d in get_policy("jigsaw", migration=False).decide(
        _ready_beside_a_running_stage(seen)) if isinstance(d, RunStage)]
    assert gang(()) == [(0, 1, 2, 3)]
    assert gang((PreemptionsSeen(0, 40, 800.0, 400.0),)) == [(0,)]
    assert gang((PreemptionsSeen(0, 1, 1000.0, 10.0),)) == [(0, 1, 2, 3)]


def test_stages_run_alongside_on_the_devices_preemptions_have_spared():
    # with cost-aware activation off, training may take the spot class (devices 0-3); once
    # it has been preempted, the log-prob pass and the reference pass beside it are priced
    # on the devices each would get and both go to the on-demand class. Priced on the whole
    # pool, the partner of a 14B PPO step got every spot device (odd_workloads --preempt
    # seed 158: its pass never finished, 15,568 s)
    classes = (DeviceClassView(0, "spot", "h100", range(0, 4), COST, None, True, None),
               DeviceClassView(1, "od", "h100", range(4, 8), COST, None, False, None))
    stages = lambda seen: [(d.stage, d.devices) for d in get_policy("jigsaw", migration=False, cost_aware=False).decide(
        _ready_beside_a_running_stage(seen, classes, concurrent=True, share=range(8), tokens=32 * 9000))
        if isinstance(d, RunStage)]
    assert stages(()) == [("old_log_prob", (0, 1, 2, 3)), ("ref", (4, 5, 6, 7))]
    assert stages((PreemptionsSeen(0, 40, 800.0, 400.0),)) == [("old_log_prob", (4, 5)), ("ref", (6, 7))]


def test_a_gang_at_risk_may_leave_out_the_least_preempted_device_when_its_class_is_too_small():
    # the least preempted free device (0) is of a 24 GB class that holds a 7B update only
    # six at a time; the spot H100s 1-3 hold it two at a time. Candidates taken only in
    # order of least preempted all include device 0 and cannot hold the state, so the
    # update waited; each class's devices first is a candidate too, and it runs on two
    # spot devices (odd_workloads --preempt seed 36 with activation off)
    small = CostModel(hardware_profile({"name": "rtx4090", "flops_tflops": 165.0, "hbm_tbps": 1.008,
                                        "memory_gb": 24.0, "link_gbps": 32.0}))
    classes = (DeviceClassView(0, "small", "rtx4090", range(0, 1), small, None, False, None),
               DeviceClassView(1, "spot", "h100", range(1, 4), COST, None, True, None),
               DeviceClassView(2, "od", "h100", range(4, 8), COST, None, False, None))
    assert small.stage_min_gang(MODEL, "update_actor") > 4 >= 2 == COST.stage_min_gang(MODEL, "update_actor")
    p0 = pipeline(0, range(4), gen_next=1, stage_next=3, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})
    p1 = pipeline(1, range(4, 8), gen_next=1, train_next=1, version=1, stage_running=True, running_end=1e6,
                  steps={1: step(1, done=32, rewarded=32)})
    busy = {d: DeviceTask("stage", "p1", stage="old_log_prob") for d in range(4, 8)}
    seen = dataclasses.replace(state([p0, p1], busy=busy), classes=classes,
                               preemptions=(PreemptionsSeen(1, 30, 600.0, 300.0),))
    out = get_policy("jigsaw", migration=False, cost_aware=False).decide(seen)
    assert [(d.stage, d.devices) for d in out if isinstance(d, RunStage)] == [("update_actor", (1, 2))]


def test_a_gang_whose_every_width_would_almost_never_finish_still_starts():
    # each device preempted 1,000 times a second so far: every width's expected time is
    # past what a float holds. Priced infinite, the pass never started, not even after the
    # preemptions stopped (odd_workloads --preempt seed 68 stalled); it starts on its
    # likeliest gang, one device
    out = get_policy("jigsaw", migration=False).decide(
        _ready_beside_a_running_stage((PreemptionsSeen(0, 800_000, 800.0, 4000.0),)))
    assert [d.devices for d in out if isinstance(d, RunStage)] == [(0,)]


def _lendable_to(state_, borrower: int, replica: bool = True, **options) -> list:
    from jigsaw_plugin.scheduler.jigsaw.round import Round

    home = {p.name: (p.static_devices, p.static_devices) for p in state_.order}
    owner = {d: p.name for p in state_.order for d in p.static_devices}
    return get_policy("jigsaw", **options)._lendable(Round(state_, home, owner), state_.order[borrower], 500.0,
                                                    replica=replica)


def test_a_critical_synchronous_rollout_borrows_from_an_owner_with_slack_only_when_switched_on():
    # p0 (300 s a step) is projected last, p1 (100 s a step) far ahead of it: p1's free 6-7
    # are back in its hands in moments, too soon for a 500 s rollout loan by the look-ahead
    # alone; lend_rollouts_to_critical lends them to the critical rollout all the same
    assert _lendable_to(_critical_gang_state(300.0, 100.0), 0) == []
    assert _lendable_to(_critical_gang_state(300.0, 100.0), 0, lend_rollouts_to_critical=True) == [6, 7]
    # to its rollout replicas only: an early pass, a weight sync or a paused stage's resume
    # (neither a training gang nor a replica) is not one an owner can evict
    assert _lendable_to(_critical_gang_state(300.0, 100.0), 0, replica=False, lend_rollouts_to_critical=True) == []
    # not to a pipeline off the critical path
    assert _lendable_to(_critical_gang_state(100.0, 300.0), 0, lend_rollouts_to_critical=True) == []
    # nor to an asynchronous one (its chain is its training, not its rollout)
    st = _critical_gang_state(300.0, 100.0)
    p0 = dataclasses.replace(st.order[0], spec=dataclasses.replace(st.order[0].spec, mode="async", staleness=1))
    st = dataclasses.replace(st, order=(p0,) + st.order[1:])
    assert _lendable_to(st, 0, lend_rollouts_to_critical=True) == []


def test_the_pipeline_projected_last_grows_its_stage_onto_devices_finished_pipelines_left():
    # p0's first update runs on its home 0-1 (no pace yet: its first step is not trained);
    # p1 has finished, its home 2-3 free for good; p2 decodes on 4 of its home 4-7. p0 is
    # projected to finish last, but not by the margin that would mark it critical before a
    # pace (``_predicted_last``): no loan, yet no one will ever want 2-3 back
    from jigsaw_plugin.scheduler.jigsaw.round import Round

    rs = RunningStageView(0, "update_actor", (0, 1), None, 6, 8, 105.0, True)
    p0 = pipeline(0, range(2), gen_next=1, train_next=0, stage_next=3, stage_running=True, running_end=400.0,
                  running_stage=rs, steps={0: step(0, samples=32, done=32, rewarded=32, tokens=8_000_000)})
    p1 = dataclasses.replace(pipeline(1, range(2, 4)), done=True)
    spec2 = dataclasses.replace(SPECS[1], name="p2")
    tail = [replica("p2", 5, (4,), generated=[3000], predicted=[300])]
    busy = {4: DeviceTask("replica", "p2", replica=5), 0: DeviceTask("stage", "p0", stage="update_actor"),
            1: DeviceTask("stage", "p0", stage="update_actor")}

    def with_p2_pace(started):
        p2 = pipeline(1, range(4, 8), replicas=tail, gen_next=2, train_next=1, version=1, generating=True,
                      steps={1: _paced(step(1, samples=32, done=31), started)}, spec=spec2)
        return _trained_on(state([p0, p1, p2], busy=busy))

    policy = get_policy("jigsaw", migration=False)
    probe = with_p2_pace(1.0)
    home = {p.name: (p.static_devices, p.static_devices) for p in probe.order}
    owner = {d: p.name for p in probe.order for d in p.static_devices}
    p0_end = policy._projected_finish_t(Round(probe, home, owner), probe.order[0])  # from its lengths, on its share
    steps2 = spec2.steps

    def grown(p2_end, **opts):
        out = get_policy("jigsaw", migration=False, **opts).decide(with_p2_pace(p2_end / steps2))
        return [d for d in out if isinstance(d, ResizeStage)]

    # p2 paced to end at 90% of p0's projection: p0 is last, not critical; it grows onto 2-3
    assert grown(0.9 * p0_end) == [ResizeStage("p0", 0, "update_actor", (0, 1, 2, 3))]
    assert grown(0.9 * p0_end, grow_onto_orphans=False) == []
    # p2 projected last: p0 keeps its width (the orphans are the last pipeline's)
    assert grown(1.1 * p0_end) == []


class _QueuedRequests(_Requests):
    """A replica's requests with some of them waiting in its queue: ``rows`` of
    (generated, predicted remaining, queued)."""

    def __init__(self, name, replica, rows, first=0):
        self.pred = np.asarray([p for _, p, _ in rows], float)
        self.rows = tuple(RequestView(RequestId(name, 0, first + i, 0), (first + i) // 4, None, 200, g, 4096, 10.0,
                                      replica, q, p) for i, (g, p, q) in enumerate(rows))


def _replica_of(name, rid, devices, rows, kv, first=0):
    running = sum(1 for _, _, q in rows if not q)
    return ReplicaView(rid, name, tuple(devices), running, len(rows) - running, float(kv),
                       float(COST.kv_capacity_tokens(MODEL, len(devices))), 256, False, 0.02, 0.0,
                       _QueuedRequests(name, rid, rows, first))


def _moved_preempted(dst_room, **opts):
    """The requests moved by ``Migrate`` with a request list: p0 (the only unfinished
    pipeline, so the one projected last) generates on replicas 0 (device 0: its cache full,
    two running, one queued request it preempted after 900 tokens and one it never admitted)
    and 1 (device 1: no queue, one running sequence that leaves ``dst_room`` tokens of its
    cache free; it generates 300 more)."""
    cap = COST.kv_capacity_tokens(MODEL, 1)
    src = _replica_of("p0", 0, (0,), [(3000, 500, False), (2500, 500, False), (900, 400, True), (0, 600, True)],
                      0.99 * cap)
    held = cap - dst_room
    dst = _replica_of("p0", 1, (1,), [(held - 200, 300, False)], held, first=4)
    p0 = pipeline(0, range(4), replicas=(src, dst), gen_next=1, generating=True,
                  steps={0: step(0, samples=5, done=0)})
    p1 = dataclasses.replace(pipeline(1, range(4, 8)), done=True)
    st = state([p0, p1], busy=_busy_with_replicas([p0]))
    out = get_policy("jigsaw", **opts).decide(st)
    return [(d.src, d.dst, d.requests) for d in out if isinstance(d, Migrate) and d.requests]


def test_requests_an_engine_preempted_resume_on_a_sibling_whose_cache_holds_them():
    preempted = str(RequestId("p0", 0, 2, 0).trajectory)
    # the preempted request moves to the roomy sibling; the one never admitted stays queued
    # where the router put it
    assert _moved_preempted(100_000) == [(0, 1, (preempted,))]  # on by default
    assert _moved_preempted(100_000, move_preempted=False) == []
    # a sibling whose cache would not hold it (by the admission rule) takes nothing
    # (the preempted one holds 1,100 tokens and is predicted to add 400)
    assert _moved_preempted(1_500) == []


def _one_home_device_busy_for(predicted, alone=True):
    """As ``_one_home_device_about_to_free``, with a pass 100x longer (32 x 90,000 tokens)
    and the fourth device's tail predicted to end in ``predicted`` tokens; ``alone``: p1 is
    done and its devices 4-7 have left the pool (neither free nor running anything), so p0
    runs alone on its home."""
    st = _one_home_device_about_to_free()
    p0 = st.order[0]
    tail = (replica("p0", 1, (3,), generated=[500], predicted=[predicted]),)
    p0 = dataclasses.replace(p0, replicas=tail, steps={0: dataclasses.replace(p0.steps[0], tokens=32 * 90_000)})
    if not alone:
        return dataclasses.replace(st, order=(p0, st.order[1]))
    p1 = dataclasses.replace(st.order[1], done=True, stage_running=False, running_stage_end_t=None)
    devices = tuple(dataclasses.replace(d, task=None) if d.id >= 4 else d for d in st.devices)
    return dataclasses.replace(st, order=(p0, p1), devices=devices, free=frozenset({0, 1, 2}))


def test_grow_in_plan_prices_starting_now_with_the_growth_onto_home_devices_as_they_free():
    # alone, started now on three, the stage grows onto the fourth at a micro-batch boundary
    # once it frees (``grow_at_home``): priced so, starting now beats a wait the plain
    # "start now" loses to; a device free in a moment is still waited for
    started = lambda out: [d.devices for d in out if isinstance(d, RunStage) and d.pipeline == "p0"]
    plain, grown = [], []
    for predicted in (1, 30, 100, 300, 1000, 3000, 10000):
        st = _one_home_device_busy_for(predicted)
        plain.append(started(get_policy("jigsaw", migration=False, grow_in_plan=False).decide(st)))
        grown.append(started(get_policy("jigsaw", migration=False).decide(st)))
    assert plain[0] == grown[0] == []  # a moment away: both wait
    assert all(g == [(0, 1, 2)] for p, g in zip(plain, grown) if p)  # never waits where the plain plan starts
    assert any(not p and g == [(0, 1, 2)] for p, g in zip(plain, grown))  # starts where it waited
    # without growth at home there is none to price
    st = _one_home_device_busy_for(30000)
    assert started(get_policy("jigsaw", migration=False, grow_at_home=False).decide(st)) == \
        started(get_policy("jigsaw", migration=False, grow_in_plan=False, grow_at_home=False).decide(st))
    # beside a pipeline still running, the growth is not priced: another pipeline's gang
    # may take the devices as they free (synthetic mix s14)
    for predicted in (1, 30, 100, 300, 1000, 3000, 10000):
        st = _one_home_device_busy_for(predicted, alone=False)
        assert started(get_policy("jigsaw", migration=False).decide(st)) == \
            started(get_policy("jigsaw", migration=False, grow_in_plan=False).decide(st))


def test_an_owner_whose_engines_queue_more_than_a_wave_reclaims_its_home():
    # p1's step runs on one replica (device 4) that its engine filled: 256 sequences run and
    # 600 more wait in its queue, none waits for a replica (pending 0). The rest of p1's home
    # (devices 5 and 6) holds two of p0's borrowed replicas. More queued than its replicas
    # run at once is a wave and more waiting: p1 wants its home now and p0's replicas go
    # back to their home, their requests to a sibling there with room
    def p0_replica(rid, device, n=20):
        return replica("p0", rid, (device,), generated=[500] * n, predicted=[2000] * n)

    crowded = ReplicaView(9, "p1", (4,), 256, 600, 256 * 700.0, float(COST.kv_capacity_tokens(MODEL, 1)), 256,
                          False, 0.03, 0.0, _Requests("p1", 9, [500] * 256, [2000] * 256))
    p0 = pipeline(0, range(4), replicas=[p0_replica(1, 0), p0_replica(2, 1), p0_replica(3, 5), p0_replica(4, 6)],
                  gen_next=1, generating=True, steps={0: step(0, samples=80)})
    p1 = pipeline(1, range(4, 8), replicas=[crowded], gen_next=1, generating=True, steps={0: step(0, samples=856)})
    busy = _busy_with_replicas([p0, p1])

    def evicted(pipes, **options):
        out = get_policy("jigsaw", **options).decide(state(pipes, busy=busy))
        return {d.replica for d in out if isinstance(d, RetireReplica)} & {3, 4}

    assert evicted([p0, p1]) == {3, 4}
    assert evicted([p0, p1], reclaim_for_queue=False) == set()
    # a queue its replicas work through within a wave is not a claim on the home
    light = dataclasses.replace(p1, replicas=(dataclasses.replace(crowded, queued=200),))
    assert evicted([p0, light]) == set()


def _tail_of(n: int, p1, samples: int = 512):
    """p0's rollout of a step of ``samples`` down to ``n`` long requests on one replica
    (device 0), the rest of its home free; ``p1`` beside it on devices 4-7."""
    reps = [replica("p0", 1, (0,), generated=[3000] * n, predicted=[20000] * n)]
    spec = dataclasses.replace(SPECS[0], prompts_per_step=samples // SPECS[0].samples_per_prompt)
    p0 = pipeline(0, range(4), replicas=reps, gen_next=1, generating=True, spec=spec,
                  steps={0: step(0, samples=samples, done=samples - n)})
    return state([p0, p1], busy=_busy_with_replicas([p0]))


def test_a_tail_of_up_to_idle_widen_requests_widens_when_no_other_pipeline_has_work_ready():
    done = dataclasses.replace(pipeline(1, range(4, 8)), done=True)
    ready = pipeline(1, range(4, 8), gen_next=1, steps={0: step(0, done=32, rewarded=32, tokens=32 * 900)})

    def widened(st, **options):
        return [(len(d.devices), d.absorb) for d in get_policy("jigsaw", **options).decide(st)
                if isinstance(d, LaunchReplica) and d.absorb]

    # 200 requests: more than ``widen_requests`` (128), within ``idle_widen_requests`` (256)
    assert widened(_tail_of(200, done)) == [(4, (1,))]
    assert widened(_tail_of(200, done), widen_when_idle=False) == []
    assert widened(_tail_of(200, done), idle_widen_requests=199) == []
    assert widened(_tail_of(100, done), widen_when_idle=False) == [(4, (1,))]  # the tail rule as before
    # a step of 256 samples is not a tail from its start: over half of it still decodes
    assert widened(_tail_of(200, done, samples=256)) == []
    # the gate itself: beside p1's ready stage the round is the one without the rule
    def same_as_off(st):
        return get_policy("jigsaw").decide(st) == get_policy("jigsaw", widen_when_idle=False).decide(st)

    assert widened(_tail_of(200, ready)) == [] and same_as_off(_tail_of(200, ready))
    assert not same_as_off(_tail_of(200, done))
    # more than ``idle_widen_requests``: not a tail, whatever the others do
    big = _tail_of(300, done, samples=1024)
    assert widened(big) == [] and same_as_off(big)
    assert widened(big, idle_widen_requests=300) == [(4, (1,))]
