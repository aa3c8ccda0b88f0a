"""``PipelineView.requests_changed`` (core/snapshot.py): whether a pipeline's engines'
request counts or its finished trajectories changed since its requests were last read."""

from __future__ import annotations

from jigsaw_plugin.core.snapshot import build_state
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from sim_helpers import small_workload


def test_requests_changed_says_whether_counts_moved_since_the_last_read():
    policy = get_policy("jigsaw")
    sim = Simulation(small_workload(steps=1), policy, 0)
    ex = sim.world
    seen = {"read": 0, "unread": 0, "changed": 0}
    schedule = policy.decide

    def decide(state):
        out = schedule(state)
        # a second build at the same time, before the decisions apply: the pipelines whose
        # requests this round read report no change; the others report what the first did
        again = build_state(ex)
        for p, q in zip(state.order, again.order):
            read = p.name in ex.request_cache and ex.request_cache[p.name][2].counts is not None and \
                ex.request_cache[p.name][2].counts == (tuple((r.id, r.running, r.queued) for r in q.replicas),
                                                       q.history.count)
            if read:
                assert not q.requests_changed
                seen["read"] += 1
            else:
                assert q.requests_changed == p.requests_changed
                seen["unread"] += 1
            seen["changed"] += p.requests_changed
        return out

    policy.decide = decide
    sim.run()
    assert seen["read"] > 0 and seen["unread"] > 0 and seen["changed"] > 0
