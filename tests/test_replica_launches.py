"""``scheduler.replicas_closed_at_launch`` in every result: rollout replicas closed in the
instant they started (launched and retired before decoding a token), which a live run pays
for with an engine woken and weights loaded for nothing."""

from __future__ import annotations

from jigsaw_plugin.scheduler import LaunchReplica, RetireReplica, RunStage, StartGen, get_policy
from jigsaw_plugin.scheduler.base import Policy, register_policy
from jigsaw_plugin.sim import Simulation
from sim_helpers import small_workload


@register_policy("test-launch-one-spare")
class _OneSpare(Policy):
    """Each step: a replica on device 0 takes the step's requests, then one on device 1
    starts with none (launched after the ``StartGen``, no rebalance) and is retired the next
    round, still empty; training on both devices (test policy)."""

    name = "test-launch-one-spare"

    def decide(self, state):
        out = []
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring]
            if p.gen_next == p.train_next < p.total_steps and not p.generating and not live and {0, 1} <= state.free:
                out += [LaunchReplica(p.name, (0,)), StartGen(p.name, p.gen_next), LaunchReplica(p.name, (1,))]
            out += [RetireReplica(r.id) for r in live if r.load == 0]
            if p.next_stage and not p.stage_running and {0, 1} <= state.free - {d for r in live for d in r.devices}:
                out.append(RunStage(p.name, p.train_next, p.next_stage, (0, 1)))
        return out


def test_a_replica_retired_before_it_decodes_is_counted_once_a_step():
    wl = small_workload(gpus=2, pipelines=1, prompts=4, samples=2, steps=2, agentic=(False,))
    res = Simulation(wl, get_policy("test-launch-one-spare"), seed=0).run()
    assert res["scheduler"]["replicas_closed"] == 4
    assert res["scheduler"]["replicas_closed_at_launch"] == 2


def test_a_rollout_the_jigsaw_policy_grows_gets_no_replica_that_starts_empty():
    # one pipeline's step of 2,048 samples on one replica (device 0): 1,024 decode (the
    # engine's batch limit), 1,024 wait; the policy grows the rollout onto its free home
    # (devices 1-3) by the replicas the waiting requests fill: one, not three
    wl = small_workload(gpus=4, pipelines=1, prompts=256, samples=8, steps=1, agentic=(False,))
    sim = Simulation(wl, get_policy("jigsaw", critical_spread=False, idle_spread=False), seed=0)
    w = sim.world
    w.apply(LaunchReplica("p0", (0,)))
    w.apply(StartGen("p0", 0))
    w.t += 2.0
    first = next(iter(w.replicas.values()))
    first.sync(w.t)
    assert first.n == first.max_seqs and len(first.queue) == 2048 - first.max_seqs
    w.decide_and_apply()
    loads = sorted(r.load for r in w.replicas.values())
    assert loads == [1024, 1024], loads
    res = sim.run()
    assert res["pipelines"]["p0"]["samples"] == 2048
    assert res["scheduler"]["replicas_closed_at_launch"] == 0


def test_a_grown_replica_takes_requests_queued_at_a_replica_below_the_average_load():
    # replica A decodes 12, replica B (batch limit 2) runs 2 with 2 queued: B is below the
    # average load, yet its queued requests wait only on its batch limit; a replica launched
    # with ``rebalance`` takes them (before, it took queued requests only from replicas above
    # the average, found none, and was retired empty the next round)
    wl = small_workload(gpus=4, pipelines=1, prompts=8, samples=2, steps=1, agentic=(False,))
    w = Simulation(wl, get_policy("verl-sync"), seed=0).world
    w.apply(LaunchReplica("p0", (0,)))
    w.apply(LaunchReplica("p0", (1,), max_seqs=2))
    w.apply(StartGen("p0", 0))
    a, b = sorted(w.replicas.values(), key=lambda r: r.devices)
    for rep in (a, b):
        rep.sync(w.t)
    while b.load > 4:  # A holds 12, B 4 (2 running, 2 queued)
        r = list(b.queue)[-1]
        b.take(r)
        a.enqueue(r, w.t)
    a.admit(w.t)
    assert (a.n, len(a.queue), b.n, len(b.queue)) == (12, 0, 2, 2)
    w.apply(LaunchReplica("p0", (2,), rebalance=True))
    new = next(r for r in w.replicas.values() if r.devices == (2,))
    assert new.load == 2 and not b.queue and a.load == 12 and b.load == 2
