"""The discrete-event loop: pops events, sets the clock, lets the policy decide.

vidur's shape: the loop only pops events and advances time; each event's ``handle`` does
the mechanics (``World``) and pushes follow-ups; the policy holds all choices; the cost
model is the only place time gets a price. Simultaneous events are ordered by
(time, kind priority, sequence number); every random draw is seeded by the workload
sampler, so the same seed gives the same result.
"""

from __future__ import annotations

import heapq

from jigsaw_plugin.core.pipelines import static_shares  # noqa: F401  (re-exported)
from jigsaw_plugin.sim.world import PolicyViolation, World  # noqa: F401

__all__ = ["Simulation", "simulate", "SimulationStalled"]

_MAX_DECIDE_ROUNDS = 8


class SimulationStalled(RuntimeError):
    """No event is left but pipelines are unfinished: the policy stopped making progress."""


class Simulation:
    """One simulated run of a workload under a policy.

    ``pm``: the plugin manager whose ``jigsaw_schedule``, ``jigsaw_predict_duration`` and
    ``jigsaw_predict_remaining`` hooks the run asks (default: a fresh manager with the
    built-in and installed plugins). ``predictor``: "history" (default) or "oracle" (an
    ablation that reads true lengths; labelled in the result). ``preemption_recovery``:
    what a preempted rollout replica's requests do, "migrate" (keep their tokens) or
    "restart" (the baseline: from their first token); see ``sim.preemption``.
    """

    def __init__(self, workload, policy, seed: int = 0, factors=None, hooks=None, record_requests: bool = False,
                 pm=None, predictor: str = "history", preemption_recovery: str = "migrate"):
        self.workload = workload
        self.policy = policy
        self.seed = seed
        self._heap: list = []
        self._seq = 0
        self.world = World(workload, policy, self._push, seed=seed, factors=factors, hooks=hooks,
                           record_requests=record_requests, pm=pm, predictor=predictor,
                           preemption_recovery=preemption_recovery)
        self.cost = self.world.cost
        self.pipelines = self.world.order
        self.events = 0

    @property
    def decision_us(self) -> list:
        return self.world.decision_us

    def _push(self, ev) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (ev.t, ev.priority, self._seq, ev))

    def _decide(self) -> None:
        self.world.decide_and_apply(_MAX_DECIDE_ROUNDS)

    def run(self) -> dict:
        w, heap = self.world, self._heap
        w.announce_pipelines()
        self._decide()
        period, last = w.decide_period_s, 0.0
        while heap:
            t, _, _, ev = heapq.heappop(heap)
            if ev.background and all(p.done for p in self.pipelines):
                continue  # a preemption after the last step: it changes nothing
            w.t = t
            ev.handle(w)
            self.events += 1
            if period > 0.0 and t - last >= period:
                w.dirty = True  # the policy's periodic round (``Policy.decide_period_s``)
            if w.dirty and (not heap or heap[0][0] > t):
                last = t
                self._decide()
        unfinished = [p.name for p in self.pipelines if not p.done]
        if unfinished:
            detail = "; ".join(
                f"{p.name}: gen_next={p.gen_next} train_next={p.train_next} next_stage={p.next_stage} "
                f"replicas={len(p.replicas)} pending={len(p.pending)}"
                for p in self.pipelines if not p.done
            )
            raise SimulationStalled(f"policy {self.policy.name!r} stalled at t={w.t:.1f}s: {detail}")
        w.close_all()
        return w.result("sim", events=self.events)


def simulate(workload, policy, seed: int = 0, **kw) -> dict:
    """Run ``workload`` under ``policy`` (an object or a registered name); the result JSON."""
    if isinstance(policy, str):
        from jigsaw_plugin.scheduler import get_policy

        policy = get_policy(policy)
    return Simulation(workload, policy, seed, **kw).run()
