"""Lower bounds on a run's makespan and the ideal device-seconds of its work.

Computed after a run from the samples it processed (true lengths are fine here: this is
the record, never the policy's input), priced by the run's cost model:

- ``ideal_device_s``: the least device-seconds any policy could spend. Decode: the larger
  of two floors, per synchronous step (an asynchronous pipeline's steps may share decode
  steps: over its whole run), each a lower bound on its own: every token at the engine's
  largest batch with no KV reads and no host-side step overhead (``max_num_seqs``
  sequences per step, on the replica width that makes a token cheapest); and the HBM
  reads no decode step avoids: the weights once per replica decode step (at least as many
  steps as the longest trajectory has tokens, and as the step's contexts fill the roomiest
  replica's KV cache: ``_cache_steps``) and each token's own KV cache, its whole context,
  once (``_kv_read_device_s``). Every prompt and observation token prefilled once. Every
  training-side pass at its compute on the gang width that makes it cheapest, plus its
  fixed per-stage cost on the fewest devices that hold its state
  (``_stage_fixed_device_s``). Weight syncs, tool calls and rewards cost no device time
  here.
- ``work_s``: ``ideal_device_s / gpus``: no policy finishes sooner than the pool can do the
  work. On a pool of several device classes, also each class's share of the work at that
  class's price over its own devices (``class_work``: the dual of the programme that shares
  the work among classes; the ideal prices everything at its cheapest class, as if the pool
  were all of it).
- ``critical_path_s``: the longest pipeline's chain that no scheduling can overlap. For a
  synchronous pipeline, every step's longest trajectory (decoded at batch 1 on the widest
  replica a node allows, each token reading its own KV cache: ``_decode_chain_s``; plus
  its tool and reward latencies) then its update passes, each
  on its fastest gang of at most the whole pool (``_pass_s``; on several classes a gang or
  replica wider than a class spans classes and runs at its slowest one's pace:
  ``_least_over_layouts``; its forward passes may run
  early, over the trajectories that finished before the longest: ``RunStage.early``); for
  an asynchronous one of staleness ``s``, the same steps in turn, except that a step's
  generation waits only for the training of the step ``s + 1`` before it
  (``_chain_floor``). A step's generation on the chain is also at least its work over the
  pool: its decode, prefill and forward passes run between its generation opening and its
  first update (``_window_s``). Where the executor runs a stage alongside the next (``RunStage.alongside``:
  the log-prob pass beside the reference pass, a PPO step's critic update beside the
  actor's), the pair counts as the longer of the two where its passes are on the chain,
  and its fixed cost once. Each step adds the seconds no device count shortens: every training-side
  stage's fixed cost, the advantage computation, and the weight sync before the next step
  (``_step_fixed_s``). A trajectory's forward passes may run while its reward is computed,
  so after its generation the chain holds the longer of its reward and the forward passes'
  fixed costs, not their sum (``_reward_after_s``).
- ``chain_work_s``: the work bound with the chain's decode priced (``core/chain_work.py``).
  A synchronous step's longest trajectory decodes its tokens one decode step each, and a
  run of makespan ``T`` leaves its pipeline at most ``T`` less the chain's other parts for
  them: the shorter that time, the more of those steps must run wide (each paying ``tp``
  devices' all-reduces, which no read counts) and carry few other sequences (whose
  contexts then need steps of their own, each reading the weights again). The least ``T``
  at which the pool's ``gpus x T`` covers the ideal device-seconds plus what each
  pipeline's chain costs above them is a bound (weak duality of the programme that picks a
  width and a carried context per token under the time budget). The chain's update passes
  share that budget: the work bound counts each at its cheapest gang, and a chain that
  needs them fast pays for wider gangs (``_chain_passes``: each pass's seconds and
  device-seconds above its ideal at every width; a pair run alongside as one). It binds
  where a pipeline's chain is near the work bound, as the long-tail 32B of (e) and the
  training-heavy agents of (a), (b) and (d); elsewhere it is the larger of the two below it.
- ``makespan_lower_bound_s``: the largest of the three.

docs/simulator.md derives each. A test checks that no policy, the oracle ablation
included, beats them on the bundled workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.algorithms import FORWARD_STAGES, HOST_STAGES, UPDATE_STAGES, may_run_alongside
from jigsaw_plugin.core.chain_work import ChainTokens, WidthPrice, chain_work_s, pareto
from jigsaw_plugin.core.class_work import Item, class_work_s, decode_of

__all__ = ["Bounds", "ChainFloor", "PipelineIdeal", "compute_bounds", "chain_split", "gap_breakdown", "rollout_split",
           "idle_gaps", "idle_gap_label", "IDLE_GAP_EDGES_S", "trace_pipeline"]

#: upper edges (seconds) of the idle-gap length classes of ``idle_gaps``
IDLE_GAP_EDGES_S = (2.0, 5.0, 10.0, 20.0, 50.0, 100.0, float("inf"))

_TP = (1, 2, 4, 8, 16, 32, 64)
_INF = float("inf")


@dataclass(frozen=True)
class ChainFloor:
    """One pipeline's chain floor (``critical_path_s`` is the largest sum) in its parts:
    the generation on the chain (a synchronous pipeline's every step's longest trajectory,
    or its work over the pool where that is longer, ``_window_s``; an asynchronous one's
    only for the steps that wait for training), the training side (passes on their fastest gangs,
    their fixed costs, the advantage computation) and the weight syncs between steps."""

    pipeline: str
    generation_s: float
    training_s: float
    weight_sync_s: float

    @property
    def total_s(self) -> float:
        return self.generation_s + self.training_s + self.weight_sync_s


@dataclass(frozen=True)
class PipelineIdeal:
    """One pipeline's part of ``Bounds.ideal_device_s``: its rollout (decode and prefill)
    and its training-side passes, each at the floor the ideal prices them at. A floor on
    that pipeline's own device-seconds in any run, as the sum is on the pool's (where no
    replica is co-located: a guest's time is recorded under its host's replica)."""

    pipeline: str
    rollout_device_s: float
    training_device_s: float


@dataclass(frozen=True)
class Bounds:
    ideal_device_s: float
    work_s: float
    critical_path_s: float
    makespan_lower_bound_s: float
    ideal_rollout_device_s: float = 0.0  # the decode + prefill part of ideal_device_s
    ideal_training_device_s: float = 0.0  # the training-pass part
    ideal_prefill_device_s: float = 0.0  # the prefill part of ideal_rollout_device_s
    chains: tuple = ()  # each pipeline's chain floor, in parts (``ChainFloor``)
    chain_work_s: float = 0.0  # the work bound with the chain's decode priced (``chain_work``)
    pipelines: tuple = ()  # each pipeline's part of ``ideal_device_s`` (``PipelineIdeal``)

    def as_dict(self) -> dict:
        return {"work_s": self.work_s, "critical_path_s": self.critical_path_s,
                "chain_work_s": self.chain_work_s, "makespan_lower_bound_s": self.makespan_lower_bound_s}


def _widths(cost, model, limit: int) -> list[int]:
    """Replica widths a schedule can use: up to ``limit`` (``_width_limit``), sharding the
    model as vLLM can (``ModelProfile.fits_tp``), leaving KV room."""
    return ([tp for tp in _TP if tp <= max(1, limit) and model.fits_tp(tp) and cost.kv_capacity_tokens(model, tp) > 0]
            or [max(1, limit)])


def _width_limit(costs, p, gpn: int) -> int:
    """The widest replica ``p``'s rollout may run on: a node, or its own replica width where
    that is wider (a 72B's 8 devices on nodes of 4 span two; such a replica reads its
    weights in half the time of one within a node, so a bound held to a node's width is no
    bound for it)."""
    return max([gpn] + [c.rollout_width(p.model, p.spec.rollout_tp) for c in costs])


def _decode_token_device_s(cost, model, limit: int) -> float:
    """Least device-seconds per generated token: the largest batch, no KV reads, the GPU
    work alone (a co-located replica's host-side step overhead runs under its partner's
    GPU work: ``costmodel.colocation.colocated_step_s``)."""
    b = cost.f.max_num_seqs
    ov = cost.f.decode_step_overhead_s
    return min((cost.decode_step_s(model, tp, b, 0.0) - ov) * tp / b for tp in _widths(cost, model, limit))


def _tail_token_s(cost, model, limit: int) -> float:
    """Least seconds per token of one sequence decoded alone (batch 1, widest replica)."""
    return min(cost.decode_step_s(model, tp, 1, 0.0) for tp in _widths(cost, model, limit))


def _tail_token_over_classes(costs, counts, model, limit: int) -> float:
    """``_tail_token_s`` over the pool's classes, a replica's width held to the classes that
    have that many devices: one wider than a class spans others and steps at its slowest
    class's pace (``_least_over_layouts``)."""
    if len(counts) < 2:
        return min(_tail_token_s(c, model, limit) for c in costs)
    widths = [set(_widths(c, model, limit)) for c in costs]
    least = min(_least_over_layouts([c.decode_step_s(model, tp, 1, 0.0) if tp in widths[k] else None
                                     for k, c in enumerate(costs)], counts, tp)
                for tp in sorted(set().union(*widths)))
    # no width the pool holds (a replica wider than the pool is refused before a run): as on one class
    return least if least < _INF else min(_tail_token_s(c, model, limit) for c in costs)


def _tail_read_line(costs, model, limit: int) -> tuple[float, float]:
    """A line under the seconds of a batch-1 decode step as its sequence's context grows:
    ``(a, b)`` with every such step at least ``a + b x context`` on any width a schedule
    may use (``_widths``) and any of the pool's classes. A step's memory term reads the
    weights and the sequence's own KV cache, ``(weights + context x KV bytes) / (tp x
    bandwidth)``, and the step is at least that plus its host work and all-reduces
    (``CostModel.decode_step_parts``); ``a`` and ``b`` are the least intercept and the
    least slope over widths and classes (a sequence may change width as it decodes): the
    least of ``_chain_widths``' per-width lines, each taken apart."""
    widths = _chain_widths(costs, model, limit)
    return min(w.step_s for w in widths), min(w.per_context_s for w in widths)


def _decode_chain_s(smp, tail_token: float, line: tuple[float, float]) -> np.ndarray:
    """Each sample's least decode seconds, its tokens one at a time (no step decodes two
    tokens of one sequence): every token at least ``tail_token`` (batch 1, no KV, the
    fastest width), and at least the read line ``a + b x context`` (``_tail_read_line``)
    at its context, ``c + j`` for token ``j`` of a turn after a context of ``c``; each turn
    the larger of the two sums."""
    if not len(smp.gen_tokens):
        return np.zeros(0)
    gen, ctx = _turn_contexts(smp)
    a, b = line
    read = gen * a + b * (gen * ctx + gen * (gen - 1) / 2)
    per_turn = np.maximum(gen * tail_token, read)
    return np.add.reduceat(per_turn, np.asarray(smp.turn_offset[:-1]))


def _class_counts(ex) -> list:
    """Devices per device class of the pool (one entry on a pool of one class)."""
    classes = getattr(ex, "device_classes", None)
    return [c.count for c in classes.specs] if classes is not None else [ex.gpus]


def _share_rollout(shared, costs, model, limit: int, cap: float, smp, fresh: float, sync: bool, turns: list) -> None:
    """A step's rollout as ``class_work``'s items: its prefill at each class's cheapest
    width; its decode (a synchronous step's own; an asynchronous pipeline's turns are kept in
    ``turns`` and priced over its run, ``_share_decode``)."""
    shared[0].append(Item(tuple(fresh * min(c.prefill_s(model, tp, 1e6) * tp / 1e6 for tp in _widths(c, model, limit))
                                for c in costs)))
    gen, ctx = _turn_contexts(smp) if len(smp.gen_tokens) else (np.zeros(0), np.zeros(0))
    if sync:
        _share_decode(shared, costs, model, limit, cap, gen, ctx)
    else:
        turns.append((gen, ctx))


def _share_decode(shared, costs, model, limit: int, cap: float, gen: np.ndarray, ctx: np.ndarray) -> None:
    """One decode's tokens (turns of ``gen`` tokens from contexts ``ctx``) as a
    ``class_work.Decode``, each class's floors at its own prices: a token at the largest
    batch with no KV reads (``_decode_token_device_s``), and the HBM reads of its context's KV
    and of its share of a weight read (``CostModel.decode_roofline``)."""
    roof = [c.decode_roofline(model) for c in costs]
    d = decode_of(gen, ctx, [_decode_token_device_s(c, model, limit) for c in costs], [r[1] for r in roof],
                  [r[0] for r in roof], cap)
    if d is not None:
        shared[1].append(d)


def _class_costs(ex) -> list:
    """The cost model of each of the pool's device classes (a bound takes its least over
    them: it must hold wherever the work runs)."""
    classes = getattr(ex, "device_classes", None)
    return classes.costs if classes is not None else [ex.cost]


def _read_s_per_byte(ex) -> float:
    """Least device-seconds to read one byte of HBM in a decode step, over the pool's
    device classes (the fastest class: a bound must hold wherever the decode runs)."""
    return min(1.0 / (c.hw.hbm_bytes_per_s * c.f.decode_bw_eff) for c in _class_costs(ex))


def _turn_contexts(smp) -> tuple[np.ndarray, np.ndarray]:
    """Each turn's generated tokens and the context it starts from: its sample's prompt,
    the earlier turns' tokens and the tools' observations between them (the context of turn
    k + 1 is turn k's plus its tokens and the observation, as the executor resumes it)."""
    gen = np.asarray(smp.gen_tokens, dtype=np.float64)
    starts = np.asarray(smp.turn_offset[:-1])
    sample = np.repeat(np.arange(len(starts)), np.diff(np.asarray(smp.turn_offset)))
    grown = gen + np.asarray(smp.observation_len, dtype=np.float64)
    before = np.cumsum(grown) - grown  # tokens grown in earlier turns, all samples
    ctx = np.asarray(smp.prompt_len, dtype=np.float64)[sample] + before - before[starts][sample]
    return gen, ctx


def _kv_read_device_s(model, smp, per_byte: float) -> tuple[float, int]:
    """The KV reads a step's decode cannot avoid, in device-seconds, and the fewest decode
    steps it takes (each also reads the weights once: the caller adds them). A decode step of ``b`` sequences on ``tp`` devices takes at least its
    memory term, ``(weights + the b sequences' KV) / (tp x bandwidth)`` (the cost model's
    step is the larger of that and its FLOPs, plus overheads), so it costs at least
    ``(weights + KV) x per_byte`` device-seconds whatever its width and batch. Summed over
    steps: the weights once per step, at least as many steps as the longest trajectory has
    tokens (one token per sequence per step), plus every generated token's KV read once: a
    turn of ``L`` tokens after a context of ``c`` reads ``L c + L (L - 1) / 2`` tokens of KV
    (``_turn_contexts``)."""
    if not len(smp.gen_tokens):
        return 0.0, 0
    gen, ctx = _turn_contexts(smp)
    kv_tokens = float(np.sum(gen * ctx + gen * (gen - 1) / 2))
    steps = int(np.max(np.add.reduceat(smp.gen_tokens, np.asarray(smp.turn_offset[:-1]))))
    return kv_tokens * model.kv_bytes_per_token * per_byte, steps


def _cache_steps(smp, cap: float) -> float:
    """The fewest replica decode steps (each reading its replica's weights once) that a
    step's tokens fill, where no replica's KV cache holds more than ``cap`` tokens
    (``_kv_cap``): the sequences a decode step runs together hold their contexts in one
    cache, so the contexts the step reads sum to at most ``cap`` (one sequence alone may
    outgrow it: each token counts ``min(context, cap)``). Token ``j`` of a turn reads a
    context of ``c + j``; summed over the turn, in closed form."""
    if not len(smp.gen_tokens) or cap <= 0:
        return 0.0
    gen, ctx = _turn_contexts(smp)
    under = np.clip(np.ceil(cap - ctx), 0.0, gen)  # the turn's tokens whose context is below the cap
    return float(np.sum(under * ctx + under * (under - 1) / 2 + (gen - under) * cap)) / cap


def _kv_cap(costs, model, limit: int) -> float:
    """The most tokens of KV cache one replica of ``model`` holds: on the widest replica a
    schedule may use (``_widths``), on the pool's roomiest class, with no other weights
    beside it (a multiplexed or co-located replica holds less), plus one decode step's
    growth past it (the simulator prices a step before it preempts the overflow: at most
    ``max_num_seqs`` tokens, the most of any class: a replica's batch limit is validated
    against the pool's first class)."""
    return (max(c.kv_capacity_tokens(model, tp) for c in costs for tp in _widths(c, model, limit))
            + max(c.f.max_num_seqs for c in costs))


def _step_fixed_s(ex, p, last: bool) -> tuple[float, float, float]:
    """Seconds of a step's training chain no device count shortens, as (training side,
    its forward passes' part, weight sync): each training-side stage's fixed cost (every
    stage runs once after the step's last trajectory ends, or after the previous stage: an
    early pass cannot cover the last trajectory) and the advantage computation; the weight
    sync that must end before the next step's rollout (none after the last step). Each at
    its least over the pool's device classes and over the sync's link options. The
    forward passes' part (their fixed costs, a pair run alongside counted once) may run
    while the last trajectory's reward is computed (``_reward_after_s``); it is at least
    its true share, so the rest is at most its own."""
    costs = _class_costs(ex)
    overhead = min(c.f.train_stage_overhead_s for c in costs)
    pairs = [p.stages[k] for k in _alongside(ex, p)]
    # a stage run alongside the next pays its fixed cost while its partner pays its own
    fixed = -overhead * len(pairs)
    forward = -overhead * sum(stage in FORWARD_STAGES for stage in pairs)
    sync = 0.0
    for stage in p.stages:
        if stage in FORWARD_STAGES or stage in UPDATE_STAGES:
            fixed += overhead
            forward += overhead if stage in FORWARD_STAGES else 0.0
        elif stage in HOST_STAGES:
            fixed += ex.cost.f.adv_s
        elif stage == "weight_sync" and not last:
            sync += min(c.weight_sync_s(p.model, colocated, cross) for c in costs
                        for colocated in (True, False) for cross in (True, False))
    return fixed, forward, sync


def _reward_after_s(reward_s: np.ndarray, forward_fixed: float) -> np.ndarray:
    """Seconds of a trajectory's reward that the chain counts after its generation, beside
    the ``forward_fixed`` seconds it counts after its last trajectory anyway: a trajectory's
    forward passes may run while its reward is computed (early passes in the reward wait,
    as verl's ``launch_reward_fn_async`` overlaps them), and the update needs both, so
    after a trajectory's generation the chain holds ``max(reward, forward passes)``, not
    their sum. A rule reward's 0 s stays 0 (the same chain as without it)."""
    return np.maximum(reward_s - forward_fixed, 0.0)


def _alongside(ex, p) -> list:
    """Indices of ``p``'s stages that may run alongside the next on executor ``ex``
    (``RunStage.alongside``, ``algorithms.ALONGSIDE``) where its pool holds a gang of each
    at once (``_both_fit``)."""
    if not getattr(ex, "supports_concurrent_stages", False):
        return []
    costs = _class_costs(ex)
    return [i for i, stage in enumerate(p.stages) if may_run_alongside(stage, p.stages, i)
            and _both_fit(costs, p.model, stage, p.stages[i + 1], ex.gpus)]


def _least_compute_device_s(c, model, stage: str, tokens: float, gpus: int) -> float:
    """Least device-seconds of a training-side pass's compute (its fixed cost taken off) on
    cost model ``c``: every gang width from the fewest devices that hold its state
    (``stage_min_gang``) to the pool, since a pass's device-seconds need not be monotone in
    its width (micro-batch counts round up, a hybrid-sharding layout must divide the gang,
    a node's edge moves its all-gathers onto the NICs): a bound that skipped a width could
    sit above a schedule that used it."""
    price = c.forward_s if stage in FORWARD_STAGES else c.train_s
    ov = c.f.train_stage_overhead_s
    lo = min(c.stage_min_gang(model, stage), gpus)
    return min(max(0.0, price(model, w, tokens) - ov) * w for w in range(lo, gpus + 1))


def _pass_device_s(costs, model, stage: str, tokens: float, gpus: int) -> float:
    """Least device-seconds of a training-side pass: compute without the stage's fixed cost,
    on a gang that holds its state, at its cheapest width (``_least_compute_device_s``),
    over the pool's device classes."""
    return min(_least_compute_device_s(c, model, stage, tokens, gpus) for c in costs)


def _pass_s(costs, model, stage: str, tokens: float, gpus: int, counts=None) -> float:
    """Least seconds of a training-side pass's compute (its fixed cost is in
    ``_step_fixed_s``), on the fastest gang of at most ``gpus`` devices: every width, since
    a pass's time is not monotone in it (past a node its all-gathers cross the NICs), over
    the pool's device classes. A stage the executor resizes runs each of its micro-batches
    at its own width's price, so it is never faster than its fastest width alone.

    ``counts`` (devices per class, ``costs``' order; None: one class) holds a width to the
    classes that have that many devices: a gang wider than a class reaches others, and a
    gang that spans classes runs at its slowest class's pace (``sim.devices.ClassPricer``),
    so at each width the pass takes at least the least, over the sets of classes with that
    many devices together, of the slowest of them (``_least_over_layouts``). Each class's
    price counts only where the width holds the pass's state on that class
    (``stage_min_gang``), as on one class."""
    return float(np.min(_gang_prices(costs, model, stage, tokens, gpus, counts)[0], initial=_INF))


def _least_over_layouts(prices: list, counts, width: int) -> float:
    """The least, over the sets of classes that hold ``width`` devices together, of the
    largest of their ``prices`` at that width (a gang spanning them runs at its slowest
    class's pace); a class whose price is None (the width does not hold the work there)
    adds its devices but no price. A set none of whose classes prices the width is skipped:
    infinity where no set remains."""
    best = _INF
    k = len(prices)
    for mask in range(1, 1 << k):
        members = [i for i in range(k) if mask >> i & 1]
        if sum(counts[i] for i in members) < width:
            continue
        priced = [prices[i] for i in members if prices[i] is not None]
        if priced:
            best = min(best, max(priced))
    return best


def _pair_s(costs, model, a: str, b: str, tokens: float, gpus: int, a_s: float, b_s: float) -> float:
    """Least seconds of passes ``a`` and ``b`` run side by side, beyond the one fixed cost
    the chain counts for the pair (``_step_fixed_s``). The longer of the two on its fastest
    gang (``a_s``, ``b_s``: two gangs at once hold no more than the pool, so neither runs
    faster than alone); and while both run, the pool holds every device-second of both: the
    interval from the first start to the last end is at least their least compute
    device-seconds (any width, ``_pass_device_s``'s figure over every width) plus the
    fixed cost on each one's fewest devices, over the ``gpus`` devices, of which the
    chain's one fixed cost is taken off. Where passes scale with their gang, running two
    side by side is no faster than one after the other on the whole pool."""
    dev_s = 0.0
    for stage in (a, b):
        dev_s += min(_least_compute_device_s(c, model, stage, tokens, gpus)
                     + c.f.train_stage_overhead_s * min(c.stage_min_gang(model, stage), gpus) for c in costs)
    fixed = min(c.f.train_stage_overhead_s for c in costs)
    return max(a_s, b_s, dev_s / gpus - fixed)


def _both_fit(costs, model, a: str, b: str, gpus: int) -> bool:
    """Whether passes ``a`` and ``b`` can run at once: the pool holds a gang of each (each
    at least the devices that hold its state, ``stage_min_gang``, at its least over the
    device classes). Where it cannot, at most one of them progresses at any moment, and
    the pair costs the sum of their fastest times (a 72B PPO step's two updates, 17
    devices each, on 32)."""
    return sum(min(c.stage_min_gang(model, s) for c in costs) for s in (a, b)) <= gpus


def _stage_fixed_device_s(costs, model, stage: str) -> float:
    """Device-seconds of a training-side pass's fixed cost no schedule avoids: the executor
    charges it on every device of the gang (split over its micro-batches, each at its own
    width), and a gang holds at least the pass's state (``stage_min_gang``); a pass split
    into early parts pays it once per part."""
    return min(c.f.train_stage_overhead_s * c.stage_min_gang(model, stage) for c in costs)


def _passes_s(ex, costs, p, passes: dict, tokens: float, gpus: int) -> float:
    """Least seconds of ``passes`` (stage -> its least seconds) one after another, where a
    pass run alongside the next overlaps it where the pool holds both (``_alongside``):
    the pair costs the longer of the two, and no less than the pool takes to hold both
    passes' device-seconds (``_pair_s``)."""
    total = sum(passes.values())
    for k in _alongside(ex, p):
        a, b = p.stages[k], p.stages[k + 1]
        if a in passes and b in passes:
            total += _pair_s(costs, p.model, a, b, tokens, gpus, passes[a], passes[b]) - passes[a] - passes[b]
    return total


def _gang_prices(costs, model, stage: str, tokens: float, gpus: int, counts=None,
                 counted: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """A training-side pass at each gang width from the fewest devices that hold it to the
    pool: its seconds without its fixed cost (the least over the layouts of the pool's
    classes, as ``_pass_s`` reads them) and its device-seconds above ``counted`` (what the
    ideal counts for it: its compute at its cheapest width and its fixed cost on its
    fewest devices): a gang of ``w`` holds all ``w`` devices for the whole pass, its fixed
    cost included, at best at the cheapest class's price. ``counts`` as in ``_pass_s``."""
    if counts is None or len(counts) < 2:
        counts = [gpus] * len(costs)  # each class as the whole pool: the least over classes
    price = lambda c, w: (c.forward_s if stage in FORWARD_STAGES else c.train_s)(model, w, tokens)
    lo = [min(c.stage_min_gang(model, stage), gpus) for c in costs]
    seconds, excess = [], []
    for w in range(min(lo), gpus + 1):
        prices = [price(c, w) if w >= lo[k] else None for k, c in enumerate(costs)]
        t = _least_over_layouts([None if x is None else max(0.0, x - c.f.train_stage_overhead_s)
                                 for x, c in zip(prices, costs)], counts, w)
        held = min((x * w for x in prices if x is not None), default=_INF)
        if t < _INF and held < _INF:
            seconds.append(t)
            excess.append(max(0.0, held - counted))
    return np.asarray(seconds), np.asarray(excess)


def _chain_passes(ex, costs, p, prices: dict, tokens: float, gpus: int) -> list:
    """``ChainTokens.passes`` of one synchronous step from its update passes' ``prices``
    (stage -> ``_gang_prices``): each pass at every gang width; a pair run alongside
    (``_alongside``) as one, its seconds the longer of the two gangs' and never under the
    pool's time to hold both passes' device-seconds (``_pair_s``), its excess the two
    gangs' together."""
    out, paired = [], set()
    for k in _alongside(ex, p):
        a, b = p.stages[k], p.stages[k + 1]
        if a in prices and b in prices:
            # each gang on its own Pareto points (one that another beats in both never helps the pair)
            pa, pb = pareto(*prices[a]), pareto(*prices[b])
            floor = _pair_s(costs, p.model, a, b, tokens, gpus, 0.0, 0.0)
            both = np.maximum(np.maximum(pa.seconds[:, None], pb.seconds[None, :]), floor)
            out.append(pareto(both.ravel(), (pa.excess_device_s[:, None] + pb.excess_device_s[None, :]).ravel()))
            paired.update((a, b))
    for stage in prices:
        if stage not in paired:
            out.append(pareto(*prices[stage]))
    return [pp for pp in out if len(pp.seconds)]  # a pass no width holds: the pool refuses its pipeline


def _window_s(costs, p, device_s: float, gpus: int) -> float:
    """A floor on the seconds from a step's generation opening to the end of its last
    trajectory, from its work: everything the step needs before its first update (its
    decode, prefill and forward passes: ``device_s``, at their ideal device-seconds, each
    pass's fixed cost on its fewest devices included) runs after its generation opens (its
    trajectories do not exist before) and before that update starts (the update reads the
    whole batch and every forward pass's output), on at most the pool's ``gpus`` devices.
    The chain (``_chain_floor``) adds every forward pass's fixed cost after the last
    trajectory; taken off here (at its most: no pair run alongside), so the sum is at most
    ``device_s / gpus`` where the work, not the longest trajectory, sets the window. This is
    what holds a pipeline's chain up where its steps' bulk, not their longest response,
    takes the time (a 72B DAPO pipeline alone on 32 A100: each step generates and scores
    1,024 responses of two turns, 110 s of work on the whole pool, where its longest
    trajectory decodes in 15 s)."""
    forward_fixed = min(c.f.train_stage_overhead_s for c in costs) * sum(s in FORWARD_STAGES for s in p.stages)
    return device_s / gpus - forward_fixed


def _bound_staleness(p) -> int:
    """How many steps ``p``'s generation may run ahead of its training in any run the bounds
    hold for: none for a synchronous pipeline; for an asynchronous one its spec's
    staleness, at least 1 (the asynchronous baselines' floor, ``scheduler/baselines.py``)."""
    return 0 if p.spec.mode == "sync" else max(1, int(p.spec.staleness))


def _chain_floor(name: str, links: list, staleness: int) -> ChainFloor:
    """A pipeline's chain floor from its steps' ``links`` (generation floor: the longest
    trajectory, or the step's work over the pool, ``_window_s``; update passes, fixed
    seconds, weight sync; in step order) under staleness ``s``. The executor
    starts step k's generation only once steps 0..k-s-1 are trained and synced
    (``ExecutorCore._open_step``), and runs step k's stages in order, each once, only once
    step k-1's weight sync has ended and step k's batch is complete (its forward passes may
    have read most of it early, beside anything: they are not on the chain). So, with
    ``A_k`` a lower bound on the end of step k's weight sync and ``G_k`` on its last
    trajectory's end:

        G_k >= (A_{k-s-1}, or 0 for k <= s) + longest_k
        A_k >= max(A_{k-1}, G_k) + updates_k + fixed_k + sync_k

    and the run ends no sooner than its last step's ``A`` less that step's sync (there is
    none). Synchronous (s = 0): each step's longest trajectory, updates, fixed costs and
    sync in turn, as before. Asynchronous: a step more than ``s`` ahead waits for the
    training of the step ``s + 1`` before it, so a pipeline whose trajectories are long (an
    agent's tool calls and sandboxed rewards) has several of them on its chain, where until
    stop 57 the first step's alone was counted (and every step's forward passes, which
    early passes need not leave on it). The chain's parts (generation, training, weight
    sync) are kept along the larger branch of each max."""
    none = (0.0, 0.0, 0.0)
    ends: list = []  # per step: (generation, training, weight sync) parts of its A
    for k, (longest, updates, fixed, sync) in enumerate(links):
        gate = ends[k - staleness - 1] if k > staleness else none
        gen_end = (gate[0] + longest, gate[1], gate[2])
        start = max(ends[k - 1] if k else none, gen_end, key=sum)
        ends.append((start[0], start[1] + updates + fixed, start[2] + sync))
    return ChainFloor(name, *(ends[-1] if ends else none))


def compute_bounds(ex) -> Bounds:
    """``ex``: a finished ``ExecutorCore``."""
    gpus, gpn = ex.gpus, ex.largest_node
    costs = _class_costs(ex)  # each figure at its least over the pool's device classes
    per_byte = _read_s_per_byte(ex)
    ideal = 0.0
    rollout_ideal = 0.0
    prefill_ideal = 0.0
    critical = 0.0
    chains = []
    counts = _class_counts(ex)
    shared = ([], []) if len(counts) > 1 else None  # the classes' items and decodes (``class_work``)
    priced = []  # synchronous pipelines' chain trajectories (``chain_work``)
    own = []  # each pipeline's part of the ideal (``PipelineIdeal``)
    for p in ex.order:
        ideal_before, rollout_before = ideal, rollout_ideal
        m = p.model
        limit = _width_limit(costs, p, gpn)
        per_token = min(_decode_token_device_s(c, m, limit) for c in costs)
        tail_token = _tail_token_over_classes(costs, counts, m, limit)
        tail_line = _tail_read_line(costs, m, limit)
        prefill_per_token = min(c.prefill_s(m, tp, 1e6) * tp / 1e6 for c in costs for tp in _widths(c, m, limit))
        sync = p.spec.mode == "sync"
        links = []  # per step: (generation floor, update passes, fixed, weight sync)
        weights_s = m.weight_bytes * per_byte  # one decode step's weight read
        cap = _kv_cap(costs, m, limit)
        batched = reads = cached = 0.0  # an asynchronous pipeline's decode floors, over its whole run
        decode_steps = 0
        steps = [p.steps[k] for k in sorted(p.steps)]
        turns = []  # an asynchronous pipeline's turns, (tokens, first context), over its run
        chain_turns, chain_rest, counted, slack = [], 0.0, 0.0, 0.0  # a synchronous one's ``ChainTokens``
        chain_passes = []
        for i, s in enumerate(steps):
            smp = s.samples
            gen = float(np.sum(smp.gen_tokens))
            fresh = float(np.sum(smp.prompt_len)) + float(np.sum(smp.observation_len))
            kv_s, longest_tokens = _kv_read_device_s(m, smp, per_byte)
            # replica decode steps, each reading the weights: at least as many as the longest
            # trajectory has tokens, and as the step's contexts fill one cache
            filled = _cache_steps(smp, cap)
            if sync:  # a synchronous step's decode steps are its own: its floors hold alone
                decode = max(gen * per_token, kv_s + max(longest_tokens, filled) * weights_s)
                own_decode = decode
                counted += max(0.0, longest_tokens - filled) * weights_s
                slack += max(0.0, gen * per_token - (kv_s + max(longest_tokens, filled) * weights_s))
            else:  # steps may share decode steps: only the run's floors hold (below)
                batched += gen * per_token
                reads += kv_s
                cached += filled
                decode_steps = max(decode_steps, longest_tokens)
                decode = 0.0
                # its tokens' share of shared steps: a step's weight read split over its
                # sequences by their contexts is at least weights x context / cap a token
                own_decode = max(gen * per_token, kv_s + filled * weights_s)
            if shared is not None:
                _share_rollout(shared, costs, m, limit, cap, smp, fresh, sync, turns)
            ideal += decode + fresh * prefill_per_token
            rollout_ideal += decode + fresh * prefill_per_token
            prefill_ideal += fresh * prefill_per_token
            # the device-seconds that must run between the step's generation opening and its
            # first update (``_window_s``): its decode and prefill, its forward passes
            window = own_decode + fresh * prefill_per_token
            updates = {}  # the step's update passes (on its chain): stage -> least seconds
            prices = {}  # ... and stage -> its seconds and excess at each width (``_gang_prices``)
            for stage in p.stages:
                if stage in FORWARD_STAGES or stage in UPDATE_STAGES:
                    pass_device_s = _pass_device_s(costs, m, stage, s.tokens, gpus) + _stage_fixed_device_s(costs, m, stage)
                    ideal += pass_device_s
                    if shared is not None:
                        shared[0].append(Item(tuple(_least_compute_device_s(c, m, stage, s.tokens, gpus)
                                                    + c.f.train_stage_overhead_s * min(c.stage_min_gang(m, stage), gpus)
                                                    for c in costs)))
                    if stage in FORWARD_STAGES:
                        window += pass_device_s
                if stage in UPDATE_STAGES:
                    prices[stage] = _gang_prices(costs, m, stage, s.tokens, gpus, counts, pass_device_s)
                    updates[stage] = float(np.min(prices[stage][0], initial=_INF))  # ``_pass_s``
            # the step's longest trajectory: its tokens one at a time, its tools and reward
            starts = np.asarray(smp.turn_offset[:-1])
            per_sample = _decode_chain_s(smp, tail_token, tail_line)
            fixed, forward_fixed, weight_sync = _step_fixed_s(ex, p, last=i == len(steps) - 1)
            waits = np.add.reduceat(smp.tool_latency_s, starts) + _reward_after_s(smp.reward_latency_s, forward_fixed)
            longest = float(np.max(per_sample + waits)) if len(per_sample) else 0.0
            generation = max(longest, _window_s(costs, p, window, gpus))  # or its work over the pool
            passes = _passes_s(ex, costs, p, updates, s.tokens, gpus)
            links.append((generation, passes, fixed, weight_sync))
            if sync and len(per_sample):  # the chain's trajectory: its turns and the rest of the step's chain
                j = int(np.argmax(per_sample + waits))
                gen_t, ctx_t = _turn_contexts(smp)
                chain_turns += [(float(c), int(g)) for g, c in zip(gen_t[starts[j]:smp.turn_offset[j + 1]],
                                                                   ctx_t[starts[j]:smp.turn_offset[j + 1]])]
                chain_rest += float(waits[j]) + fixed + weight_sync
                chain_passes += _chain_passes(ex, costs, p, prices, s.tokens, gpus)
        floor = _chain_floor(p.name, links, _bound_staleness(p))
        chains.append(floor)
        chain = floor.total_s
        if not sync:
            decode = max(batched, reads + max(decode_steps, cached) * weights_s)
            ideal += decode
            rollout_ideal += decode
            if shared is not None and turns:
                _share_decode(shared, costs, m, limit, cap, np.concatenate([g for g, _ in turns]),
                              np.concatenate([c for _, c in turns]))
        critical = max(critical, chain)
        rollout_own = rollout_ideal - rollout_before
        own.append(PipelineIdeal(p.name, rollout_own, ideal - ideal_before - rollout_own))
        if chain_turns:
            priced.append(ChainTokens(_chain_widths(costs, m, limit), weights_s, cap, tuple(chain_turns), counted,
                                      chain_rest, slack, tuple(chain_passes)))
    work = ideal / gpus
    if shared is not None:  # each class its share at its own price (``class_work``)
        work = max(work, class_work_s(shared[0], shared[1], counts))
    chain_work = chain_work_s(ideal, gpus, priced, max(work, critical))
    return Bounds(ideal, work, critical, max(work, critical, chain_work), rollout_ideal, ideal - rollout_ideal,
                  prefill_ideal, tuple(chains), chain_work, tuple(own))


def _chain_widths(costs, model, limit: int) -> tuple:
    """``chain_work``'s prices of a chain trajectory's decode step on each width a schedule
    may use (``_widths``), each at its least over the pool's classes: its seconds at batch 1
    with no KV (host work, all-reduces, the weight shard's read), the seconds each token of
    context adds, and the tp x all-reduce device-seconds no read counts
    (a step's all-reduces grow with its batch: batch 1 is their least)."""
    least: dict = {}
    for c in costs:
        weights, per_kv, _ = c.decode_roofline(model)
        for tp in _widths(c, model, limit):
            parts = c.decode_step_parts(model, tp, 1, 0.0)
            now = (parts.host_s + parts.allreduce_s + weights / tp, per_kv / tp, tp * parts.allreduce_s)
            was = least.get(tp)
            least[tp] = now if was is None else tuple(min(x, y) for x, y in zip(now, was))
    return tuple(WidthPrice(*v) for _, v in sorted(least.items()))


def _trace_kind(category: str) -> str:
    """A trace entry's part of the run: a rollout replica, a weight sync, else training."""
    return category if category in ("rollout", "weight_sync") else "training"


def _trace_pipeline(name: str) -> str:
    """The pipeline of a trace entry, from its name (``"<pipeline> rollout r<id>"``,
    ``"<pipeline> <stage> s<step>"``; a pipeline's name has no spaces: ``workload.spec``)."""
    return name.rsplit(" ", 2)[0]


def gap_breakdown(ex, bounds: Bounds, makespan: float) -> dict:
    """Where the device-seconds between the run and the ideal went, from the executor's
    per-device record (``ex.trace``): devices with no task, rollout replicas above the
    ideal decode and prefill (small batches, KV reads, re-prefill, empty replicas waiting
    on tools), training passes above their compute and their fixed cost on the fewest
    devices (the fixed cost paid on wider gangs, gangs past their cheapest width, context
    switches), and weight syncs. The four sum to ``gpus x makespan - ideal``. ``pipelines``
    splits the last three by pipeline, each against its own part of the ideal
    (``Bounds.pipelines``): they sum to the totals."""
    held = {"rollout": 0.0, "training": 0.0, "weight_sync": 0.0}
    mine: dict = {}  # pipeline -> its held device-seconds by kind
    for name, category, devices, start, end in ex.trace:
        kind = _trace_kind(category)
        spent = max(0.0, end - start) * len(devices)
        held[kind] += spent
        by_kind = mine.setdefault(_trace_pipeline(name), {"rollout": 0.0, "training": 0.0, "weight_sync": 0.0})
        by_kind[kind] += spent
    total = ex.gpus * makespan
    parts = {
        "idle_device_s": total - sum(held.values()),
        "rollout_above_ideal_device_s": held["rollout"] - bounds.ideal_rollout_device_s,
        "training_above_ideal_device_s": held["training"] - bounds.ideal_training_device_s,
        "weight_sync_device_s": held["weight_sync"],
    }
    gap = total - bounds.ideal_device_s
    out = {**parts, "gap_device_s": gap,
           "fractions": {k.removesuffix("_device_s"): (v / gap if gap > 0 else 0.0) for k, v in parts.items()}}
    if bounds.pipelines:
        out["pipelines"] = _pipeline_gaps(bounds, mine)
    split = rollout_split(ex, bounds, held["rollout"])
    if split is not None:
        out["rollout"] = split
    return out


def _pipeline_gaps(bounds: Bounds, held: dict) -> dict:
    """``gap_breakdown``'s per-pipeline part: each pipeline's rollout and training
    device-seconds beside its ideal (``PipelineIdeal``), what is above it, and its weight
    syncs."""
    out = {}
    for own in bounds.pipelines:
        spent = held.get(own.pipeline, {"rollout": 0.0, "training": 0.0, "weight_sync": 0.0})
        out[own.pipeline] = {
            "rollout_device_s": spent["rollout"],
            "ideal_rollout_device_s": own.rollout_device_s,
            "rollout_above_ideal_device_s": spent["rollout"] - own.rollout_device_s,
            "training_device_s": spent["training"],
            "ideal_training_device_s": own.training_device_s,
            "training_above_ideal_device_s": spent["training"] - own.training_device_s,
            "weight_sync_device_s": spent["weight_sync"],
        }
    return out


def rollout_split(ex, bounds: Bounds, held_s: float) -> dict | None:
    """The rollout replicas' device-seconds by what they did, where the executor records it
    (``rollout_time``: the simulator; a live executor's engines do not report each step's
    batch): decode steps bound by their HBM reads (too few sequences to use the devices'
    compute: tails and thin batches), decode steps bound by their FLOPs, prefill (re-prefill
    after a move included), time held with no request at all (its trajectories in tool
    calls, or the step's last responses decoding elsewhere), and the rest (weight loads,
    requests waiting behind a prefill, a co-located guest's share). Of the decode, the parts
    of its steps the ideal decode leaves out: the engines' host-side step work (the GPU idle
    meanwhile, unless a co-located engine's kernels fill it) and the tensor-parallel
    all-reduces. With the ideal decode and prefill beside them; by replica width as well.
    None where not recorded."""
    record = getattr(ex, "rollout_time", None)
    if record is None:
        return None
    mem, comp, prefill, empty = (sum(v[i] for v in record.values()) for i in range(4))
    host, allreduce = (_sum_known(v[i] if len(v) > i else None for v in record.values()) for i in (4, 5))
    return {
        "decode_memory_bound_device_s": mem,
        "decode_compute_bound_device_s": comp,
        "ideal_decode_device_s": bounds.ideal_rollout_device_s - bounds.ideal_prefill_device_s,
        # parts of the decode above that the ideal does not count: the engines' host-side
        # step work with the GPU idle, and the tensor-parallel all-reduces (None where a
        # plugin priced the steps)
        "decode_host_device_s": host,
        "decode_allreduce_device_s": allreduce,
        "prefill_device_s": prefill,
        "ideal_prefill_device_s": bounds.ideal_prefill_device_s,
        "empty_device_s": empty,
        "other_device_s": held_s - mem - comp - prefill - empty,
        "by_width": {str(tp): {"decode_memory_bound_device_s": v[0], "decode_compute_bound_device_s": v[1],
                               "prefill_device_s": v[2], "empty_device_s": v[3],
                               "decode_host_device_s": v[4] if len(v) > 4 else None,
                               "decode_allreduce_device_s": v[5] if len(v) > 5 else None}
                     for tp, v in sorted(record.items())},
    }


def _sum_known(values) -> float | None:
    """The sum, or None where any value is unknown (None)."""
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total


#: the parts of a pipeline's time in ``chain_split``, the one on its chain first: a
#: synchronous step's training waits for its rollout, an asynchronous pipeline's chain is
#: its training (its rollouts run ahead, beside it)
_CHAIN_ORDER = {"sync": ("generation", "training", "weight_sync"), "async": ("training", "weight_sync", "generation")}


def chain_split(ex, bounds: Bounds) -> dict:
    """Where each pipeline's time from the run's start to its finish went, beside its chain
    floor (``bounds.chains``), from the executor's record (``ex.trace``): each instant is
    counted once, as the first of ``_CHAIN_ORDER`` that any of the pipeline's tasks was
    running then: generation (a rollout replica held, its trajectories' tool calls
    included), training (a training-side stage, early passes and a stage alongside the
    next included), a weight sync; else waiting (nothing of it running: its next stage or
    rollout waiting for devices, or its rewards). The pipeline that finished last is the
    makespan's chain: its parts above their floors are where that chain lost time."""
    spans: dict[str, dict[str, list]] = {}
    for name, category, _, start, end in ex.trace:
        if end <= start:
            continue
        kind = _trace_kind(category)
        kind = "generation" if kind == "rollout" else kind
        spans.setdefault(_trace_pipeline(name), {}).setdefault(kind, []).append((start, end))
    floors = {c.pipeline: c for c in bounds.chains}
    out = {}
    for p in ex.order:
        finish = p.finished_t or 0.0
        mine = spans.get(p.name, {})
        taken: list = []  # instants already counted, merged
        parts = {}
        for kind in _CHAIN_ORDER["sync" if p.spec.mode == "sync" else "async"]:
            spans_of = _merged([(a, min(b, finish)) for a, b in mine.get(kind, ()) if a < finish])
            parts[f"{kind}_s"] = _length(spans_of) - _overlap(spans_of, taken)
            taken = _merged(taken + spans_of)
        parts["waiting_s"] = max(0.0, finish - _length(taken))
        floor = floors.get(p.name)
        out[p.name] = {"finish_s": finish, **parts,
                       "floor_s": floor.total_s if floor else 0.0,
                       "generation_floor_s": floor.generation_s if floor else 0.0,
                       "training_floor_s": floor.training_s if floor else 0.0,
                       "weight_sync_floor_s": floor.weight_sync_s if floor else 0.0}
    return out


def _merged(spans: list) -> list:
    """``(start, end)`` spans as the sorted, disjoint spans of their union."""
    out: list = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(spans: list) -> float:
    return sum(b - a for a, b in spans)


def _overlap(x: list, y: list) -> float:
    """Seconds in both of two merged span lists."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def idle_gaps(ex, makespan: float) -> dict:
    """Where the idle device-seconds of ``gap_breakdown`` lie, from the executor's per-device
    record: by the length of each idle gap (a device's time between two tasks, or before
    its first and after its last), and by what the device did before and after it (a task's
    category: ``rollout``, ``weight_sync`` or a training stage; ``start`` / ``end`` of the
    run). Short gaps between a task and the next are waits on a boundary (a micro-batch, a
    tail's end); long ones are devices no work could use. ``during_weight_sync_s``: the
    idle seconds that pass while the pipeline of the device's task before the gap syncs its
    weights (a sync runs on one device; the rest of the update's gang waits it out before
    the pipeline's next rollout or pass)."""
    per: dict[int, list] = {}
    syncs: dict[str, list] = {}
    for name, category, devices, start, end in ex.trace:
        pipeline = trace_pipeline(name)
        for d in devices:
            per.setdefault(d, []).append((start, end, category, pipeline))
        if category == "weight_sync":
            syncs.setdefault(pipeline, []).append((start, end))
    syncs = {k: _merged(v) for k, v in syncs.items()}
    by_length = {idle_gap_label(e): 0.0 for e in IDLE_GAP_EDGES_S}
    by_transition: dict[str, float] = {}
    during_sync = 0.0

    def add(t0: float, t1: float, before: str, after: str, pipeline: str | None) -> None:
        nonlocal during_sync
        gap = t1 - t0
        if gap <= 1e-9:
            return
        label = idle_gap_label(next(e for e in IDLE_GAP_EDGES_S if gap <= e))
        by_length[label] += gap
        key = f"{before}->{after}"
        by_transition[key] = by_transition.get(key, 0.0) + gap
        if pipeline in syncs:
            during_sync += _overlap([(t0, t1)], syncs[pipeline])

    for d in range(ex.gpus):
        t, before, pipeline = 0.0, "start", None
        for start, end, category, owner in sorted(per.get(d, ())):
            add(t, start, before, category, pipeline)
            if end >= t:
                t, before, pipeline = end, category, owner
        add(t, makespan, before, "end", pipeline)
    return {"by_length_s": by_length,
            "by_transition": dict(sorted(by_transition.items(), key=lambda kv: -kv[1])),
            "during_weight_sync_s": during_sync}


def trace_pipeline(name: str) -> str:
    """The pipeline a trace record is of: its name's first word (``"dapo-7b rollout r3"``;
    a workload's names hold no spaces, ``workload.spec``)."""
    return name.split(" ", 1)[0]


def idle_gap_label(edge: float) -> str:
    """The name of the idle-gap length class whose upper edge is ``edge`` seconds."""
    return "over 100" if edge == float("inf") else f"<= {edge:g}"
