"""The jigsaw policy: multiplexing, dynamic allocation, long-tail migration, look-ahead.

Pure: ``decide(state)`` reads the state and returns decisions. Every decision it takes is
priced with the state's cost model:

- multiplexing: all pipelines draw devices from one pool; a device freed by one pipeline's
  rollout tail runs another's training or generation (context switches are priced by the
  executor and avoided by preferring devices where the pipeline is resident);
- dynamic allocation: a pipeline's replica count follows its outstanding requests (replicas
  added when requests queue, retired when drained) and each training stage's gang size is
  chosen per stage;
- migration: a replica down to a few requests hands them to a sibling replica with room
  (abort + resume: the destination re-prefills prompt + generated tokens) and is retired,
  when the device-seconds it frees outweigh the re-prefill;
- look-ahead: a stage's gang size is chosen by projecting, over ``horizon_s``, when each
  candidate size could start (from the projected drain times of busy devices) and when it
  would end; ready work is served longest-remaining-critical-path first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw_plugin.scheduler.base import Policy, register_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, RetireReplica, RunStage, StartGen
from jigsaw_plugin.scheduler.estimates import gen_estimate_s, length_stats, rollout_tp, train_estimate_s

__all__ = ["JigsawConfig", "Jigsaw"]

_HOST = ("adv",)
_FWD = ("old_log_prob", "ref", "values")


@dataclass(frozen=True)
class JigsawConfig:
    """Switches for each mechanism (``jigsaw bench --ablate``) and the heuristic's knobs."""

    multiplex: bool = True  # one shared pool (off: each pipeline stays on its static share)
    resize: bool = True  # replica counts and gang sizes change at run time (off: static sizes)
    migration: bool = True  # consolidate rollout tails by abort + resume
    lookahead: bool = True  # gang sizes and service order from projections (off: greedy FIFO)
    horizon_s: float = 300.0  # how far ahead the look-ahead projects
    width: int = 4  # candidate gang sizes per ready stage
    tail_requests: int = 16  # a replica with at most this many requests is in its tail
    min_gain: float = 2.0  # migrate when freed device-seconds >= min_gain x re-prefill cost


@register_policy("jigsaw")
class Jigsaw(Policy):
    name = "jigsaw"
    resident_slots = 1

    def __init__(self, **options):
        self.config = JigsawConfig(**options)
        self.tail_threshold = self.config.tail_requests if self.config.migration else 0
        self._stats: dict[str, dict] = {}  # per-pipeline length figures, derived from the spec

    # ---- contract ---------------------------------------------------------------------
    def staleness_bound(self, pipeline) -> int:
        spec = pipeline.spec
        return spec.staleness if spec.mode == "async" else 0

    def _st(self, p) -> dict:
        if p.name not in self._stats:
            self._stats[p.name] = length_stats(p.spec)
        return self._stats[p.name]

    def _pool(self, state, p) -> tuple:
        return tuple(range(state.gpus)) if self.config.multiplex else p.static_devices

    def _may_start_gen(self, p) -> bool:
        k = p.gen_next
        if k >= p.total_steps or k - p.rollout_version > self.staleness_bound(p):
            return False
        if p.spec.mode == "sync":
            return k == p.train_next and not p.generating
        return True

    # ---- decisions --------------------------------------------------------------------
    def decide(self, state) -> list:
        out: list = []
        free = set(state.free)
        busy_until = {}  # planned load changes this round: replica id -> extra requests
        self._retire_drained(state, out, free)
        if self.config.migration:
            self._consolidate_tails(state, out, free, busy_until)
        for kind, p in self._demands(state, out):
            avail = [d for d in self._pool(state, p) if d in free]
            if kind == "stage":
                devs = self._gang(state, p, avail)
                if devs:
                    stage = p.next_stage
                    out.append(RunStage(p.name, p.train_next, stage, devs, colocated=False))
                    free.difference_update(devs)
            elif kind == "gen":
                devs = self._replica_devices(state, p, avail, self._wanted_replicas(state, p))
                if devs:
                    out += [LaunchReplica(p.name, g) for g in devs]
                    out.append(StartGen(p.name, p.gen_next))
                    free.difference_update(d for g in devs for d in g)
            elif kind == "grow":
                live = [r for r in p.replicas if not r.retiring]
                want = self._wanted_replicas(state, p) - len(live)
                devs = self._replica_devices(state, p, avail, want)
                out += [LaunchReplica(p.name, g, steal_queued=True) for g in devs]
                free.difference_update(d for g in devs for d in g)
        return out

    def _retire_drained(self, state, out, free) -> None:
        for p in state.order:
            for r in p.replicas:
                if r.retiring or r.load:
                    continue
                if not p.generating or (self.config.resize and not p.pending):
                    out.append(RetireReplica(r.id))
                    free.update(r.devices)

    def _demand_exists(self, state) -> bool:
        return any(p.next_stage or self._may_start_gen(p) or p.pending for p in state.order if not p.done)

    def _consolidate_tails(self, state, out, free, extra) -> None:
        if not self._demand_exists(state):
            return  # freeing devices buys nothing now
        cost = state.cost
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring and r.load]
            if len(live) < 2:
                continue
            moved_from = set()
            for src in sorted(live, key=lambda r: r.load):
                if src.id in moved_from or src.queue or src.load > self.config.tail_requests:
                    continue
                reqs = src.running()
                ctx = sum(r.context + r.done + (src.p - r.admit_p) for r in reqs)
                dst = self._destination(live, src, len(reqs), ctx, extra, moved_from)
                if dst is None:
                    continue
                prefill = cost.migration_s(p.model, dst.tp, ctx)
                freed = src.remaining_s() * src.tp
                if freed < self.config.min_gain * prefill * (dst.tp + dst.n):
                    continue
                out.append(RetireReplica(src.id))
                out.append(Migrate(src.id, dst.id))
                extra[dst.id] = extra.get(dst.id, 0) + len(reqs)
                moved_from.update((src.id, dst.id))
                free.update(src.devices)

    @staticmethod
    def _destination(live, src, n, ctx, extra, used):
        best = None
        for r in live:
            if r is src or r.id in used:
                continue
            load = r.n + extra.get(r.id, 0)
            if load + n > r.max_seqs or r.kv_tokens + ctx > 0.9 * r.cap:
                continue
            if best is None or load > best.n + extra.get(best.id, 0):
                best = r
        return best

    def _demands(self, state, out) -> list:
        demands = []
        for p in state.order:
            if p.done:
                continue
            stage = p.next_stage
            if stage in _HOST:
                out.append(RunStage(p.name, p.train_next, stage, ()))
            elif stage:
                demands.append((0 if stage == "weight_sync" else 1, "stage", p))
            if self._may_start_gen(p) and not (stage == "weight_sync"):
                demands.append((1, "gen", p))
            if self.config.resize and p.replicas and any(r.queue for r in p.replicas):
                demands.append((2, "grow", p))
        if self.config.lookahead:
            key = lambda d: (d[0], -self._remaining_s(state, d[2]), d[2].index)
        else:
            key = lambda d: (d[0], d[2].index)
        return [(k, p) for (_, k, p) in sorted(demands, key=key)]

    def _remaining_s(self, state, p) -> float:
        """Projected time to finish the pipeline's current step on its static share."""
        share = len(p.static_devices)
        rest = 0.0
        if p.generating:
            rest = max((r.remaining_s() for r in p.replicas), default=0.0)
        elif self._may_start_gen(p):
            rest = gen_estimate_s(p, state.cost, share, self._st(p))
        return rest + train_estimate_s(p, state.cost, share, self._st(p))

    # ---- placement --------------------------------------------------------------------
    def _affinity(self, state, p, devices, kind) -> list:
        res = state.resident if kind == "rollout" else None
        def key(d):
            if kind == "rollout":
                resident = p.name in res[d]
            else:
                resident = state.train_resident.get(d) == p.name
            return (not resident, d)
        return sorted(devices, key=key)

    def _stage_s(self, state, p, stage, g) -> float:
        s = p.steps[p.train_next]
        if stage in _FWD:
            return state.cost.forward_s(p.model, g, s.tokens)
        return state.cost.train_s(p.model, g, s.tokens)

    def _gang(self, state, p, avail) -> tuple:
        stage = p.next_stage
        share = len(p.static_devices)
        if stage == "weight_sync":
            return tuple(self._affinity(state, p, avail, "train")[:1])
        if not self.config.resize:
            return tuple(self._affinity(state, p, avail, "train")[:share]) if len(avail) >= share else ()
        if not avail:
            return ()
        pool = self._pool(state, p)
        if not self.config.lookahead:
            return tuple(self._affinity(state, p, avail, "train")[: max(share, len(avail))])
        # look-ahead: each candidate size starts when enough devices are projected free
        drains = sorted(self._projected_free_s(state, d) for d in pool if d not in avail)
        sizes = {len(avail), share, min(len(pool), 2 * share), max(1, share // 2)}
        best = None
        for g in sorted(sizes)[-self.config.width:]:
            if g > len(pool):
                continue
            wait = 0.0 if g <= len(avail) else drains[g - len(avail) - 1]
            if wait > self.config.horizon_s:
                continue
            end = wait + self._stage_s(state, p, stage, g)
            if best is None or end < best[0] - 1e-9:
                best = (end, g, wait)
        if best is None or best[2] > 0:
            return ()  # waiting for more devices finishes sooner
        return tuple(self._affinity(state, p, avail, "train")[: best[1]])

    def _projected_free_s(self, state, d) -> float:
        owner = state.task.get(d)
        if owner is None:
            return 0.0
        if owner[0] == "replica":
            rep = state.replicas.get(owner[2])
            return rep.remaining_s() if rep is not None else 0.0
        p = state.pipelines[owner[1]]
        start, end = p.steps[p.train_next].stage_t.get(owner[2], (state.t, state.t))
        return max(0.0, end - state.t)

    def _wanted_replicas(self, state, p) -> int:
        tp = rollout_tp(p, state.cost)
        if not self.config.resize:
            return max(1, len(p.static_devices) // tp)
        cap = state.cost.kv_capacity_tokens(p.model, tp)
        per = max(1, min(state.cost.f.max_num_seqs, cap // max(1, int(self._st(p)["context"]))))
        outstanding = p.load() if p.generating else p.spec.samples_per_step
        return max(1, math.ceil(outstanding / per))

    def _replica_devices(self, state, p, avail, want) -> list:
        tp = rollout_tp(p, state.cost)
        if want <= 0:
            return []
        if not self.config.resize and len(avail) < want * tp:
            return []
        devs = self._affinity(state, p, avail, "rollout")
        groups = [tuple(devs[i:i + tp]) for i in range(0, len(devs) - tp + 1, tp)]
        return groups[:want]
