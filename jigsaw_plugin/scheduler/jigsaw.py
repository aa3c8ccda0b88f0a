"""The jigsaw policy: multiplexing, dynamic allocation, long-tail migration, look-ahead.

Pure: ``decide(state)`` reads the ``SchedulerState`` and returns decisions; every choice
is priced with the state's cost model, and every remaining-work figure is the length
predictor's (``RequestView.predicted_remaining``, ``ReplicaView.predicted_drain_s``): the
policy never sees a response's final length. Each pipeline keeps a *home*: its static share of the pool (for an
async pipeline, split into rollout and training homes as the cost model balances them).
Home devices are never taken from their owner for longer than it can spare them, so no
pipeline runs slower than on its static share by more than a projection error, and every
device its owner is not using is lent:

- multiplexing: a pipeline's ready training stage borrows other pipelines' idle devices
  whose owners are projected not to need them before the stage ends (an owner in a long
  rollout tail, for instance); context switches are priced by the executor and avoided by
  preferring devices where the pipeline's state is resident;
- dynamic allocation: replicas are added when requests queue and retired when drained;
  each training stage's gang size is chosen per stage;
- migration: a replica down to a few requests hands them to a sibling with room (abort +
  resume: the destination re-prefills prompt + generated tokens) and its devices become
  lendable, when the device-seconds freed outweigh the re-prefill and the sibling's
  slowdown and the pipeline's generation is not projected to end later than
  ``latency_slack`` allows;
- look-ahead: a stage's gang size is chosen by projecting, over ``horizon_s``, when each
  candidate could start (from the projected drain of busy devices) and when it would end;
  ready work is served longest-remaining-critical-path first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw_plugin.algorithms import FORWARD_STAGES, HOST_STAGES
from jigsaw_plugin.scheduler.base import Policy, PolicySetup, register_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, RetireReplica, RunStage, StartGen
from jigsaw_plugin.scheduler.estimates import (
    balanced_split,
    gen_estimate_s,
    observed_stats,
    rollout_tp,
    train_estimate_s,
)

__all__ = ["JigsawConfig", "JigsawMemo", "Jigsaw"]

_INF = float("inf")


@dataclass(frozen=True)
class JigsawConfig:
    """Switches for each mechanism (``jigsaw bench --ablate``) and the heuristic's knobs."""

    multiplex: bool = True  # lend idle devices across pipelines (off: each stays on its home)
    resize: bool = True  # replica counts and gang sizes change at run time (off: home sizes)
    migration: bool = True  # consolidate rollout tails by abort + resume
    lookahead: bool = True  # gang sizes, loans and service order from projections (off: greedy)
    horizon_s: float = 600.0  # how far ahead the look-ahead projects
    width: int = 4  # candidate gang sizes per ready stage (start now, or wait for 1..width-1 more devices)
    tail_requests: int = 16  # a replica with at most this many requests is in its tail
    min_gain: float = 2.0  # migrate when freed device-seconds >= min_gain x the move's cost
    latency_slack: float = 0.05  # a move may stretch its pipeline's generation by this much
    loan_margin: float = 1.2  # a loan must end this many times before its owner needs it back
    widen_requests: int = 128  # re-shard a rollout onto a wider replica from this many requests down
    max_widen: int = 8  # widest tensor-parallel replica a tail is re-sharded onto
    split_async: bool = False  # split an async pipeline's home into rollout and training parts


@dataclass(frozen=True)
class JigsawMemo:
    """What the policy derives once, at setup: each pipeline's homes and each device's owner."""

    home: dict  # pipeline -> (rollout home, training home)
    owner: dict  # device -> the pipeline whose static share holds it


@register_policy("jigsaw")
class Jigsaw(Policy):
    name = "jigsaw"
    config_class = JigsawConfig
    resident_slots = 1

    def __init__(self, **options):
        self.config = JigsawConfig(**options)
        self.tail_threshold = self.config.tail_requests if self.config.migration else 0

    # ---- contract ---------------------------------------------------------------------
    def staleness_bound(self, pipeline) -> int:
        spec = pipeline.spec
        return spec.staleness if spec.mode == "async" else 0

    def setup(self, state) -> PolicySetup:
        home, owner = {}, {}
        for p in state.order:
            share = p.static_devices
            if self.config.split_async and p.spec.mode == "async" and len(share) > rollout_tp(p, state.cost):
                r = balanced_split(p, state.cost, len(share))
                home[p.name] = (share[:r], share[r:])
            else:
                home[p.name] = (share, share)
            for d in share:
                owner[d] = p.name
        return PolicySetup(super().setup(state).residency, JigsawMemo(home, owner))

    # ---- decisions --------------------------------------------------------------------
    def decide(self, state) -> list:
        out: list = []
        free = set(state.free)
        self._retire_drained(state, out, free)
        if self.config.migration:
            self._consolidate_tails(state, out, free)
            if self.config.resize:
                self._widen_tails(state, out, free)
        for kind, p in self._demands(state, out):
            if kind == "stage":
                devs = self._gang(state, p, free)
                if devs:
                    out.append(RunStage(p.name, p.train_next, p.next_stage, devs, colocated=False))
                    free.difference_update(devs)
                continue
            live = [r for r in p.replicas if not r.retiring]
            want = self._wanted_replicas(state, p) - len(live)
            if kind == "grow" and not live:
                want = max(want, 1)
            groups = self._replica_devices(state, p, free, want)
            if not groups and not (kind == "gen" and live):
                continue
            out += [LaunchReplica(p.name, g, rebalance=(kind == "grow")) for g in groups]
            if kind == "gen":
                out.append(StartGen(p.name, p.gen_next))
            free.difference_update(d for g in groups for d in g)
        return out

    def _may_start_gen(self, p) -> bool:
        k = p.gen_next
        if k >= p.total_steps or k - p.rollout_version > self.staleness_bound(p):
            return False
        if p.spec.mode == "sync":
            return k == p.train_next and not p.generating
        return True

    def _retire_drained(self, state, out, free) -> None:
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring]
            for r in list(live):
                if r.load:
                    continue
                # mid-generation keep one replica: trajectories in tool calls come back to it
                keep = p.generating and (not self.config.resize or p.pending > 0 or len(live) == 1)
                if not keep:
                    out.append(RetireReplica(r.id))
                    free.update(r.devices)
                    live.remove(r)

    def _demands(self, state, out) -> list:
        demands = []
        for p in state.order:
            if p.done:
                continue
            stage = p.next_stage
            if stage in HOST_STAGES:
                out.append(RunStage(p.name, p.train_next, stage, ()))
            elif stage:
                demands.append((0 if stage == "weight_sync" else 1, "stage", p))
            if self._may_start_gen(p) and stage != "weight_sync":
                # sync: after the weight sync; async: as soon as the staleness bound allows,
                # so the next step's bulk overlaps this step's rollout tail
                demands.append((1, "gen", p))
            elif p.generating and (p.pending > 0 or (self.config.resize and any(r.queued for r in p.replicas))):
                demands.append((2, "grow", p))
        if self.config.lookahead:
            key = lambda d: (d[0], -self._remaining_s(state, d[2]), d[2].index)
        else:
            key = lambda d: (d[0], d[2].index)
        return [(k, p) for (_, k, p) in sorted(demands, key=key)]

    def _remaining_s(self, state, p) -> float:
        """Projected time to finish the pipeline's current step on its home devices."""
        share = len(p.static_devices)
        stats = observed_stats(p)
        rest = 0.0
        if p.generating:
            rest = max((r.predicted_drain_s() for r in p.replicas), default=0.0)
        elif self._may_start_gen(p):
            rest = gen_estimate_s(p, state.cost, share, stats)
        return rest + train_estimate_s(p, state.cost, share, stats)

    # ---- migration --------------------------------------------------------------------
    def _consolidate_tails(self, state, out, free) -> None:
        """Move a tail replica's requests to a sibling and retire it, when that pays."""
        if not self.config.multiplex and not any(p.next_stage for p in state.order):
            return  # freed devices would only be lent, and lending is off
        extra: dict[int, int] = {}
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring and r.load]
            if len(live) < 2:
                continue
            tails = [r for r in live if not r.queued and r.load <= self.config.tail_requests]
            if not tails:
                continue  # no replica in its tail: nothing to consolidate (and no need to predict)
            used: set = set()
            ends = {r.id: r.predicted_drain_s() for r in live}
            for src in sorted(tails, key=lambda r: r.load):
                if src.id in used:
                    continue
                move = self._price_move(state, p, src, live, ends, extra, used)
                if move is None:
                    continue
                dst, end = move
                out.append(RetireReplica(src.id))
                out.append(Migrate(src.id, dst.id))
                extra[dst.id] = extra.get(dst.id, 0) + src.load
                ends[dst.id], ends[src.id] = end, 0.0
                used.update((src.id, dst.id))
                free.update(src.devices)

    def _price_move(self, state, p, src, live, ends, extra, used):
        cost, cfg = state.cost, self.config
        reqs = src.requests
        k = len(reqs)
        ctx = sum(r.kv_tokens for r in reqs)
        src_left = src.predicted_tokens_left
        gen_end = max(ends.values())
        best = None
        for dst in live:
            if dst is src or dst.id in used:
                continue
            n = dst.running + extra.get(dst.id, 0)
            if n + k > dst.max_seqs or dst.kv_tokens + ctx > 0.9 * dst.kv_capacity:
                continue
            old = cost.decode_step_s(p.model, dst.tp, max(1, n), dst.kv_tokens)
            new = cost.decode_step_s(p.model, dst.tp, n + k, dst.kv_tokens + ctx)
            prefill = cost.migration_s(p.model, dst.tp, ctx)
            dst_left = dst.predicted_tokens_left
            end = prefill + max(src_left, dst_left) * new
            others = max((e for i, e in ends.items() if i not in (src.id, dst.id)), default=0.0)
            if max(end, others) > gen_end * (1 + cfg.latency_slack):
                continue  # would stretch the pipeline's generation
            move_dev_s = (prefill + (new - old) * dst_left) * dst.tp
            if ends[src.id] * src.tp < cfg.min_gain * move_dev_s:
                continue
            if best is None or end < best[1]:
                best = (dst, end)
        return best

    def _widen_tails(self, state, out, free) -> None:
        """Re-shard a pipeline's rollout tail onto one wider tensor-parallel replica.

        A tail decodes a few long requests at batch 1-16, where a step is bound by reading
        the weights: splitting them over more devices cuts the per-token time, which is the
        pipeline's critical path. Done when the projected end of generation moves earlier by
        more than ``latency_slack`` after paying the weight load and the re-prefill.
        """
        cost = state.cost
        for p in state.order:
            # replicas retired earlier in this round have their devices back in ``free``
            live = [r for r in p.replicas if not r.retiring and r.devices[0] not in free]
            if not p.generating or not live or p.pending or any(r.queued for r in live):
                continue
            load = sum(r.load for r in live)
            if load == 0 or load > self.config.widen_requests:
                continue
            width = max(r.tp for r in live)
            home_free = [d for d in state.memo.home[p.name][0] if d in free]
            ctx = sum(r.kv_tokens for rep in live for r in rep.requests)
            left = max(rep.predicted_tokens_left for rep in live)
            now_end = max(r.predicted_drain_s() for r in live)
            best = None
            w = 2 * width
            while w <= min(len(home_free), state.gpus_per_node, self.config.max_widen):
                switch = cost.context_switch_s(p.model, w, train_state=False)
                end = (switch + cost.migration_s(p.model, w, ctx)
                       + left * cost.decode_step_s(p.model, w, load, ctx + load * left / 2))
                if end < now_end * (1 - self.config.latency_slack) and (best is None or end < best[0]):
                    best = (end, w)
                w *= 2
            if best is None:
                continue
            devs = tuple(self._affinity(state, p, home_free, "rollout")[: best[1]])
            out.append(LaunchReplica(p.name, devs, absorb=tuple(r.id for r in live)))
            free.difference_update(devs)
            for r in live:
                free.update(r.devices)

    # ---- device projections -----------------------------------------------------------
    def _busy_for_s(self, state, d) -> float:
        """Projected time until device ``d`` is free."""
        task = state.devices[d].task
        if task is None:
            return 0.0
        if task.kind == "replica":
            rep = state.replicas.get(task.replica)
            return rep.predicted_drain_s() if rep is not None else 0.0
        end = state.pipelines[task.pipeline].running_stage_end_t
        return max(0.0, end - state.t) if end is not None else 0.0

    def _needed_in_s(self, state, owner: str) -> float:
        """When the owner of a home device is projected to want it back."""
        o = state.pipelines[owner]
        if o.done:
            return _INF
        if o.next_stage or o.pending or (self._may_start_gen(o) and not o.generating):
            return 0.0
        if o.stage_running:
            end = o.running_stage_end_t
            return max(0.0, end - state.t) if end is not None else 0.0
        if o.generating:
            return max((r.predicted_drain_s() for r in o.replicas), default=0.0)
        return 0.0

    def _lendable(self, state, p, free, duration) -> list:
        """Free devices of other pipelines' homes that their owners can spare for ``duration``."""
        if not self.config.multiplex:
            return []
        mine = set(p.static_devices)
        need = {}
        out = []
        for d in free:
            if d in mine:
                continue
            owner = state.memo.owner.get(d)
            if owner is None:
                out.append(d)
                continue
            if owner not in need:
                need[owner] = self._needed_in_s(state, owner)
            if not self.config.lookahead or need[owner] >= self.config.loan_margin * duration:
                out.append(d)
        return out

    # ---- placement --------------------------------------------------------------------
    def _affinity(self, state, p, devices, kind) -> list:
        home = set(state.memo.home[p.name][0 if kind == "rollout" else 1])

        def key(d):
            dev = state.devices[d]
            resident = p.name in dev.resident if kind == "rollout" else dev.train_resident == p.name
            return (d not in home, not resident, d)

        return sorted(devices, key=key)

    def _stage_s(self, state, p, stage, g) -> float:
        s = p.steps[p.train_next]
        if stage in FORWARD_STAGES:
            return state.cost.forward_s(p.model, g, s.tokens)
        return state.cost.train_s(p.model, g, s.tokens)

    def _gang(self, state, p, free) -> tuple:
        stage = p.next_stage
        home = state.memo.home[p.name][1]
        home_free = [d for d in home if d in free]
        if stage == "weight_sync":
            devs = home_free or self._lendable(state, p, free, 5.0)
            return tuple(self._affinity(state, p, devs, "train")[:1])
        if not self.config.resize:
            return tuple(home) if len(home_free) == len(home) else ()
        loans = self._lendable(state, p, free, self._stage_s(state, p, stage, max(1, len(home))))
        now = home_free + loans
        if not self.config.lookahead:
            return tuple(now)
        # look-ahead: start now with what is free, or wait for the i-th home device to be
        # projected free and start bigger; pick the earliest projected end
        later = sorted(self._busy_for_s(state, d) for d in home if d not in free)
        best = None
        for i in range(0, min(len(later), self.config.width - 1) + 1):  # ``width`` candidate gangs
            wait = later[i - 1] if i else 0.0
            if wait > self.config.horizon_s:
                break
            g = len(now) + i
            if g == 0:
                continue
            end = wait + self._stage_s(state, p, stage, g)
            if best is None or end < best[0] - 1e-9:
                best = (end, i)
        if best is None or best[1] > 0:
            return ()  # waiting for busy home devices finishes sooner
        return tuple(self._affinity(state, p, now, "train"))

    def _wanted_replicas(self, state, p) -> int:
        tp = rollout_tp(p, state.cost)
        home = state.memo.home[p.name][0]
        if not self.config.resize:
            return max(1, len(home) // tp)
        cap = state.cost.kv_capacity_tokens(p.model, tp)
        per = max(1, min(state.max_num_seqs, cap // max(1, int(p.lengths.context_tokens))))
        outstanding = p.load() if p.generating else p.spec.samples_per_step
        # enough replicas to hold every request in KV, and the whole rollout home
        return max(math.ceil(outstanding / per), len(home) // tp, 1)

    def _replica_devices(self, state, p, free, want) -> list:
        if want <= 0:
            return []
        tp = rollout_tp(p, state.cost)
        home = state.memo.home[p.name][0]
        if self.config.resize:  # idle training-home devices may serve the rollout too
            home = self._affinity(state, p, p.static_devices, "rollout")
        avail = [d for d in home if d in free]
        if not self.config.resize and len(avail) < want * tp:
            return []
        groups = [tuple(avail[i:i + tp]) for i in range(0, len(avail) - tp + 1, tp)]
        return groups[:want]
