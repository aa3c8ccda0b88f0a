"""The discrete-event loop: pops events, sets the clock, lets the policy decide.

vidur's shape: the loop only pops events and advances time; each event's ``handle`` does
the mechanics (``World``) and pushes follow-ups; the policy holds all choices; the cost
model is the only place time gets a price. Simultaneous events are ordered by
(time, kind priority, sequence number); every random draw is seeded by the workload
sampler, so the same seed gives the same result.
"""

from __future__ import annotations

import heapq
import time

from jigsaw_plugin.costmodel import CostModel, EfficiencyFactors, hardware_profile, model_profile
from jigsaw_plugin.sim.pipeline_state import PipelineRun
from jigsaw_plugin.sim.result import build_result
from jigsaw_plugin.sim.world import PolicyViolation, World
from jigsaw_plugin import workload as _workload

__all__ = ["Simulation", "simulate", "SimulationStalled"]

_MAX_DECIDE_ROUNDS = 8


class SimulationStalled(RuntimeError):
    """No event is left but pipelines are unfinished: the policy stopped making progress."""


def static_shares(workload) -> list[tuple]:
    """Each pipeline's static device share (spec ``gpus`` or an equal split), as device ids."""
    total = workload.cluster.gpus
    explicit = [p.gpus for p in workload.pipelines]
    rest = [i for i, g in enumerate(explicit) if g is None]
    left = total - sum(g for g in explicit if g is not None)
    shares, start = [], 0
    for i, g in enumerate(explicit):
        if g is None:
            k = rest.index(i)
            g = left // len(rest) + (1 if k < left % len(rest) else 0)
        shares.append(tuple(range(start, start + g)))
        start += g
    return shares


class Simulation:
    """One simulated run of a workload under a policy."""

    def __init__(self, workload, policy, seed: int = 0, factors: EfficiencyFactors | None = None,
                 hooks=None, record_requests: bool = False, pm=None):
        self.workload = workload
        self.policy = policy
        self.seed = seed
        hw = hardware_profile(workload.cluster.gpu)
        self.cost = CostModel(hw, factors)
        shares = static_shares(workload)
        self.pipelines = [
            PipelineRun(i, spec, model_profile(spec.model, f"pipelines[{i}].model"), shares[i])
            for i, spec in enumerate(workload.pipelines)
        ]
        self._heap: list = []
        self._seq = 0
        self.world = World(
            self.pipelines, workload.cluster.gpus, self.cost, seed, lambda *a: _workload.sample_step(*a), self._push,
            policy.staleness_bound, hooks=hooks, record_requests=record_requests,
            resident_slots=getattr(policy, "resident_slots", 1),
            gpus_per_node=workload.cluster.gpus_per_node,
        )
        self.world.route = lambda p, r: policy.route(self.world, p, r)
        self.world.policy_order = lambda p, reqs: policy.order(self.world, p, reqs)
        self.world.tail_threshold = getattr(policy, "tail_threshold", 0)
        self.decision_us: list[float] = []
        self.events = 0
        self._schedule = policy.decide
        if pm is not None:
            # the policy answers jigsaw_schedule as an ordinary plugin; a tryfirst plugin
            # registered on the same manager may override it
            from jigsaw_plugin.builtin import CostModelPlugin, SchedulerPlugin
            from jigsaw_plugin.manager import register

            register(pm, SchedulerPlugin(policy), f"scheduler:{policy.name}")
            register(pm, CostModelPlugin(self.cost, {p.name: p.model for p in self.pipelines}), "costmodel")
            self._schedule = lambda state: pm.hook.jigsaw_schedule(state=state) or []
        for name, devices in policy.initial_residency(self.world).items():
            self.world.make_resident(name, devices)
        self.world.interrupt_on_sync = getattr(policy, "interrupt_on_sync", False)

    def _push(self, ev) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (ev.t, ev.priority, self._seq, ev))

    def _decide(self) -> None:
        w = self.world
        for _ in range(_MAX_DECIDE_ROUNDS):
            w.dirty = False
            t0 = time.perf_counter()
            decisions = self._schedule(w)
            self.decision_us.append((time.perf_counter() - t0) * 1e6)
            if not decisions:
                return
            for d in decisions:
                w.apply(d)
        w.dirty = False

    def run(self) -> dict:
        w, heap = self.world, self._heap
        for p in self.pipelines:
            w._emit("jigsaw_register_pipeline", pipeline=p.name, spec=p.spec.to_dict())
            w._emit("jigsaw_pipeline_start", pipeline=p.name, t=0.0)
        self._decide()
        while heap:
            t, _, _, ev = heapq.heappop(heap)
            w.t = t
            ev.handle(w)
            self.events += 1
            if w.dirty and (not heap or heap[0][0] > t):
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
        return build_result(self)


def simulate(workload, policy, seed: int = 0, **kw) -> dict:
    """Run ``workload`` under ``policy`` (an object or a registered name); the result JSON."""
    if isinstance(policy, str):
        from jigsaw_plugin.scheduler import get_policy

        policy = get_policy(policy)
    return Simulation(workload, policy, seed, **kw).run()
