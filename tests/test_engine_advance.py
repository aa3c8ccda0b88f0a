"""The simulated engines decode up to the round's time before a decide round
(``World.advance_engines``), timed apart from the decision: the round then finds every
replica already synced, and the run is the one it was when the snapshot did the sync."""

from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.sim.world import World
from sim_helpers import small_workload


def _workload():
    return small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=2, median=400)


def test_every_replica_is_synced_before_the_round_and_the_advance_is_timed_apart():
    sim = Simulation(_workload(), get_policy("jigsaw"), seed=0)
    w = sim.world
    seen = []
    snapshot = w.snapshot

    def checked_snapshot():
        # the round's own work starts here: no replica left for its reports to advance
        seen.append(all(rep.t_sync >= w.t for p in w.order for rep in p.replicas))
        return snapshot()

    w.snapshot = checked_snapshot
    sim.run()
    rounds = len(w.policy_us)
    assert rounds > 0 and all(seen) and len(seen) == rounds
    assert len(w.engine_advance_us) == rounds == len(w.state_build_us)
    assert all(us >= 0 for us in w.engine_advance_us)


def test_the_run_is_the_same_as_with_the_sync_left_to_the_snapshot(monkeypatch):
    first = Simulation(_workload(), get_policy("jigsaw"), seed=1).run()
    # the base class's advance (nothing: each replica syncs when the snapshot asks for its report)
    monkeypatch.setattr(World, "advance_engines", lambda self: None)
    second = Simulation(_workload(), get_policy("jigsaw"), seed=1).run()
    assert first["makespan_s"] == second["makespan_s"]
    assert first["samples_per_s"] == second["samples_per_s"]
    assert first["pipelines"] == second["pipelines"]  # each one's steps, migrations, finish
    assert first["gap_breakdown"] == second["gap_breakdown"]
