"""Cost-aware activation of heterogeneous rollout workers (ECHO-2), for one decide round.

Given the state, a pipeline's predicted rollout demand and its staleness bound, which free
devices should run its rollout? Each candidate class is priced on its own cost model
(``SchedulerState.classes``), not the first class's:

- a class is a candidate only where a replica of the caller's size fits its memory (its
  KV cache is not empty) and, behind a wide-area link, where one version's copy arrives
  before the trainer has moved ``S`` versions on (``pull_s <= S x T_train``): a slower
  copy makes every sample it generates older than the bound allows;
- candidate classes are ranked by throughput per price (decode at the batch a replica
  runs, from the class's cost model, over its price per device-hour) and the fewest
  devices that keep the learner fed within the bound are activated: ``plan.capacity``'s
  provisioning rule (``provision``: the smallest prefix of that order whose overlap model
  ``P = max(T_train, N / R, T_gen / S) + T_dis`` is bound by the trainer, else the pool
  with the least cost per sample; a class behind a slow link left out in turn), fed
  from the state's observations instead of the workload's distributions. Replicas the
  pipeline already runs count towards the pool;
- the trainer's site (the on-demand classes without a link: ``trainer_classes``) is not
  the rule's to choose: its devices are billed for the whole run, idle or not, so those
  among the candidates are always activated, ahead of the chosen ones, and the rule
  provisions the elastic classes (spot, remote) as ``jigsaw plan`` provisions rollout
  workers beside a trainer; training gangs stay on the site (``trainer_site``).

Devices left out stay idle. The simulator bills every provisioned device for the whole
run (``core.result.cost_result``'s ``total``); the ``elastic`` figure beside it bills
spot and remote classes only while they hold work, the accounting under which idle
workers are released (the spec has no per-class "released when idle" field yet).

A single-class pool has nothing to choose: ``activate`` returns the candidates as given.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = ["ClassOffer", "RolloutDemand", "Activation", "rollout_demand", "trainer_classes", "trainer_devices",
           "trainer_site", "holds_updates", "activate", "within_link_bound"]


@dataclass(frozen=True)
class RolloutDemand:
    """What a pipeline's next step asks of its rollout, as predicted from observations."""

    samples: int  # N: samples per step
    stats: Mapping[str, float]  # per-sample means: prompt, response, context (``observed_stats``)
    tail_tokens: float  # the step's predicted longest response


@dataclass(frozen=True)
class ClassOffer:
    """One class's offer to a pipeline's rollout this round."""

    name: str
    index: int
    tp: int  # devices per replica
    active: int  # devices already running the pipeline's replicas
    free: int  # candidate devices in whole replica groups on one node
    tokens_per_s: float  # one replica's decode throughput at a full batch (its cost model)
    price_per_hour: float  # per device (1.0 where the spec gives none)
    pull_s: float  # one version over its link (0: in the trainer's data centre)
    admitted: bool
    reason: str  # why it is not a candidate ("" when admitted)

    @property
    def tokens_per_cost(self) -> float:
        """Decoded tokens per unit of price (inf for a free class)."""
        price = self.price_per_hour * self.tp
        return self.tokens_per_s * 3600.0 / price if price > 0 else math.inf


@dataclass(frozen=True)
class Activation:
    """What to activate for one pipeline's rollout, and why."""

    pipeline: str
    # candidates to activate: the trainer site's (billed whole) first, then the cheapest samples
    devices: tuple[int, ...]
    target: Mapping[str, int]  # class -> rollout devices the rule wants active (existing included)
    offers: tuple[ClassOffer, ...]
    train_s: float  # T_train on the trainer's site
    staleness: int
    fed: bool  # the chosen pool keeps the learner fed within the bound (the rule's verdict)
    provision: object = field(default=None, repr=False)  # plan.capacity.Provision, where the rule ran


_MIN_TAIL_EVIDENCE = 64  # finished turns before the step's longest is read off their quantile


def rollout_demand(p) -> RolloutDemand:
    """A ``PipelineView``'s demand from what it observed (its prior before anything finished).
    The step's longest response: the ``1 - 1/(N+1)`` quantile of recent finished turns (the
    expected longest of N draws) times the mean turns, at most the longest seen."""
    from jigsaw_plugin.scheduler.estimates import observed_stats

    stats = observed_stats(p)
    n = int(p.spec.samples_per_step)
    tail = float(stats["p999"])
    recent = p.history.recent_lengths() if p.history is not None and p.history.count else ()
    if len(recent) >= _MIN_TAIL_EVIDENCE:
        tail = min(tail, float(np.quantile(recent, 1 - 1 / (n + 1))) * max(1.0, stats["turns"]))
    return RolloutDemand(n, stats, tail)


def trainer_classes(state) -> tuple:
    """The trainer's site: the on-demand classes without a link, and the spot classes
    without a link beside them where those alone cannot hold some pipeline's update (a
    gang on spot devices restarts when one is preempted, and the jigsaw policy prices
    that: restarts.py); every class where the pool has no on-demand class. Only the first
    on-demand class was, as ``jigsaw plan`` trains on one class: a pool of 14 on-demand
    24 GB devices, 2 on-demand A100 and 4 spot 24 GB devices trained a 7B on the 24 GB ones
    only and kept the A100s to rollout (odd_workloads --preempt seed 2: 22.3 s, 13.6 s with
    activation off); and a pool whose on-demand class could not hold an update was refused
    (seed 36: an 8B on one on-demand L40S beside 4 spot A100)."""
    return _site(tuple(state.classes), tuple(p.model for p in state.order))


@functools.lru_cache(maxsize=64)
def _site(classes: tuple, models: tuple) -> tuple:
    local = [c for c in classes if c.link is None]
    site = [c for c in local if not c.preemptible]
    if not site:
        return classes
    wider = [c for c in local if c in site or c.preemptible]
    if len(wider) > len(site) and not holds_updates(site, models) and holds_updates(wider, models):
        return tuple(wider)
    return tuple(site)


def holds_updates(classes, models) -> bool:
    """Whether the devices of ``classes`` hold each of ``models``' update: for some class
    among them, its devices and those of the classes with more memory are at least the
    gang that class's memory needs (a gang is priced, and checked, at its smallest devices)."""
    return all(any(sum(len(o.devices) for o in classes if o.memory_gb >= c.memory_gb)
                   >= c.cost.min_gang(m, update=True) for c in classes) for m in models)


def trainer_devices(state, p) -> frozenset:
    """``p``'s static devices on the trainer's site (all of them for a single-class pool)."""
    if len(state.classes) <= 1:
        return frozenset(p.static_devices)
    site = trainer_classes(state)
    mine = frozenset(d for d in p.static_devices if any(d in c.devices for c in site))
    return mine or frozenset(p.static_devices)


def trainer_site(state) -> frozenset:
    """Devices a training gang may use: the trainer site's classes (every device for a
    single-class pool). A gang priced at its slowest class should not reach a spot or
    remote worker."""
    if len(state.classes) <= 1:
        return frozenset(range(state.gpus))
    return frozenset(d for c in trainer_classes(state) for d in c.devices)


def _whole_groups(state, devices: list, tp: int) -> list:
    """``devices`` cut to whole ``tp``-wide groups on one node, node by node (order kept within)."""
    by_node: dict[int, list] = {}
    for d in devices:
        by_node.setdefault(state.devices[d].node, []).append(d)
    out = []
    for node in sorted(by_node):
        ds = by_node[node]
        out += ds[: len(ds) // tp * tp]
    return out


def activate(state, p, candidates, tp: int, demand: RolloutDemand | None = None,
             staleness: int | None = None) -> Activation:
    """Which of ``candidates`` (free device ids) to activate for ``p``'s rollout, in groups
    of ``tp`` (the replica size the caller launches). ``demand``: default ``rollout_demand(p)``;
    ``staleness``: default the spec's bound for an asynchronous pipeline, 0 for a synchronous
    one (then the rule does not apply: every admitted candidate, cheapest first)."""
    from jigsaw_plugin.plan.capacity import CapacityInputs, ClassRate, provision, replica_curve
    from jigsaw_plugin.scheduler.estimates import train_estimate_s

    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise SpecError("tp", tp, "an integer >= 1 (devices per rollout replica)")
    candidates = list(candidates)
    if staleness is None:
        staleness = p.spec.staleness if p.spec.mode == "async" else 0
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise SpecError("staleness", staleness, "an integer >= 0 (versions rollout may run ahead of training)")
    if len(state.classes) <= 1:
        return Activation(p.name, tuple(candidates), {}, (), 0.0, staleness, True)
    demand = demand or rollout_demand(p)
    site = trainer_classes(state)
    home = trainer_devices(state, p)
    # T_train on the site's class that holds most of the pipeline's training devices
    trainer = max(site, key=lambda c: sum(1 for d in home if d in c.devices))
    n_train = max(1, sum(1 for d in home if any(d in c.devices for c in site)))
    # the site's devices are billed whole: those free run rollout with no rule to pass
    billed = tuple(d for d in candidates if any(d in c.devices for c in site))
    train_s = train_estimate_s(p, trainer.cost, n_train, dict(demand.stats))
    bound = max(1, staleness)
    live = [r for r in p.replicas if not r.retiring]
    offers, rates, pick = [], [], {}
    for c in state.classes:
        if c in site:
            continue
        active = sum(1 for r in live for d in r.devices if d in c.devices)
        mine = _whole_groups(state, [d for d in candidates if d in c.devices], tp)
        if not active and not mine:
            continue
        price = c.price_per_hour if c.price_per_hour is not None else 1.0
        reason, tokens_s, pull = "", 0.0, 0.0
        if c.cost.kv_capacity_tokens(p.model, tp) <= 0:
            reason = f"a {tp}-device replica leaves no KV cache in {c.memory_gb:g} GB"
        else:
            curve = replica_curve(p, c.cost, tp, dict(demand.stats), demand.tail_tokens, demand.samples)
            tokens_s = curve[-1][1] * max(1.0, demand.stats["response"])
            if c.link is not None:
                from jigsaw_plugin.sim.devices import wan_dissemination_s

                pull = wan_dissemination_s(c.spec, p.model, max(1, (active + len(mine)) // tp))
                if pull > bound * train_s:
                    reason = (f"one version over its link takes {pull:.0f} s, more than the staleness bound "
                              f"allows ({bound} x T_train = {bound * train_s:.0f} s)")
        offer = ClassOffer(c.name, c.index, tp, active, len(mine), tokens_s, price, pull, not reason, reason)
        offers.append(offer)
        if reason:
            continue
        pick[c.name] = mine
        rates.append(ClassRate(c.name, c.gpu, active + len(mine), tp, price, pull, curve))
    offers.sort(key=lambda o: -o.tokens_per_cost)
    rank = {o.name: i for i, o in enumerate(offers)}
    if not rates:
        # nothing admitted is free; a pipeline with no replica still gets every candidate
        # (it must progress: the site's alone may hold no replica group, odd_workloads
        # --preempt seed 88's tp-2 replica on one on-demand H100 and one spot L40S),
        # cheapest first; otherwise it waits for its admitted classes
        rest = [d for d in candidates if d not in billed]
        chosen = () if live else tuple(sorted(rest, key=lambda d: _rank_of(state, d, rank)))
        return Activation(p.name, billed + chosen, {}, tuple(offers), train_s, staleness, False)
    if staleness <= 0:
        chosen = [d for r in sorted(rates, key=lambda r: rank[r.name]) for d in pick[r.name]]
        return Activation(p.name, billed + tuple(chosen), {r.name: r.available for r in rates}, tuple(offers),
                          train_s, staleness, False)
    inputs = CapacityInputs(p.name, bound, demand.samples, trainer.name, n_train,
                            trainer.price_per_hour if trainer.price_per_hour is not None else 1.0, train_s,
                            trainer.cost.weight_sync_s(p.model, colocated=False, cross_node=True),
                            demand.tail_tokens, tuple(rates))
    prov = provision(inputs)
    by_active = {o.name: o.active for o in offers}
    chosen = []
    for r in sorted(rates, key=lambda r: rank[r.name]):
        more = max(0, prov.rollout.get(r.name, 0) - by_active[r.name])
        chosen += pick[r.name][: more // tp * tp]
    return Activation(p.name, billed + tuple(chosen), dict(prov.rollout), tuple(offers), train_s, staleness,
                      prov.sustains_full_utilisation, prov)


def within_link_bound(state, p, candidates, tp: int, staleness: int | None = None) -> list:
    """``candidates`` less the devices of every class whose link ``activate`` refuses for
    ``p``'s rollout at width ``tp``: one version's pull over it outlasts the staleness bound
    (``max(1, S)`` x T_train), so each weight sync would wait for it. For moves that put
    rollout replicas on free devices outside a launch, which ``activate`` judges (a tail
    re-sharded wider): a class the rule refuses is refused to them too. The rule's other
    verdicts are left to the caller (how many devices to use, whether a class holds the
    replica)."""
    candidates = list(candidates)
    linked = [c for c in state.classes if c.link is not None]
    if not any(d in c.devices for c in linked for d in candidates):
        return candidates  # no candidate behind a link: nothing for the rule to refuse
    act = activate(state, p, candidates, tp, staleness=staleness)
    bound = max(1, act.staleness) * act.train_s
    refused = {o.index for o in act.offers if o.pull_s > bound}
    if not refused:
        return candidates
    out = set().union(*(c.devices for c in state.classes if c.index in refused))
    return [d for d in candidates if d not in out]


def _rank_of(state, d: int, rank: dict) -> tuple:
    c = state.device_class(d)
    return (rank.get(c.name, len(rank)) if c is not None else len(rank), d)
