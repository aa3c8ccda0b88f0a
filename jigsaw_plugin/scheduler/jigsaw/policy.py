"""The jigsaw policy: multiplexing, dynamic allocation, long-tail migration, look-ahead.

Pure: ``decide(state)`` reads the ``SchedulerState`` and returns decisions; every choice
is priced with the state's cost model, and every remaining-work figure is the length
predictor's (``RequestView.predicted_remaining``, ``ReplicaView.predicted_drain_s``): the
policy never sees a response's final length. Each pipeline keeps a *home*: its static
share of the pool. Its owner gets a home device back whenever it needs it (at once when
the device is free, at the borrower's next micro-batch boundary when a training stage
holds it, by migrating a borrowed rollout replica's requests to a sibling), so no pipeline
runs much slower than on its static share; every device its owner is not using is lent:

- service order: ready work is served longest-remaining-step first, the stage of the
  pipeline on the critical path at its observed pace before the others'
  (``critical_claim``, which also lends no other gang devices beyond its home while that
  pipeline computes its advantages with a training stage next); with ``priority`` on,
  in order of each pipeline's predicted completion of its whole run (on its static share,
  from what it has observed), furthest first, which also grants tail moves more slack on
  pipelines with headroom and widens only critical tails (measured slower on (a): off by
  default, an ablation in docs/benchmarks.md);
- cross-pipeline rollout: a generating pipeline's replica count follows its demand (enough
  replicas to decode at a batch where a token costs near its ideal), placed on its home
  first and then on any free device whose owner can spare it for the predicted rollout;
- micro-batch loans: a running training stage grows onto free devices at its next
  micro-batch boundary (``ResizeStage``), so a loan need not fit a whole stage; a new
  stage starts on its home plus devices lendable for one micro-batch (``loans``, off by
  default); ``critical_loans`` (on) grows only the critical pipeline's running stage,
  and (``keep_critical_loans``) an owner that could not use its lent devices leaves them
  with the critical pipeline; any running stage grows onto its own home's devices that
  nothing else took (``grow_at_home``; for a pipeline running alone, ``grow_in_plan``:
  the look-ahead prices starting now with that growth); an agent off the critical path whose
  trajectories are in tool calls lends its home for their projected calls and next turns
  (``tool_wait``);
- tails priced in device-seconds: a replica decoding at a small batch (a few long
  requests, where a token costs many times its ideal) hands them to a sibling with room
  (abort + resume) when the device-seconds freed outweigh the re-prefill and the
  sibling's slowdown, and its pipeline's projected completion allows the stretch;
  a tail is re-sharded onto a wider replica, on any node with free devices, when that ends
  its generation sooner (with ``priority`` on, only when its pipeline is on the job set's
  critical path);
- early forward passes: a step's log-prob / reference / values passes read its finished
  trajectories on devices its tail no longer needs, the critical pipeline's on its home
  and lent devices; with ``early_merges`` (on) another's on its own home's
  devices nothing else took, and a tail merge of a synchronous step with such a pass to
  run may stretch its generation by what that pass would take off the chain after the
  tail (at most ``merge_for_early`` of the tail more), since the devices it frees read them;
- a step's rollout waits a moment for its home devices rather than start on a few
  replicas that would admit its whole batch (``wait_for_home``);
- makespan-aware shares (``balance``, off by default): each round the homes are
  re-apportioned so the unfinished pipelines are projected to finish together (work that
  spreads over devices plus each step's longest response, which does not), so freed
  devices go to the pipeline whose completion is furthest out;
- rollout widths (``bulk_width``): replicas decode at the width whose token costs least
  at the batch the KV cache holds for the observed context (wider for long contexts);
- asynchronous pipelines (``async_reserve``): while a generated step waits to be trained,
  the next step's rollout (which the staleness bound lets start) and the training gang
  split the home, balanced from the observed lengths; the gang's part stays free for it,
  and an empty replica kept for trajectories in tool calls yields it to a batch ready to
  train;
- heterogeneous pools (``cost_aware``): rollout replicas on the cheapest devices per
  token that keep the learner fed within the staleness bound, training on the trainer's
  site (scheduler/activation.py);
- look-ahead: a ready stage weighs ``width`` candidate plans (start now and grow at
  micro-batch boundaries as home devices free, or wait for the i-th) by projected end;
  one whose start now would move the job set's projected finish also weighs waiting for
  devices that finished pipelines' homes free soon (``wait_for_freed``);
- stages side by side (``concurrent_stages``): the log-prob pass beside the reference
  pass, a PPO step's critic update beside the actor's, each on a gang of its own, where
  splitting the devices ends the pair ``alongside_gain`` sooner than running it in turn;
- admission limits (``admission``, on since stop 52): a rollout replica admits waiting
  requests only while the expected KV peak of what it runs stays within its cache, so
  that sequences that outgrow it are not preempted and recomputed (scheduler/admission.py).
"""

from __future__ import annotations

import math

from jigsaw_plugin.algorithms import HOST_STAGES
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler.activation import holds_updates, trainer_classes, trainer_site
from jigsaw_plugin.scheduler.admission import FittingMemo
from jigsaw_plugin.scheduler.base import Policy, PolicySetup, register_policy
from jigsaw_plugin.scheduler.colocation import colocate_tails
from jigsaw_plugin.scheduler.decisions import (
    AdmissionLimit,
    LaunchReplica,
    ResizeStage,
    RetireReplica,
    RunStage,
    StartGen,
)
from jigsaw_plugin.scheduler.estimates import balanced_split, rollout_tp
from jigsaw_plugin.scheduler.jigsaw.config import JigsawConfig
from jigsaw_plugin.scheduler.jigsaw.gangs import TrainingGangs
from jigsaw_plugin.scheduler.jigsaw.loans import Loans
from jigsaw_plugin.scheduler.jigsaw.projections import Projections
from jigsaw_plugin.scheduler.jigsaw.restarts import RestartPricing
from jigsaw_plugin.scheduler.jigsaw.rollout import RolloutReplicas
from jigsaw_plugin.scheduler.jigsaw.round import JigsawMemo, Round, apportion, assign_devices, finish_together
from jigsaw_plugin.scheduler.jigsaw.tails import TailMoves

__all__ = ["Jigsaw"]


@register_policy("jigsaw")
class Jigsaw(Projections, Loans, TailMoves, TrainingGangs, RestartPricing, RolloutReplicas, Policy):
    """The jigsaw policy; each mechanism's methods are in the mixin of its module."""

    name = "jigsaw"
    config_class = JigsawConfig
    resident_slots = 1

    def __init__(self, **options):
        self.config = JigsawConfig(**options)
        self.tail_threshold = self.config.tail_requests if self.config.migration else 0
        self.decides_on_preemption = self.config.admission  # a preemption says a batch limit is too high
        self.decide_period_s = self.config.decide_period_s
        # a pass's time on 1, 2, ... devices, by what prices it (cost model, model, stage,
        # tokens): a ready stage's widths are read every round it waits
        self._widths_s: dict[tuple, list] = {}
        # a step's (generation, training) seconds on a share, by what prices them (the cost
        # model, the pipeline, the share, its length summary): every round projects
        # every pipeline's finish from them, and they change only when a trajectory ends
        self._share_s: dict[tuple, tuple] = {}
        # each replica's last admission limit, kept while its arrays are the same
        self._fitting = FittingMemo()

    def staleness_bound(self, pipeline) -> int:
        spec = pipeline.spec
        return spec.staleness if spec.mode == "async" else 0

    def setup(self, state) -> PolicySetup:
        if self._cost_aware(state):  # training stays on the trainer's site: it must hold every pipeline's state
            site_classes = trainer_classes(state)
            for p in state.order:
                if not holds_updates(site_classes, (p.model,)):
                    site = sorted(trainer_site(state))
                    cost = state.cost_of(site)
                    need = cost.min_gang(p.model, update=True)
                    raise SpecError("cluster.classes", f"a trainer site of {len(site)} devices ({cost.hw.name} "
                                    f"the smallest)",
                                    f"a trainer site (the on-demand classes without a link, where cost-aware "
                                    f"jigsaw trains) with enough devices of a class, with those of more memory, "
                                    f"to hold {p.name}'s update ({need} of {cost.hw.name}: "
                                    f"{cost.min_gang_reason(p.model)}); or cost_aware=False")
        elif len(state.classes) > 1:  # gangs sized from the first class's profile: the pool must hold one
            for p in state.order:
                need = state.cost.min_gang(p.model, update=True)
                if need > state.gpus:
                    raise SpecError("cluster.classes", f"{state.cost.hw.name} first",
                                    f"with cost_aware=False, a first class whose profile (what the policy sizes "
                                    f"gangs with) holds {p.name}'s update on at most the pool's {state.gpus} "
                                    f"devices (it needs {need}): list a class with more memory first, or "
                                    f"cost_aware=True")
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

    def decide(self, state) -> list:
        cfg = self.config
        home, owner = self._homes(state)
        rnd = Round(state, home, owner)
        out: list = []
        admit = cfg.admission and state.admission_limits  # admission limits, where the executor sets them
        self._retire_drained(rnd, out)
        if cfg.multiplex and (cfg.loans or cfg.critical_loans) and cfg.resize:
            self._reclaim(rnd, out)
        if cfg.migration:
            self._consolidate_tails(rnd, out)
            if cfg.colocate:
                colocate_tails(rnd, out, cfg)
            if cfg.resize:
                self._widen_tails(rnd, out)
        for kind, p in self._demands(rnd, out):
            if kind == "stage":
                if self._run_alongside(rnd, p, out):
                    continue
                devs = self._gang(rnd, p)
                if devs and p.next_stage != "weight_sync":
                    # a gang narrowed onto too few of a small class: every device the look-ahead
                    # would start it with, less the classes that cannot hold it
                    devs = (self._holding(state, p, p.next_stage, devs)
                            or self._holding(state, p, p.next_stage, self._gang(rnd, p, unnarrowed=True)))
                if devs:
                    out.append(RunStage(p.name, p.train_next, p.next_stage, devs, colocated=False))
                    rnd.free.difference_update(devs)
                continue
            if kind == "resume":
                devs = self._resume_devices(rnd, p)
                if devs:
                    rnd.resize(out, p, devs)
                    rnd.free.difference_update(devs)
                continue
            live = [r for r in p.replicas if not r.retiring]
            want = self._wanted_replicas(rnd, p) - len(live)
            if kind == "grow":
                fills = self._grow_fills(rnd, p)
                if not live:
                    want = max(1, fills)
                elif not cfg.grow_on_queue:
                    want = min(want, fills)  # no more replicas than the mean finished context asks
                else:
                    want = fills
            groups = self._replica_devices(rnd, p, want)
            if not groups and not (kind == "gen" and live):
                continue
            if kind == "gen" and not live and self._home_returning(rnd, p, len(groups), want):
                continue  # its home is back in a moment: start then, on all of it
            limit = self._launch_limits_of(rnd, p, groups) if admit else {}
            out += [LaunchReplica(p.name, g, rebalance=(kind == "grow"), max_seqs=limit.get(tuple(g))) for g in groups]
            if kind == "gen":
                if admit:
                    self._limit_before_start(rnd, p, live, out)
                if cfg.width_trials:
                    self._bulk_tp(rnd, p)  # (computed once a round) where the trials choose, it records their plan
                out.append(StartGen(p.name, p.gen_next, *rnd.width_plan.get(p.name, (None, False))))
            rnd.free.difference_update(d for g in groups for d in g)
        if cfg.critical_spread:
            self._spread_critical(rnd, out)
        if cfg.early_passes and state.early_passes and cfg.resize:
            if cfg.early_rest:
                self._early_rest(rnd, out)
            self._early_passes(rnd, out)
        if cfg.resize and (cfg.grow_at_home or (cfg.multiplex and (cfg.loans or cfg.critical_loans))):
            self._grow_stages(rnd, out)
        if cfg.migration and cfg.move_preempted:
            self._move_preempted(rnd, out)
        if admit:
            self._limit_admission(rnd, out)
        if rnd.held_empty:
            out = self._retire_taken(rnd, out)
        return rnd.drop_undone_resizes(out) if rnd.resized else out

    def _homes(self, state) -> tuple[dict, dict]:
        """This round's homes: the static shares, or (``balance``) the pool apportioned so
        that the unfinished pipelines are projected to finish together."""
        memo = state.memo
        cfg = self.config
        if not (cfg.balance and cfg.multiplex and cfg.lookahead) or cfg.split_async:
            return memo.home, memo.owner
        left = {p.name: self._work_left(state, p) for p in state.order}
        floor = {p.name: 0 if p.done else max(rollout_tp(p, state.cost), math.ceil(cfg.min_share * len(p.static_devices)))
                 for p in state.order}
        counts = apportion(finish_together(left, state.gpus), floor, state.gpus)
        shares = assign_devices({p.name: p.static_devices for p in state.order}, counts,
                                [d.node for d in state.devices])
        home = {name: (devs, devs) for name, devs in shares.items()}
        owner = {d: name for name, devs in shares.items() for d in devs}
        return home, owner

    def _may_start_gen(self, p) -> bool:
        k = p.gen_next
        if k >= p.total_steps or k - p.rollout_version > self.staleness_bound(p):
            return False
        if p.spec.mode == "sync":
            return k == p.train_next and not p.generating
        return True

    def _retire_drained(self, rnd, out) -> None:
        for p in rnd.state.order:
            live = [r for r in p.replicas if not r.retiring]
            for r in list(live):
                if r.load:
                    continue
                # mid-generation keep one replica: trajectories in tool calls come back to it
                keep = p.generating and (not self.config.resize or p.pending > 0 or len(live) == 1)
                if keep and len(live) == 1 and self._yields_to_batch(rnd, p):
                    keep = False
                if not keep:
                    if self._keeps_for_turns(rnd, p, r):
                        rnd.held_empty[r.id] = r.devices  # retired only if the round takes a device of it
                    else:
                        out.append(RetireReplica(r.id))
                    rnd.gone.add(r.id)
                    rnd.free.update(r.devices)
                    live.remove(r)

    def _keeps_for_turns(self, rnd, p, r) -> bool:
        """``keep_between_turns``: ``r``, empty, on ``p``'s own rollout home, while
        trajectories of ``p`` are in tool calls (their next turns come back to the replica
        that served them) and ``p`` is on the job set's critical path (``_paced_critical``).
        Off it, the turns that return are better packed onto the replicas left (larger
        batches, fewer device-seconds a token) and its devices freed for the pipelines
        whose chains set the makespan: kept, they fill again and hold a gang back (a 72B
        PPO's critic and actor updates ran one after the other, not side by side, beside an
        agent's replicas kept so: synthetic mix s427 +19%). A borrowed replica goes back
        when empty, as before."""
        if not (self.config.keep_between_turns and p.generating and self._between_turns(p)):
            return False
        home = rnd.home[p.name][0]
        return all(d in home for d in r.devices) and self._paced_critical(rnd, p)

    @staticmethod
    def _retire_taken(rnd, out: list) -> list:
        """``keep_between_turns``: the held empty replicas a decision of the round took a
        device of (or that the round counted as taken) are retired, first, so that their
        devices are free before those decisions apply; the rest stay for the next turns of
        the trajectories in tool calls."""
        used = {x for d in out if isinstance(d, (LaunchReplica, RunStage, ResizeStage)) for x in d.devices}
        retire = [RetireReplica(rid) for rid, devs in rnd.held_empty.items()
                  if used.intersection(devs) or not rnd.free.issuperset(devs)]
        if not retire:
            return out
        # an empty replica closes as it is retired: no batch limit for it
        ended = {d.replica for d in retire}
        return retire + [d for d in out if not (isinstance(d, AdmissionLimit) and d.replica in ended)]

    def _yields_to_batch(self, rnd, p) -> bool:
        """``async_reserve``: ``p``'s last replica, empty (its trajectories are in tool
        calls), holds more of the home than the rollout's cap while a batch of ``p`` is
        ready to train and the free devices hold no gang for it: it goes, and the
        trajectories' next turns start on a replica within the cap (re-prefilling their
        context). Kept, it would hold the batch back until the rollout's last trajectory
        ends, which overlaps nothing: an agent whose turns wait on tools leaves it empty."""
        stage = p.next_stage
        if stage is None:
            return False
        cap = self._rollout_cap(rnd, p)
        return (cap is not None and self._rollout_held(rnd, p) > cap
                and len(rnd.free) < rnd.state.cost.stage_min_gang(p.model, stage))

    def _demands(self, rnd, out) -> list:
        demands = []
        for p in rnd.state.order:
            if p.done:
                continue
            if self._paused(rnd, p):
                demands.append((1, "resume", p))  # paused by a reclaim: it needs devices again
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
        if self.config.lookahead and self.config.priority:
            key = lambda d: (d[0], -self._completion_s(rnd, d[2]), d[2].index)
        elif self.config.lookahead and self.config.critical_claim:
            # the critical pipeline's ready stage forms its gang first: a gang formed before
            # it could take the devices it would borrow for the whole of a long pass
            key = lambda d: (d[0], not (d[1] == "stage" and self._paced_critical(rnd, d[2])),
                             -self._remaining_s(rnd.state, d[2]), d[2].index)
        elif self.config.lookahead:
            key = lambda d: (d[0], -self._remaining_s(rnd.state, d[2]), d[2].index)
        else:
            key = lambda d: (d[0], d[2].index)
        return [(k, p) for (_, k, p) in sorted(demands, key=key)]
