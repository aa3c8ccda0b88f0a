"""A training gang's devices on a heterogeneous pool under ``cost_aware``: an asynchronous
rollout keeps off the trainer's site while a batch waits to be trained, and tail moves do
not hold the site past the time a gang is due on it (scheduler/jigsaw/tails.py,
``_gang_claims``; scheduler/jigsaw/rollout.py, ``_replica_devices``). Hand-built states:
``test_activation.hand_state``'s pool of 4 H100 (the trainer's site) and 8 A100 spot."""

import dataclasses
from types import SimpleNamespace

from jigsaw_plugin.scheduler.activation import trainer_site
from jigsaw_plugin.scheduler.decisions import LaunchReplica
from jigsaw_plugin.scheduler.jigsaw import Jigsaw
from jigsaw_plugin.scheduler.jigsaw.round import Ends, Round
from jigsaw_plugin.scheduler.state import DeviceTask, ReplicaView, StepView
from sim_helpers import one_class_state
from test_activation import MODEL, TRAINER, hand_state, spot, workload
from test_decision_latency_tails import COST, _Source


def _pool():
    state, p = hand_state(workload([TRAINER, spot("cheap", 1.2)], prompts=32))
    return state, p, trainer_site(state)


def _round(state, p):
    devices = tuple(range(state.gpus))
    return Round(state, {p.name: (devices, devices)}, {d: p.name for d in devices})


def test_an_async_rollout_keeps_off_the_trainer_site_while_a_batch_waits():
    # step 0 generated in full waits to be trained; step 1's rollout may start: under
    # cost_aware its replicas go on the spot class, the site is its gang's
    state, p, site = _pool()
    n = p.spec.samples_per_step
    waits = dataclasses.replace(p, gen_next=1, steps={0: StepView(0, n, n, 0, 10_000, 0.0, {}, {}, 0, gen_end_t=5.0)})
    state = dataclasses.replace(state, t=10.0, order=(waits,))
    groups = Jigsaw()._replica_devices(_round(state, waits), waits, 4)
    assert len(groups) == 4 and not {d for g in groups for d in g} & site
    # off, every device is one class's: the rollout takes the home in order, the site first
    off = Jigsaw(cost_aware=False)._replica_devices(_round(state, waits), waits, 4)
    assert {d for g in off for d in g} == site


def test_a_gang_is_due_on_the_site_when_the_next_stage_on_devices_is_a_gangs():
    state, p, site = _pool()
    n = p.spec.samples_per_step
    done = {0: StepView(0, n, n, n, 10_000, 0.0, {}, {}, 0, gen_end_t=5.0)}

    def claims(policy=None, **view):
        q = dataclasses.replace(p, **{"steps": done, "generating": True, **view})
        s = dataclasses.replace(state, t=10.0, order=(q,))
        return (policy or Jigsaw())._gang_claims(_round(s, q))

    # a log-prob pass running until t = 18: the reference pass follows, on a gang
    assert claims(stage_running=True, stage_next=0, running_stage_end_t=18.0) == {d: 8.0 for d in site}
    # the reference pass: the advantages (on no device) follow, then the update
    assert claims(stage_running=True, stage_next=1, running_stage_end_t=12.0) == {d: 2.0 for d in site}
    # the advantages are ready: the update is due as soon as they are computed
    assert claims(stage_next=2) == {d: 0.0 for d in site}
    # the update running: the weight sync (one device) follows, no gang
    assert claims(stage_running=True, stage_next=3, running_stage_end_t=40.0) == {}
    # nothing ready, nothing running; and with cost_aware off (a gang may take any device)
    assert claims(steps={}) == {}
    assert claims(Jigsaw(cost_aware=False), stage_next=2) == {}


def test_a_tail_is_not_merged_onto_devices_a_gang_is_due_on():
    # the tail's cheapest destination is the replica on device 0; where a gang is due on it
    # before the merged replica would drain, the tail goes to the one on device 30
    def rep(i, devices, running, left):
        return ReplicaView.build(i, "p", devices, running, 0, 4_000.0 * running, 400_000.0, 256, False, 0.02, 0.0,
                                 _Source(left * running, left))

    tail, fast, other = rep(1, (20,), 2, 300.0), rep(2, (0,), 20, 400.0), rep(3, (30,), 30, 400.0)
    live = [tail, fast, other]
    policy, state, p = Jigsaw(idle_spread=False), one_class_state(COST), SimpleNamespace(model=MODEL)

    def move(claims):
        return policy._price_move(state, p, tail, live, Ends(0.2), {}, set(), {1}, claims=claims)

    free = move(None)
    assert free[0] is fast and move({}) == free and free[1] > 1.0
    assert move({0: free[1] + 1.0}) == free  # the gang is due after the merged replica drains
    assert move({0: 1.0})[0] is other
    assert move({0: 1.0, 30: 1.0}) is None


def test_a_tail_is_not_re_sharded_onto_devices_a_gang_is_due_on_sooner_than_it_would_end():
    # the async pipeline's step-1 tail (2 requests on spot device 4) while step 0's update is
    # due on the site now: the re-shard goes on spot devices; with the claims off it takes
    # the site's H100s (the fastest), and where the gang is due only after the tail would end
    # (a log-prob pass running far longer) the site is the tail's to take
    state, p, site = _pool()
    n = p.spec.samples_per_step
    tail = ReplicaView.build(7, p.name, (4,), 2, 0, 18_000.0, 400_000.0, 256, False, 0.012, 0.0,
                             _Source(16_000.0, 8_000.0))
    steps = {0: StepView(0, n, n, n, 10_000, 0.0, {}, {}, 0, gen_end_t=5.0), 1: StepView(1, n, n - 2, 0, 0, 6.0, {}, {}, 0)}
    devices = tuple(dataclasses.replace(d, task=DeviceTask("replica", p.name, replica=7)) if d.id == 4 else d
                    for d in state.devices)

    def widened(policy=None, **view):
        q = dataclasses.replace(p, **{"replicas": (tail,), "generating": True, "gen_next": 2, "stage_next": 2,
                                      "steps": steps, **view})
        s = dataclasses.replace(state, t=10.0, order=(q,), devices=devices, free=frozenset(range(state.gpus)) - {4})
        out = []
        (policy or Jigsaw())._widen_tails(_round(s, q), out)
        (launch,) = [d for d in out if isinstance(d, LaunchReplica)]
        assert launch.absorb == (7,)
        return set(launch.devices)

    assert not widened() & site
    assert widened(Jigsaw(gang_claims=False)) == site
    assert widened(stage_running=True, stage_next=0, running_stage_end_t=1e6) == site
