"""ECHO-2's overlap-based capacity model and provisioning rule, on the project's cost model.

For one asynchronous pipeline with staleness bound S, N samples per step, a trainer gang
and candidate rollout device classes, every input comes from the cost model:

- ``T_train``: the training-side stages of one step on the trainer gang;
- ``T_dis``: dissemination latency of one version: the weight sync in the trainer's data
  centre, or the copy over the slowest wide-area link of the classes in use;
- per class c: one replica's rollout throughput at the batch it runs (``R`` is the pool's
  sum; a step's samples spread evenly over its replicas) and its decode step time, which
  prices the step's longest response (the expected longest of N draws).

A step's generation takes ``T_gen = max(bulk, tail) + 0.3 min(bulk, tail)`` with
``bulk = N / R`` (the project's estimate of a step's generation, ``scheduler.estimates``).
Generation runs up to S versions ahead of training, so in steady state one step takes

    P = max(T_train, N / R, T_gen / S) + T_dis

and the learner is busy ``T_train / P`` of the time (full utilisation: the max is
``T_train``). Cost per step is ``P`` times the hourly price of every provisioned device
(trainer included) / 3600. The rule activates replicas class by class in order of
throughput per price (cost-aware activation: the cheapest samples first) and picks the
smallest prefix of that order that sustains full learner utilisation; where none does (a
step's longest response outlasts S x T_train, or the pool is too small), the prefix with
the least cost per sample, and says so. A class whose copy of a version takes longer than
the trainer's own sync (behind a wide-area link) is also left out of the order in turn,
and the answer with the least cost per sample is kept (``provision``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = ["ClassRate", "CapacityInputs", "Provision", "plan_pipeline", "evaluate", "rollout_rate", "provision",
           "least_cost", "activation_order", "replica_curve"]

_TAIL_DRAWS = 8  # steps drawn to estimate the expected longest response of one step


@dataclass(frozen=True)
class ClassRate:
    """One candidate rollout class, priced by the cost model. ``curve``: (q, samples/s of one
    replica, tail s) at rising q, the samples of a step each replica gets: it runs a batch of
    min(q, what it admits), and the step's longest response takes ``tail s`` on it."""

    name: str
    gpu: str
    available: int  # devices of the class the rollout may use
    tp: int  # devices per replica
    price_per_hour: float
    pull_s: float  # a version's copy over the class's link (0: in the trainer's data centre)
    curve: tuple[tuple[float, float, float], ...]

    @property
    def samples_per_s_per_device(self) -> float:
        """With enough work queued (the last point of the curve: a full batch)."""
        return self.curve[-1][1] / self.tp

    @property
    def samples_per_cost(self) -> float:
        """Samples per unit of price (inf for a free class)."""
        rate = self.samples_per_s_per_device * 3600
        return rate / self.price_per_hour if self.price_per_hour > 0 else math.inf

    def at(self, batch: float) -> tuple[float, float]:
        """(samples/s, tail s) of one replica given ``batch`` = q samples (interpolated)."""
        pts = self.curve
        if batch <= pts[0][0]:
            return pts[0][1], pts[0][2]
        for lo, hi in zip(pts, pts[1:]):
            if batch <= hi[0]:
                f = (batch - lo[0]) / (hi[0] - lo[0])
                return lo[1] + f * (hi[1] - lo[1]), lo[2] + f * (hi[2] - lo[2])
        return pts[-1][1], pts[-1][2]


@dataclass(frozen=True)
class CapacityInputs:
    """The rule's inputs (all from the cost model)."""

    pipeline: str
    staleness: int
    samples_per_step: int
    trainer_class: str
    trainer_gpus: int
    trainer_price_per_hour: float
    train_s: float  # T_train
    dissemination_s: float  # T_dis to replicas in the trainer's data centre
    tail_tokens: float  # expected longest response of one step
    classes: tuple[ClassRate, ...]


@dataclass(frozen=True)
class Provision:
    """A rollout pool (class name -> devices) and what the capacity model predicts for it."""

    inputs: CapacityInputs
    rollout: dict
    rollout_samples_per_s: float  # R
    gen_s: float  # T_gen
    dissemination_s: float
    step_s: float  # P
    learner_utilisation: float
    cost_per_step: float
    limit: str  # what bounds P: "trainer", "rollout" (N / R) or "tail" (T_gen / S)

    @property
    def rollout_devices(self) -> int:
        return sum(self.rollout.values())

    @property
    def sustains_full_utilisation(self) -> bool:
        return self.limit == "trainer"

    @property
    def cost_per_sample(self) -> float:
        return self.cost_per_step / self.inputs.samples_per_step

    def as_dict(self) -> dict:
        i = self.inputs
        return {
            "pipeline": i.pipeline, "staleness": i.staleness, "samples_per_step": i.samples_per_step,
            "trainer": {"class": i.trainer_class, "gpus": i.trainer_gpus, "price_per_hour": i.trainer_price_per_hour},
            "inputs": {"train_s": i.train_s, "dissemination_s": i.dissemination_s, "tail_tokens": i.tail_tokens,
                       "classes": [{"name": c.name, "gpu": c.gpu, "available": c.available, "tp": c.tp,
                                    "samples_per_s_per_device": c.samples_per_s_per_device,
                                    "price_per_hour": c.price_per_hour, "pull_s": c.pull_s}
                                   for c in i.classes]},
            "rollout": dict(self.rollout), "rollout_devices": self.rollout_devices,
            "rollout_samples_per_s": self.rollout_samples_per_s, "gen_s": self.gen_s,
            "dissemination_s": self.dissemination_s, "step_s": self.step_s,
            "learner_utilisation": self.learner_utilisation, "cost_per_step": self.cost_per_step,
            "cost_per_sample": self.cost_per_sample,
            "sustains_full_utilisation": self.sustains_full_utilisation, "limit": self.limit,
        }


# --------------------------------------------------------------------------- the model


def rollout_rate(inputs: CapacityInputs, rollout: dict) -> tuple[float, float]:
    """(R in samples/s, the longest response's time on the slowest replica) of a pool: a step's samples
    spread evenly over its replicas, so fewer replicas run bigger batches."""
    by = {c.name: c for c in inputs.classes}
    replicas = sum(v // by[k].tp for k, v in rollout.items())
    if replicas == 0:
        return 0.0, math.inf
    batch = inputs.samples_per_step / replicas
    rate, step = 0.0, 0.0
    for k, v in rollout.items():
        if v // by[k].tp:
            r, s = by[k].at(batch)
            rate += r * (v // by[k].tp)
            step = max(step, s)
    return rate, step


def evaluate(inputs: CapacityInputs, rollout: dict) -> Provision:
    """What the capacity model predicts for a rollout pool (class name -> devices)."""
    by = {c.name: c for c in inputs.classes}
    pool = {k: v for k, v in rollout.items() if v > 0}
    rate, tail = rollout_rate(inputs, pool)
    n, s = inputs.samples_per_step, max(1, inputs.staleness)
    bulk = n / rate if rate > 0 else math.inf
    gen = max(bulk, tail) + 0.3 * min(bulk, tail)
    dis = max([inputs.dissemination_s] + [by[k].pull_s for k in pool])
    terms = {"trainer": inputs.train_s, "rollout": bulk, "tail": gen / s}
    limit = max(terms, key=lambda k: (terms[k], k == "trainer"))
    step = terms[limit] + dis
    price = inputs.trainer_gpus * inputs.trainer_price_per_hour + sum(by[k].price_per_hour * v for k, v in pool.items())
    finite = math.isfinite(step)
    return Provision(inputs, pool, rate, gen, dis, step, inputs.train_s / step if finite else 0.0,
                     step * price / 3600.0 if finite else math.inf, limit)


def activation_order(inputs: CapacityInputs) -> list[dict]:
    """The pools the rule considers: replicas added one at a time, classes in order of
    throughput per price (the cheapest samples first)."""
    chosen = {c.name: 0 for c in inputs.classes}
    out = []
    for c in sorted(inputs.classes, key=lambda c: -c.samples_per_cost):
        while chosen[c.name] + c.tp <= c.available:
            chosen[c.name] += c.tp
            out.append(dict(chosen))
    return out


def provision(inputs: CapacityInputs) -> Provision:
    """The rule: along the activation order, the smallest pool that sustains full learner
    utilisation at the staleness bound; when none does (the tail or the pool's size bounds
    the step), the pool with the least cost per sample.

    A class whose copy of a version arrives later than the trainer's own sync (one behind
    a wide-area link) adds that wait to every step of every pool it is in, and the order
    puts the cheapest class first: a remote class that is the cheapest would be in every
    pool the order holds (RTX 4090s behind a 1 Gbit/s link, priced as the heterogeneous
    benchmark prices them, each copy of a 7B 122 s: every pool's step T_train + 122 s,
    where the local classes alone need no such wait). So the rule also runs on
    the order with each set of such classes left out, and of the answers takes the one
    with the least cost per sample: the learner waits on such a copy whichever term bounds
    the step. With no such class there is one order, and its answer."""
    slow = [c.name for c in inputs.classes if c.pull_s > inputs.dissemination_s]
    answers = []
    for k in range(len(slow) + 1):
        for out in combinations(slow, k):
            kept = tuple(c for c in inputs.classes if c.name not in out)
            pools = [evaluate(inputs, pool) for pool in activation_order(replace(inputs, classes=kept))]
            if pools:  # none where every class is left out
                answers.append(next((x for x in pools if x.sustains_full_utilisation), None) or least_cost(pools))
    return least_cost(answers)


def least_cost(pools: list) -> Provision:
    """The pool with the least cost per sample (the smaller one on a tie within 0.1%)."""
    best = None
    for prov in pools:
        if best is None or prov.cost_per_sample < best.cost_per_sample * 0.999:
            best = prov
    return best


# --------------------------------------------------------------------------- from a workload


def _price(c) -> float:
    return c.price_per_hour if c.price_per_hour is not None else 1.0


def replica_curve(p, cost, tp: int, st: dict, tail_tokens: float, samples: int) -> tuple:
    """One replica's (q, samples/s, tail s) for q samples of a step on it. Throughput: decode
    steps for the mean response plus the prefill of the batch's prompts, at a batch of
    min(q, what fits). The longest response decodes beside the rest of the replica's work:
    on average ``q x mean response / longest`` sequences, holding long contexts."""
    model = p.model
    cap = cost.kv_capacity_tokens(model, tp)
    top = max(1.0, min(float(cost.f.max_num_seqs), cap / max(1.0, st["context"])))
    out = []
    for q in sorted({min(float(samples), 2.0 ** e) for e in range(31) if 2.0 ** e <= 2 * samples}):
        b = min(q, top)
        step = cost.decode_step_s(model, tp, int(b), b * st["context"] / 2)
        rate = b / (st["response"] * step + cost.prefill_s(model, tp, b * st["prompt"]))
        bt = min(top, max(1.0, q * st["response"] / max(1.0, tail_tokens)))
        tail = tail_tokens * cost.decode_step_s(model, tp, max(1, int(bt)), bt * (st["prompt"] + tail_tokens / 2))
        out.append((q, rate, tail))
    return tuple(out)


def _tail_tokens(spec, draws: int = _TAIL_DRAWS) -> float:
    """The expected longest response (all turns) among one step's samples."""
    rng = np.random.default_rng(12345)
    n = spec.samples_per_step
    tops = []
    for _ in range(draws):
        resp = np.minimum(spec.response_len.sample(rng, n), spec.max_response_len)
        if spec.turns is not None:
            resp = np.minimum(resp * spec.turns.sample(rng, n).clip(min=1), spec.max_response_len)
        tops.append(float(resp.max()))
    return float(np.mean(tops))


def plan_pipeline(workload, name: str | None = None, trainer_gpus: int | None = None,
                  trainer_class: str | None = None) -> Provision:
    """The provisioning rule for one asynchronous pipeline of ``workload`` (the first one
    when ``name`` is None). The trainer runs on ``trainer_class`` (default: the first class
    that is on demand and has no link), ``trainer_gpus`` of its devices (default: all of them
    when the spec lists classes, else half the pipeline's share); every other device of the
    pool is a rollout candidate."""
    from jigsaw_plugin.core.pipelines import build_pipelines
    from jigsaw_plugin.costmodel import CostModel
    from jigsaw_plugin.scheduler.estimates import length_stats, train_estimate_s
    from jigsaw_plugin.sim.devices import wan_dissemination_s

    runs = build_pipelines(workload)
    p = _pick(runs, name)
    spec = p.spec
    classes = workload.cluster.device_classes()
    costs = CostModel.of_classes(workload.cluster)
    t = _trainer_class(classes, trainer_class)
    home = classes[t]
    if trainer_gpus is None:
        trainer_gpus = home.count if workload.cluster.classes else max(1, len(p.static_devices) // 2)
    if not isinstance(trainer_gpus, int) or isinstance(trainer_gpus, bool) or not 1 <= trainer_gpus <= home.count:
        raise SpecError("--trainer-gpus", trainer_gpus, f"an integer in 1..{home.count} (devices of class "
                        f"{home.name}, where the trainer runs)")
    need = costs[t].min_gang(p.model, update=True)
    if trainer_gpus < need:
        raise SpecError("--trainer-gpus", trainer_gpus,
                        f"at least {need} {home.name} devices: {costs[t].min_gang_reason(p.model)}")
    st = length_stats(spec)
    tail_tokens = _tail_tokens(spec)
    rates = []
    for k, c in enumerate(classes):
        avail = c.count - (trainer_gpus if k == t else 0)
        tp = costs[k].rollout_width(p.model, p.spec.rollout_tp)
        if avail < tp:
            continue
        # every replica the class could run receives each version over its link (an upper bound)
        pull = wan_dissemination_s(c, p.model, avail // tp) if c.link is not None else 0.0
        gpu = c.gpu if isinstance(c.gpu, str) else str(c.gpu.get("name", "custom"))
        rates.append(ClassRate(c.name, gpu, avail, tp, _price(c), pull,
                               replica_curve(p, costs[k], tp, st, tail_tokens, spec.samples_per_step)))
    if not rates:
        raise SpecError("cluster", workload.cluster.to_dict(),
                        f"devices left for rollout beside the trainer's {trainer_gpus} (at least one replica of "
                        f"{costs[t].rollout_width(p.model, p.spec.rollout_tp)} device(s))")
    inputs = CapacityInputs(spec.name, spec.staleness, spec.samples_per_step, home.name, trainer_gpus, _price(home),
                            train_estimate_s(p, costs[t], trainer_gpus, st),
                            costs[t].weight_sync_s(p.model, colocated=False, cross_node=True),
                            tail_tokens, tuple(rates))
    return provision(inputs)


def _trainer_class(classes, name: str | None) -> int:
    if name is not None:
        for k, c in enumerate(classes):
            if c.name == name:
                return k
        raise SpecError("--trainer-class", name, ", ".join(c.name for c in classes))
    for k, c in enumerate(classes):
        if c.link is None and c.preemptible is None:
            return k
    raise SpecError("cluster.classes", [c.name for c in classes],
                    "at least one on-demand class without a link (where the trainer runs), or --trainer-class")


def _pick(runs, name):
    if name is not None:
        match = [r for r in runs if r.name == name]
        if not match:
            raise SpecError("--pipeline", name, ", ".join(r.name for r in runs))
        p = match[0]
    else:
        asyncs = [r for r in runs if r.spec.mode == "async"]
        if not asyncs:
            raise SpecError("pipelines[*].mode", "sync",
                            "at least one pipeline with mode: async (the capacity model overlaps rollout with "
                            "training; a synchronous pipeline has nothing to provision)")
        p = asyncs[0]
    field = f"pipelines[{p.index}]"
    if p.spec.mode != "async":
        raise SpecError(f"{field}.mode", p.spec.mode, "async (the capacity model overlaps rollout with training)")
    if p.spec.staleness < 1:
        raise SpecError(f"{field}.staleness", p.spec.staleness,
                        "an integer >= 1 (how many versions rollout may run ahead of training)")
    if "update_actor" not in p.stages:
        raise SpecError(f"{field}.algorithm", p.spec.algorithm, "an algorithm with a training stage")
    return p
