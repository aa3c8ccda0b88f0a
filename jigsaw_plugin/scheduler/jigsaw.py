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
    min_gain: float = 2.0  # migrate when freed device-seconds >= min_gain x the move's cost
    latency_slack: float = 0.05  # a move may stretch its pipeline's generation by this much


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
        demands = self._demands(state, out)
        n_gen = sum(1 for kind, _ in demands if kind != "stage")
        fair = len(free) // max(1, n_gen)  # work-conserving: rollouts split what is free
        for kind, p in demands:
            avail = [d for d in self._pool(state, p) if d in free]
            if kind == "stage":
                devs = self._gang(state, p, avail)
                if devs:
                    out.append(RunStage(p.name, p.train_next, p.next_stage, devs, colocated=False))
                    free.difference_update(devs)
                continue
            live = [r for r in p.replicas if not r.retiring]
            if kind == "gen":
                tp = rollout_tp(p, state.cost)
                want = self._wanted_replicas(state, p)
                if self._wait_for_rollout_devices(state, p, avail, want * tp):
                    continue
            else:
                want = self._grow_by(state, p, live, fair)
            devs = self._replica_devices(state, p, avail, want)
            if not devs:
                continue
            out += [LaunchReplica(p.name, g, rebalance=(kind == "grow")) for g in devs]
            if kind == "gen":
                out.append(StartGen(p.name, p.gen_next))
            free.difference_update(d for g in devs for d in g)
        return out

    def _wait_for_rollout_devices(self, state, p, avail, want_devices) -> bool:
        """Look-ahead for a generation start: with fewer devices than its static share, wait
        if enough devices are projected to drain soon (a short wait beats a slow start)."""
        share = min(len(p.static_devices), want_devices)
        if not self.config.lookahead or len(avail) >= share:
            return False
        pool = self._pool(state, p)
        drains = sorted(self._projected_free_s(state, d) for d in pool if d not in avail)
        need = share - len(avail)
        if need > len(drains):
            return False
        gen = gen_estimate_s(p, state.cost, share, self._st(p))
        return drains[need - 1] < 0.1 * gen

    def _grow_by(self, state, p, live, fair) -> int:
        """Extra replicas for a generating pipeline: as many as keep each one above its tail."""
        if not live:
            return 1 if p.pending else 0
        if not self.config.resize:
            return 0
        load = sum(r.load for r in live)
        useful = load // (2 * max(1, self.config.tail_requests)) - len(live)
        tp = rollout_tp(p, state.cost)
        return max(0, min(useful, fair // tp))

    def _retire_drained(self, state, out, free) -> None:
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring]
            for r in live:
                if r.load:
                    continue
                # mid-generation keep one replica: trajectories in tool calls come back to it
                keep = p.generating and (not self.config.resize or p.pending or len(live) == 1)
                if not keep:
                    out.append(RetireReplica(r.id))
                    free.update(r.devices)
                    live.remove(r)

    def _demand_exists(self, state) -> bool:
        return any(p.next_stage or self._may_start_gen(p) or p.pending for p in state.order if not p.done)

    def _consolidate_tails(self, state, out, free, extra) -> None:
        """Move a tail replica's requests to a sibling and retire it, when the devices it
        frees are worth more than the re-prefill and the sibling's slowdown, and the
        pipeline's generation is not projected to end later than ``latency_slack`` allows."""
        if not self._demand_exists(state):
            return  # freeing devices buys nothing now
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring and r.load]
            if len(live) < 2:
                continue
            used: set = set()
            ends = {r.id: r.remaining_s() for r in live}
            for src in sorted(live, key=lambda r: r.load):
                if src.id in used or src.queue or src.load > self.config.tail_requests:
                    continue
                move = self._price_move(state, p, src, live, ends, extra, used)
                if move is None:
                    continue
                dst, end = move
                out.append(RetireReplica(src.id))
                out.append(Migrate(src.id, dst.id))
                extra[dst.id] = extra.get(dst.id, 0) + src.load
                ends[dst.id] = end
                ends[src.id] = 0.0
                used.update((src.id, dst.id))
                free.update(src.devices)

    def _price_move(self, state, p, src, live, ends, extra, used):
        cost, cfg = state.cost, self.config
        reqs = src.running()
        k = len(reqs)
        ctx = sum(r.context + r.done + (src.p - r.admit_p) for r in reqs)
        src_left = max((r.finish_p - src.p for r in reqs), default=0.0)
        horizon_end = max(ends.values())
        best = None
        for dst in live:
            if dst is src or dst.id in used:
                continue
            n = dst.n + extra.get(dst.id, 0)
            if n + k > dst.max_seqs or dst.kv_tokens + ctx > 0.9 * dst.cap:
                continue
            old = cost.decode_step_s(p.model, dst.tp, max(1, n), dst.kv_tokens)
            new = cost.decode_step_s(p.model, dst.tp, n + k, dst.kv_tokens + ctx)
            prefill = cost.migration_s(p.model, dst.tp, ctx)
            dst_left = max(0.0, dst.max_finish_p - dst.p)
            end = prefill + max(src_left, dst_left) * new
            others = max((e for i, e in ends.items() if i not in (src.id, dst.id)), default=0.0)
            if max(end, others) > horizon_end * (1 + cfg.latency_slack):
                continue  # would stretch the pipeline's generation: not worth it
            extra_dev_s = (prefill + (new - old) * dst_left) * dst.tp
            if ends[src.id] * src.tp < cfg.min_gain * extra_dev_s:
                continue
            if best is None or end < best[1]:
                best = (dst, end)
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
            if p.generating and (p.pending or (self.config.resize and any(r.queue for r in p.replicas))):
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
        sizes = {len(avail), share, min(len(pool), 2 * share), len(pool)}
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
        # enough replicas to hold every request in KV, and never fewer than the static share
        # (more would only shorten the bulk; the tail, which bounds the step, would not move)
        return max(math.ceil(outstanding / per), len(p.static_devices) // tp, 1)

    def _replica_devices(self, state, p, avail, want) -> list:
        tp = rollout_tp(p, state.cost)
        if want <= 0:
            return []
        if not self.config.resize and len(avail) < want * tp:
            return []
        devs = self._affinity(state, p, avail, "rollout")
        groups = [tuple(devs[i:i + tp]) for i in range(0, len(devs) - tp + 1, tp)]
        return groups[:want]
