"""The jigsaw policy keeps each pipeline's step estimates on a share across rounds
(``Jigsaw._on_share_s``): what it keeps must be what a fresh estimate gives, every round,
also after trajectories finish and the observed lengths change."""

from __future__ import annotations

from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.scheduler.estimates import gen_estimate_s, observed_stats, train_estimate_s
from jigsaw_plugin.sim import Simulation
from sim_helpers import small_workload


def test_kept_share_estimates_equal_fresh_ones_every_round():
    policy = get_policy("jigsaw")
    sim = Simulation(small_workload(steps=2), policy, 0)
    seen_lengths: dict = {}
    checked = [0]
    schedule = policy.decide

    def decide(state):
        for p in state.order:
            share = max(1, len(p.static_devices))
            stats = observed_stats(p)
            fresh = (gen_estimate_s(p, state.cost, share, stats), train_estimate_s(p, state.cost, share, stats))
            assert policy._on_share_s(state, p, share) == fresh
            seen_lengths.setdefault(p.name, set()).add(p.lengths)
            checked[0] += 1
        return schedule(state)

    policy.decide = decide
    sim.run()
    assert checked[0] > 50
    # the lengths observed changed during the run: a key without them would have gone stale
    assert all(len(v) > 2 for v in seen_lengths.values())
