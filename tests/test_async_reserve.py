"""The jigsaw policy's ``async_reserve`` on small hand-built states.

An asynchronous pipeline (staleness 1) whose step k is generated and waits to be trained
may start step k+1's rollout at once. The training gang gets its part of the home first,
the rollout the rest (a split balanced from observed lengths), and the rollout does not
grow onto the gang's part while a batch waits; once none waits, it may.
"""

import numpy as np

from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.scheduler import LaunchReplica, RetireReplica, RunStage, StartGen, get_policy
from jigsaw_plugin.scheduler.jigsaw import JigsawMemo
from jigsaw_plugin.scheduler.state import (
    DeviceTask,
    DeviceView,
    LengthSummary,
    PipelineView,
    ReplicaView,
    RequestView,
    SchedulerState,
    StepView,
)
from sim_helpers import small_workload

COST = CostModel(hardware_profile("h100"))
MODEL = model_profile("qwen2.5-7b")
GPUS = 8
ASYNC = small_workload(gpus=GPUS, pipelines=1, prompts=512, samples=16, algorithms=("dapo",), agentic=(False,),
                       modes=("async",), staleness=(1,), models=("qwen2.5-7b",)).pipelines[0]
STAGES = ("old_log_prob", "adv", "update_actor", "weight_sync")
SAMPLES = ASYNC.samples_per_step


class _Requests:
    def __init__(self, replica, n):
        self.pred = np.full(n, 400.0)
        self.rows = tuple(RequestView(RequestId("p0", 1, i, 0), i // 16, None, 200, 100, 4096, 10.0, replica, False,
                                      400.0) for i in range(n))

    def predicted(self, replica=None):
        return self.pred

    def views(self, replica=None):
        return self.rows


def _replica(rid, devices, running=256, queued=512):
    kv = float(running * 300)
    return ReplicaView(rid, "p0", tuple(devices), running, queued, kv,
                       float(COST.kv_capacity_tokens(MODEL, len(devices))), 1024, False,
                       COST.decode_step_s(MODEL, len(devices), running, kv), 0.0, _Requests(rid, running + queued))


def _step(k, done):
    n = SAMPLES if done else SAMPLES // 4
    return StepView(k, SAMPLES, n, n, n * 750, 0.0, {}, {}, k)


def _pipeline(steps, gen_next, train_next=0, stage_next=0, stage_running=False, replicas=(), version=0,
              generating=False, pending=0):
    return PipelineView(
        name="p0", index=0, spec=ASYNC, model=MODEL, stages=STAGES, static_devices=tuple(range(GPUS)),
        gen_next=gen_next, train_next=train_next, stage_next=stage_next, stage_running=stage_running,
        version=version, rollout_version=version, done=False, generating=generating, pending=pending,
        replicas=tuple(replicas), steps=steps, history=None,
        lengths=LengthSummary(8192, 150.0, 600.0, 750.0, 1.0, 6000.0), stage_history_s={},
        running_stage_end_t=None)


def _state(p, busy=None):
    busy = busy or {}
    home = {"p0": (p.static_devices, p.static_devices)}
    owner = {d: "p0" for d in range(GPUS)}
    devices = tuple(DeviceView(d, 0, busy.get(d), ("p0",), "p0") for d in range(GPUS))
    return SchedulerState(t=300.0, gpus=GPUS, gpus_per_node=8, devices=devices,
                          free=frozenset(d for d in range(GPUS) if d not in busy), order=(p,), cost=COST,
                          max_num_seqs=1024, memo=JigsawMemo(home, owner))


def _split(out):
    gang = [d for d in out if isinstance(d, RunStage) and d.stage == "old_log_prob"]
    rollout = {x for d in out if isinstance(d, LaunchReplica) for x in d.devices}
    return (set(gang[0].devices) if gang else set()), rollout


def test_a_waiting_batch_and_the_next_rollout_split_the_home():
    # step 0 is generated and waits for its log-prob pass; step 1 may start (staleness 1)
    p = _pipeline({0: _step(0, done=True)}, gen_next=1)
    out = get_policy("jigsaw").decide(_state(p))
    gang, rollout = _split(out)
    assert StartGen("p0", 1) in out
    assert gang and rollout and not gang & rollout
    # training a 512 x 16 batch outweighs generating it: most of the home goes to the gang
    assert len(gang) + len(rollout) == GPUS and len(gang) > len(rollout)


def test_without_async_reserve_the_gang_takes_the_whole_home():
    p = _pipeline({0: _step(0, done=True)}, gen_next=1)
    gang, rollout = _split(get_policy("jigsaw", async_reserve=False).decide(_state(p)))
    assert len(gang) == GPUS and not rollout


def _training_with_rollout():
    # step 1 is trained (its update runs on devices 4-7); step 2 generates on devices 0-1
    # with requests queued; devices 2 and 3 are free
    reps = [_replica(10, (0,)), _replica(11, (1,))]
    busy = {d: DeviceTask("replica", "p0", replica=r.id) for r in reps for d in r.devices}
    busy.update({d: DeviceTask("stage", "p0", stage="update_actor") for d in range(4, GPUS)})
    p = _pipeline({1: _step(1, done=True), 2: _step(2, done=False)}, gen_next=3, train_next=1, stage_next=2,
                  stage_running=True, replicas=reps, version=1, generating=True)
    return p, busy


def test_the_rollout_does_not_grow_onto_the_gangs_part_while_a_batch_waits():
    p, busy = _training_with_rollout()
    out = get_policy("jigsaw").decide(_state(p, busy))
    assert not [d for d in out if isinstance(d, LaunchReplica)]


def test_the_rollout_grows_where_no_batch_waits():
    # the same rollout once step 1 is trained (step 2, the next to train, still generates):
    # the rollout is what holds the training back, so it takes the free devices
    p, busy = _training_with_rollout()
    p = _pipeline({2: _step(2, done=False)}, gen_next=3, train_next=2, replicas=p.replicas, version=2,
                  generating=True)
    busy = {d: t for d, t in busy.items() if t.kind == "replica"}
    out = get_policy("jigsaw").decide(_state(p, busy))
    grown = {x for d in out if isinstance(d, LaunchReplica) for x in d.devices}
    assert grown and grown <= set(range(2, GPUS))


def _batch_waits_on_an_empty_rollout(devices):
    # step 0 is generated and waits for its log-prob pass; step 1's rollout holds one
    # replica on ``devices``, empty: its trajectories are all in tool calls
    rep = _replica(10, devices, running=0, queued=0)
    busy = {d: DeviceTask("replica", "p0", replica=10) for d in devices}
    p = _pipeline({0: _step(0, done=True), 1: _step(1, done=False)}, gen_next=2, replicas=[rep], generating=True)
    return _state(p, busy)


def test_an_empty_rollout_replica_yields_the_home_to_a_waiting_batch():
    # kept, the replica would hold all 8 devices until step 1's last trajectory ends and
    # the batch would wait that long: it goes, and the log-prob pass starts on the home
    st = _batch_waits_on_an_empty_rollout(tuple(range(GPUS)))
    out = get_policy("jigsaw").decide(st)
    assert RetireReplica(10) in out
    gang, _ = _split(out)
    assert gang
    # with the switch off the replica stays for its trajectories' next turns
    out = get_policy("jigsaw", async_reserve=False).decide(st)
    assert RetireReplica(10) not in out and not _split(out)[0]


def test_an_empty_rollout_replica_stays_where_the_free_devices_hold_a_gang():
    out = get_policy("jigsaw").decide(_batch_waits_on_an_empty_rollout((0, 1, 2, 3)))
    assert RetireReplica(10) not in out and _split(out)[0] <= set(range(4, GPUS))


def test_a_step_waiting_on_its_rewards_keeps_its_gangs_part_of_the_home():
    # step 0 is generated in full, half its rewards still computing (a sandbox): step 1's
    # rollout, which may start now, takes only its part of the home, as once the rewards
    # are in; with no cap it took the whole home and the gang waited for its tail
    waiting = StepView(0, SAMPLES, SAMPLES, SAMPLES // 2, SAMPLES * 750, 0.0, {}, {}, 0)
    p = _pipeline({0: waiting}, gen_next=1)
    out = get_policy("jigsaw").decide(_state(p))
    _, rollout = _split(out)
    assert StartGen("p0", 1) in out and rollout and len(rollout) < GPUS
    assert not [d for d in out if isinstance(d, RunStage)]  # nothing to train before the rewards
