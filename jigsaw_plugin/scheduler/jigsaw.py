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
  nothing else took (``grow_at_home``); an agent off the critical path whose
  trajectories are in tool calls lends its home for their projected calls and next turns
  (``tool_wait``);
- tails priced in device-seconds: a replica decoding at a small batch (a few long
  requests, where a token costs many times its ideal) hands them to a sibling with room
  (abort + resume) when the device-seconds freed outweigh the re-prefill and the
  sibling's slowdown, and its pipeline's projected completion allows the stretch;
  a tail is re-sharded onto a wider replica, on any node with free devices, when that ends
  its generation sooner (with ``priority`` on, only when its pipeline is on the job set's
  critical path);
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

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.algorithms import FORWARD_STAGES, HOST_STAGES, early_stages, may_run_alongside, runs_on_gang
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler.activation import activate, trainer_site
from jigsaw_plugin.scheduler.admission import fitting, launch_limit, spread_of
from jigsaw_plugin.scheduler.base import Policy, PolicySetup, register_policy
from jigsaw_plugin.scheduler.colocation import colocate_tails
from jigsaw_plugin.scheduler.decisions import (
    AdmissionLimit,
    LaunchReplica,
    Migrate,
    ResizeStage,
    RetireReplica,
    RunStage,
    StartGen,
)
from jigsaw_plugin.scheduler.estimates import (
    balanced_split,
    gen_estimate_s,
    gen_parts_s,
    observed_stats,
    rollout_tp,
    train_estimate_s,
)

__all__ = ["JigsawConfig", "JigsawMemo", "Jigsaw"]

_INF = float("inf")
_UNSET = object()  # a figure of the round not computed yet
# micro-batches a stage not yet started is assumed to run as (the simulator's default; a
# running stage reports its own in ``RunningStageView``)
_MICRO_BATCHES = 8
_STAGE_TIMES_KEPT = 256  # passes whose times by width a policy keeps (a few per pipeline)
_SHARE_ESTIMATES_KEPT = 1024  # (generation, training) estimates on a share a policy keeps


@dataclass(frozen=True)
class JigsawConfig:
    """Switches for each mechanism (``jigsaw bench --ablate``) and the heuristic's knobs."""

    multiplex: bool = True  # lend idle devices across pipelines (off: each stays on its home)
    resize: bool = True  # replica counts and gang sizes change at run time (off: home sizes)
    migration: bool = True  # consolidate rollout tails by abort + resume
    lookahead: bool = True  # gang sizes, loans and service order from projections (off: greedy)
    borrow: bool = True  # rollout replicas on other pipelines' spare devices (cross-pipeline allocation)
    # running stages grow onto lent devices at micro-batch boundaries; owners reclaim. Off by
    # default: on the bundled workloads it gained 1% on (a), lost 1.5% on (d) and 15% on (c)
    loans: bool = False
    # micro-batch loans for the job set's critical pipeline only (projected last at the
    # observed paces, as ``lend_to_critical``): its running stage grows at micro-batch
    # boundaries onto devices free now, including those of owners off the critical path;
    # owners with work ready reclaim them at the next boundary. Other stages keep their
    # width. Measured (3 seeds): -1.0% makespan on (a), -1.8% (b), -0.4% (c), -0.6% (d),
    # -0.5% (f), +0.3% (e) (docs/simulator.md)
    critical_loans: bool = True
    # an owner whose only claim on its lent devices is a running stage that may not grow
    # (loans off, owner off the critical path) does not take them back from the critical
    # pipeline: it would leave them idle (they sat idle 30-40 s between a PPO agent's
    # critic and actor updates on (a)). Owners with ready work still reclaim at once
    keep_critical_loans: bool = True
    # a running stage off the critical path (no loans for it) still grows at its micro-batch
    # boundaries onto its own home's devices that nothing else took this round: no owner
    # waits for them, and they sat idle beside it (8 devices for 26 s on (a), a 4-device
    # log-prob pass of 48 s next to its own home's freed devices)
    grow_at_home: bool = True
    # a step's rollout that could start on only part of the replicas it wants waits, when
    # home devices for at least as many more are projected free within ``home_wait`` of its
    # projected generation: an engine admits a whole batch at once and admitted requests
    # move only by re-prefill, so starting narrow kept (a)'s agents on half their replicas
    wait_for_home: bool = True
    home_wait: float = 0.05
    # rollout replicas at the width whose decoded token costs least at the context observed
    # so far (long contexts: a wider replica's cache holds more sequences per copy of the
    # weights); the spec's width until a trajectory has finished (docs/simulator.md)
    bulk_width: bool = True
    # a rollout off the critical path fills its home's free devices, so with few requests
    # each replica holds few: its width is priced at the batch it will run there (several
    # narrow replicas of 8 each, or one wide one of 32), not at the batch its cache holds
    # (docs/simulator.md)
    fill_width: bool = True
    # a critical pipeline's training gang (projected last at the pipelines' observed paces)
    # may take free devices of owners off the critical path even when they want them back
    # soon: they wait, the makespan does not (docs/simulator.md)
    lend_to_critical: bool = True
    # the critical pipeline's next training gang is served first: among stages ready in one
    # round it forms its gang before the others', and while it is in its host-side stage
    # (the advantage computation) with a training stage next, no other pipeline's gang
    # borrows devices beyond its home for longer than that stage has left (docs/simulator.md)
    critical_claim: bool = True
    # an owner whose step has generated every trajectory and waits on their rewards (a
    # sandbox running each one's tests) lends its home for as long as the wait is projected
    # from the rewards seen so far (``_reward_wait_s``, less the time waited); off, and
    # before any reward was timed, it wants its home at once (docs/simulator.md)
    reward_wait: bool = True
    # an owner off the critical path generating while trajectories of its step are in tool
    # calls wants its home back no sooner than their calls and next turns are projected to
    # take (``_tool_calls_left_s``): its replicas' drains say nothing of the turns to come
    tool_wait: bool = True
    # makespan-aware shares: each round, the pool is re-apportioned among the unfinished
    # pipelines so that they are projected to finish together (their remaining work that
    # spreads over devices, plus each step's longest response that does not), never below
    # ``min_share`` of a static share: devices go to the pipeline whose completion is
    # furthest out. Off by default: measured +1.8% on (a) and +2.7% on (d), -1.6% on (c)
    # and -2.1% on (e) (docs/benchmarks.md, "with balance")
    balance: bool = False
    min_share: float = 0.8
    priority: bool = False  # serve the pipeline furthest from whole-run completion first (off: furthest in its step; on measured 2-5% slower on (a), so off by default)
    horizon_s: float = 600.0  # how far ahead the look-ahead projects
    width: int = 4  # candidate plans per ready stage (start now, or wait for 1..width-1 more devices)
    # ... and a ready stage whose start-now plan would end past the job set's projected
    # finish (the latest at the observed paces) waits for busy devices outside its home
    # whose owners have finished, when waiting for the first k of them ends at least
    # ``wait_gain`` sooner (off: with ``admission`` on, an 8B update started on its 2-device
    # home while 74 such devices freed within 40 s; its first micro-batch ran 1,092 s,
    # held-out mix s6052 +61%)
    wait_for_freed: bool = True
    wait_gain: float = 0.1
    tail_requests: int = 32  # a replica with at most this many requests decodes well below its ideal batch
    min_gain: float = 2.0  # migrate when freed device-seconds >= min_gain x the move's cost
    latency_slack: float = 0.05  # a move may stretch a critical pipeline's generation by this much
    max_slack: float = 0.25  # ... and a pipeline with this much completion headroom by up to this much
    loan_margin: float = 1.2  # a loan must end this many times before its owner needs it back
    spread_cost: float = 1.15  # replicas decode at the smallest batch whose token costs <= this x ideal
    # the run's last unfinished pipeline, if synchronous, starts a step's rollout on as many more replicas as
    # the devices the others left allow, down to the batch below which halving it shortens a
    # decode step by less than ``idle_spread_gain``: no other pipeline can use those devices,
    # and a long context's KV reads make a smaller batch decode each token faster
    idle_spread: bool = True
    idle_spread_gain: float = 0.2
    # a crowded rollout on the job set's critical path (its decode batch above the one below
    # which halving it shortens a step by less than ``idle_spread_gain``) spreads onto devices
    # no owner wants back before it drains: new replicas take running requests (re-prefilled)
    # from the most loaded ones, when the drain they save beats ``min_gain`` x the weight
    # load and re-prefill; a long context's KV reads make the smaller batch decode faster
    critical_spread: bool = True
    # ... also where its requests are few enough to count as a tail (``widen_requests``),
    # as long as the replica that ends last is crowded at its own width; no tail merge then
    # leaves a replica of it crowded (off: a tail is only re-sharded wider or merged, and
    # the run's last pipeline decoded ~40 long-context requests a replica on 3 replicas,
    # as wide as its 4-GPU nodes allow, while 92 devices stood idle)
    spread_in_tail: bool = True
    # before a pipeline's first step ends (no pace observed), it counts as critical for the
    # critical-path rules (``lend_to_critical``, ``critical_loans``, ``keep_critical_loans``,
    # early passes; and its finish is the latest ``_near_critical`` compares with) when its
    # finish projected from its observed lengths (``_projected_finish_t``) is past every
    # other pipeline's by more than ``max_slack`` (off: none is critical before its first
    # step ends, and a 72B critic update that started on 6 devices ran 9,800 s while 98 sat
    # idle)
    predicted_pace: bool = True
    # a training gang takes no more devices than its fastest width: past it the pass is
    # bound by parameter all-gathers (over the node NICs once it outgrows a node) and a
    # wider gang only ends later (off: every free device it may take). Measured: synthetic
    # mixes -3.7% makespan geomean (23 of 60 faster, none slower), trace/search_r1_async
    # -12.7%: its last pipeline's 32B update ran on 4 devices (52 s), the narrowest gang
    # no slower than all 16 over two nodes (62 s), where one node's 8 take 27 s
    # (docs/simulator.md). Every width is a candidate, not only powers of two (FSDP shards
    # over any count): a 14B update on (f) is fastest on 10 devices (26 s), where 8 take
    # 34 s and 16 take 29 s
    fastest_width: bool = True
    widen_requests: int = 128  # re-shard a rollout onto a wider replica from this many requests down
    max_widen: int = 8  # widest tensor-parallel replica a tail is re-sharded onto
    reshard_in_place: bool = True  # a widened tail may take its own replicas' devices (re-shard in place)
    colocate: bool = False  # move a tail onto another pipeline's tail replica's devices where it pays (docs/colocation.md)
    # the tail consolidation prices a pipeline's tails only where its engines' request
    # counts changed or a trajectory of it finished since its requests were last read
    # (``requests_changed``), not while its tails merely decode on: a pricing that found no
    # move is not redone. Why: at 1024 GPUs / 32 pipelines the first rollout's tails were
    # re-priced every round, 550 tails and 30 gathers a round, and the decision p99 went past
    # 10 ms; measured neutral on the makespans (with the reclaim fix of stop 35: +0.09%
    # geometric mean over (a)-(f) at seeds 0-2; docs/simulator.md)
    reprice_on_change: bool = True
    # the actor's log-prob pass beside the reference pass, and a PPO step's critic update
    # beside the actor's, each on a gang of its own (as OpenRLHF runs them), the ready
    # devices split between the two where both end sooner than one after the other; only
    # on executors that can (``concurrent_stages``; algorithms.ALONGSIDE)
    concurrent_stages: bool = True
    # ... when the later of the two ends at least this fraction sooner than the two in turn:
    # a pass that scales with its devices gains nothing from the split, and the gang run
    # alongside keeps its width (it cannot grow onto devices that free up meanwhile)
    alongside_gain: float = 0.1
    # forward passes (log-prob, reference, values) over a step's finished trajectories on
    # devices its rollout no longer needs, while the tail still generates: the stage's own
    # pass then reads only the rest (docs/simulator.md, "Early forward passes")
    early_passes: bool = True
    early_from: float = 0.5  # ... once this fraction of the step's trajectories has finished
    early_chunk: float = 0.25  # ... and reading at least this fraction of the finished tokens again
    early_min_fixed: float = 2.0  # a pass reads at least this many times its fixed cost's worth
    # ... and while a step whose trajectories are all generated waits on their rewards (a
    # sandbox), for as long as the wait is projected from earlier rewards (``_reward_wait_s``):
    # the passes that need no reward run beside it, as verl's ``launch_reward_fn_async`` does
    early_in_reward_wait: bool = True
    # ... and while trajectories of the step are in tool calls, the rollout's projected end
    # then at least their calls' (``_tool_calls_left_s``): off, a step with a trajectory in
    # a tool call counts as no tail
    early_in_tool_calls: bool = True
    split_async: bool = False  # split an async pipeline's home into rollout and training parts
    # an async pipeline with a batch to train keeps its training gang's devices: its next
    # rollout holds at most the rollout part of a split of its home balanced from what it
    # has observed, and grows onto the rest only while no batch waits (docs/simulator.md)
    async_reserve: bool = True
    # heterogeneous pools (scheduler/activation.py): rollout on the cheapest samples that keep the
    # learner fed within the staleness bound, training on the trainer's site; no-op on one class
    cost_aware: bool = True
    # a replica admits a waiting request only while the expected KV peak of what it runs
    # stays within its cache (scheduler/admission.py; executors that declare
    # ``admission_limits``): an engine admits whatever fits now, and sequences that outgrow
    # the cache are preempted and recomputed. On since stop 52: -0.61% geometric mean over 260
    # synthetic mixes (docs/simulator.md, "Admission limits")
    admission: bool = True
    # ... and where the running sequences alone are expected to outgrow the cache, the limit
    # falls below them: the engine preempts the excess once, and re-admits nothing until
    # the rest fit (without it, every sequence that ends lets a preempted one back in, to
    # be preempted and re-prefilled again)
    shed_admission: bool = True
    # ... the peak taken this many standard deviations above the expected KV: admitted up to
    # its expected peak, a replica overflows about half the time (docs/simulator.md)
    admission_margin_sd: float = 1.0

    def __post_init__(self) -> None:
        # each knob within the range its rule reads it in (a negative width or a slack of
        # 500% ran before, silently, with meaningless decisions)
        for f in dataclasses.fields(self):
            v, name = getattr(self, f.name), f"JigsawConfig.{f.name}"
            if f.type in (bool, "bool"):
                if not isinstance(v, bool):
                    raise SpecError(name, v, "true or false")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SpecError(name, v, "a finite number")
            if f.name in _COUNT_KNOBS and (not isinstance(v, int) or v < 1):
                raise SpecError(name, v, "an integer >= 1")
            if f.name in _FRACTION_KNOBS and not 0.0 <= v <= 1.0:
                raise SpecError(name, v, "a fraction in [0, 1]")
            if f.name in _FACTOR_KNOBS and v < 1.0:
                raise SpecError(name, v, "a factor >= 1")
            if v < 0:
                raise SpecError(name, v, "a number >= 0")


_COUNT_KNOBS = ("width", "tail_requests", "widen_requests", "max_widen")
_FRACTION_KNOBS = ("home_wait", "min_share", "latency_slack", "max_slack", "idle_spread_gain", "alongside_gain",
                   "early_from", "early_chunk", "wait_gain")
_FACTOR_KNOBS = ("loan_margin", "spread_cost")  # multiples of a duration or of the ideal token cost


@dataclass(frozen=True)
class JigsawMemo:
    """What the policy derives once, at setup: each pipeline's homes and each device's owner."""

    home: dict  # pipeline -> (rollout home, training home)
    owner: dict  # device -> the pipeline whose static share holds it


def apportion(work: dict, floor: dict, total: int) -> dict:
    """Device counts summing to ``total`` (when the floors allow): each name gets its
    ``floor``, the rest in proportion to ``work`` above it (largest remainders; ties by
    order). Names with no work and no floor get none."""
    counts = dict(floor)
    left = total - sum(counts.values())
    want = {k: w for k, w in work.items() if w > 0}
    if left <= 0 or not want:
        return counts
    whole = sum(want.values())
    ideal = {k: total * w / whole for k, w in want.items()}
    excess = {k: max(0.0, ideal[k] - counts[k]) for k in want}
    ex = sum(excess.values()) or 1.0
    share = {k: left * e / ex for k, e in excess.items()}
    for k, v in share.items():
        counts[k] += int(v)
    rest = total - sum(counts.values())
    for k in sorted(share, key=lambda k: -(share[k] - int(share[k])))[:max(0, rest)]:
        counts[k] += 1
    return counts


def finish_together(left: dict, total: int) -> dict:
    """Devices per name so that all finish at one time ``T``: a name with ``work``
    device-seconds that spread and ``fixed`` seconds that do not finishes at
    ``fixed + work / n`` on ``n`` devices; ``T`` is found by bisection so the counts (real
    numbers) sum to ``total``."""
    busy = {k: (w, f) for k, (w, f) in left.items() if w > 0}
    if not busy:
        return {k: 0.0 for k in left}
    need = lambda t: sum(w / (t - f) if t > f else _INF for w, f in busy.values())
    lo = max(f for _, f in busy.values())
    hi = lo + sum(w for w, _ in busy.values()) / max(1, total) * 2 + 1.0
    while need(hi) > total:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if need(mid) > total else (lo, mid)
    return {k: (busy[k][0] / (hi - busy[k][1]) if k in busy else 0.0) for k in left}


def _batch_held(state, model, tp: int, context: float) -> int:
    """Sequences one replica of width ``tp`` admits at ``context`` tokens each: its batch
    limit (``max_num_seqs``) or what its KV cache holds, at least one."""
    return max(1, min(state.max_num_seqs, int(state.cost.kv_capacity_tokens(model, tp) // context)))


def _tail_s(cost, model, tp: int, n: int, context: float, left: float) -> float:
    """Projected time for ``n`` requests holding ``context`` KV tokens on a replica of width
    ``tp`` to decode the longest one's ``left`` tokens (the KV grows by half of that on average)."""
    return left * cost.decode_step_s(model, tp, n, context + n * left / 2)


def _prefix_fastest(times: list) -> list:
    """For each ``g`` (index ``g - 1``): the least of ``times[:g]`` (a pass's time on 1, 2,
    ... devices) and the width that gives it, the narrowest on ties."""
    out, best = [], (_INF, 1)
    for w, t in enumerate(times, 1):
        if t < best[0] - 1e-12:
            best = (t, w)
        out.append(best)
    return out


def _limit_of(r, engine_max: int) -> int | None:
    """The admission limit replica ``r`` runs under (None: its engine's own batch limit)."""
    return r.max_seqs if r.max_seqs < engine_max else None


def _running_context(live) -> float:
    """Mean context (KV tokens) of the sequences ``live`` replicas run now (0 if none)."""
    return sum(r.kv_tokens for r in live) / max(1, sum(r.running for r in live))


def _ended(out: list) -> set:
    """Replicas this round's decisions retire or absorb (they may close at once)."""
    ended = {d.replica for d in out if isinstance(d, RetireReplica)}
    for d in out:
        if isinstance(d, LaunchReplica):
            ended.update(d.absorb)
    return ended


def _balanced_groups(replicas: list, k: int) -> list:
    """``replicas`` in ``k`` groups of near-equal load (largest first onto the lightest)."""
    groups = [[] for _ in range(k)]
    loads = [0] * k
    for r in sorted(replicas, key=lambda r: (-r.load, r.id)):
        j = loads.index(min(loads))
        groups[j].append(r)
        loads[j] += r.load
    return [g for g in groups if g]


def assign_devices(static: dict, counts: dict, node_of: list) -> dict:
    """Device tuples of the given ``counts``, moving as few devices from their static
    share as possible: a pipeline over its count gives up its last static devices, one
    under it takes free ones on the nodes it already holds first."""
    keep = {k: list(devs[:counts.get(k, 0)]) for k, devs in static.items()}
    taken = {d for devs in keep.values() for d in devs}
    pool = [d for devs in static.values() for d in devs if d not in taken]
    for k in sorted(static, key=lambda k: -(counts.get(k, 0) - len(keep[k]))):
        need = counts.get(k, 0) - len(keep[k])
        if need <= 0:
            continue
        nodes = {node_of[d] for d in keep[k]}
        pool.sort(key=lambda d: (node_of[d] not in nodes, d))
        keep[k] += pool[:need]
        pool = pool[need:]
    return {k: tuple(v) for k, v in keep.items()}


class _Shares(dict):
    """pipeline -> the devices of its rollout and training homes, each built when first read."""

    def __init__(self, home: dict):
        super().__init__()
        self.home = home

    def __missing__(self, name: str) -> tuple:
        r, t = self.home[name]
        got = self[name] = r if r is t else tuple(dict.fromkeys(r + t))
        return got


class _Round:
    """One decide round's working set: the free devices left and figures computed once."""

    __slots__ = ("state", "free", "need", "completion", "critical_s", "resized", "gone", "home", "owner",
                 "share", "paced_last", "rollout_cap", "bulk_tp", "spread", "aim", "predicted_last", "projected",
                 "moved_in", "claim")

    def __init__(self, state, home: dict, owner: dict):
        self.state = state
        self.home = home  # pipeline -> (rollout home, training home) this round
        self.owner = owner  # device -> the pipeline whose home holds it this round
        self.share = _Shares(home)  # pipeline -> its home devices (rollout and training), built on first use
        self.free = set(state.free)
        self.need: dict[str, float] = {}  # owner -> seconds until it wants its home back
        self.completion: dict[str, float] = {}  # pipeline -> predicted seconds to finish its run
        self.critical_s: float | None = None
        self.paced_last: float | None = None  # the latest projected finish at observed paces
        self.resized: dict[str, tuple] = {}  # pipeline -> devices a ResizeStage of this round gives its stage
        self.gone: set = set()  # replicas this round retires or empties: no request may move to them
        self.rollout_cap: dict[str, int | None] = {}  # pipeline -> home devices its rollout may hold
        self.bulk_tp: dict[str, int] = {}  # pipeline -> the width its rollout replicas launch at
        self.spread = _UNSET  # (pipeline, batch) critical_spread serves, or None; computed on first use
        self.aim: dict[int, int] = {}  # width -> the batch a spread of that pipeline aims at (``_aim_batch``)
        self.predicted_last = _UNSET  # the pipeline projected to finish clearly last (predicted_pace), or None
        self.projected: dict[str, float] = {}  # pipeline -> projected finish, no prediction read
        # replica -> (requests, KV tokens) this round's moves send it: its engine's report
        # does not show them yet, and two moves to one replica must both fit
        self.moved_in: dict[int, tuple[int, float]] = {}
        self.claim: tuple | None = None  # (seconds until the critical pipeline's next gang is ready, its name)

    def stage_devices(self, p) -> tuple:
        """The devices ``p``'s running stage will hold from its next boundary on."""
        if p.name in self.resized:
            return self.resized[p.name]
        rs = p.running_stage
        return rs.resize_to if rs.resize_to is not None else rs.devices

    def resize(self, out: list, p, devices: tuple) -> None:
        rs = p.running_stage
        self.resized[p.name] = devices
        out.append(ResizeStage(p.name, rs.step, rs.stage, devices))


class _Ends:
    """One pipeline's predicted drains in a round of tail consolidation (replica ->
    seconds), read as the pricing needs them, and what every pricing of the round derives
    from all of them: the bound a move may stretch the generation to and the three latest
    ends. Those two are computed once, not once per tail priced (550 tails a round at 1024
    GPUs), and again only after a move of the round changed an end."""

    __slots__ = ("drain", "slack", "_bound", "_top")

    def __init__(self, slack: float, drain: dict | None = None):
        self.drain: dict = {} if drain is None else drain
        self.slack = slack
        self._bound: float | None = None
        self._top: list | None = None

    def of(self, r) -> float:
        got = self.drain.get(r.id)
        if got is None:
            got = self.drain[r.id] = r.predicted_drain_s()
        return got

    def latest(self, live) -> tuple[float, list]:
        """(the generation's end bound: the latest end x (1 + slack), the three latest ends
        as (replica, end)), every live replica's drain read first, in live order (the order
        the latest ends tie in)."""
        if self._bound is None:
            drain = self.drain
            for r in live:
                if r.id not in drain:
                    drain[r.id] = r.predicted_drain_s()
            self._bound = max(drain.values()) * (1 + self.slack)
            self._top = sorted(drain.items(), key=lambda kv: -kv[1])[:3]  # "others" in O(1)
        return self._bound, self._top

    def moved(self, src, dst, end: float) -> None:
        """A move of this round: ``src`` is empty, ``dst`` ends at ``end``."""
        self.drain[dst.id], self.drain[src.id] = end, 0.0
        self._bound = self._top = None


@register_policy("jigsaw")
class Jigsaw(Policy):
    name = "jigsaw"
    config_class = JigsawConfig
    resident_slots = 1

    def __init__(self, **options):
        self.config = JigsawConfig(**options)
        self.tail_threshold = self.config.tail_requests if self.config.migration else 0
        self.decides_on_preemption = self.config.admission  # a preemption says a batch limit is too high
        # a pass's time on 1, 2, ... devices, by what prices it (cost model, model, stage,
        # tokens): a ready stage's widths are read every round it waits
        self._widths_s: dict[tuple, list] = {}
        # a step's (generation, training) seconds on a share, by what prices them (the cost
        # model, the pipeline, the share, its length summary): every round projects
        # every pipeline's finish from them, and they change only when a trajectory ends
        self._share_s: dict[tuple, tuple] = {}

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
        cfg = self.config
        home, owner = self._homes(state)
        rnd = _Round(state, home, owner)
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
                want = max(1, self._grow_fills(rnd, p)) if not live else min(want, self._grow_fills(rnd, p))
            groups = self._replica_devices(rnd, p, want)
            if not groups and not (kind == "gen" and live):
                continue
            if kind == "gen" and not live and self._home_returning(rnd, p, len(groups), want):
                continue  # its home is back in a moment: start then, on all of it
            limit = self._launch_limits_of(rnd, p, [len(g) for g in groups]) if admit else {}
            out += [LaunchReplica(p.name, g, rebalance=(kind == "grow"), max_seqs=limit.get(len(g))) for g in groups]
            if kind == "gen":
                if admit:
                    self._limit_before_start(rnd, p, live, out)
                out.append(StartGen(p.name, p.gen_next))
            rnd.free.difference_update(d for g in groups for d in g)
        if cfg.critical_spread:
            self._spread_critical(rnd, out)
        if cfg.early_passes and state.early_passes and cfg.resize:
            self._early_passes(rnd, out)
        if cfg.resize and (cfg.grow_at_home or (cfg.multiplex and (cfg.loans or cfg.critical_loans))):
            self._grow_stages(rnd, out)
        if admit:
            self._limit_admission(rnd, out)
        return out

    # ---- makespan-aware shares ------------------------------------------------------------
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

    def _work_left(self, state, p) -> tuple[float, float]:
        """The rest of ``p``'s run as (device-seconds that spread over devices, seconds that
        do not), from what it has observed on its static share: training and the batched
        bulk of generation scale with devices; each step's longest response and a
        trajectory's tool calls (the observed mean turns of the observed mean call) do not.
        The current step counts whole, so shares move at step ends, not with every request."""
        if p.done:
            return 0.0, 0.0
        share = max(1, len(p.static_devices))
        stats = observed_stats(p)
        bulk, tail = gen_parts_s(p, state.cost, share, stats)
        train = train_estimate_s(p, state.cost, share, stats)
        steps = p.total_steps - p.train_next
        # a trajectory's tool calls wait in sequence whatever the devices: the mean turns' worth
        tail += max(0.0, p.lengths.turns - 1) * p.lengths.tool_s
        return steps * (bulk + train) * share, steps * tail

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
                    out.append(RetireReplica(r.id))
                    rnd.gone.add(r.id)
                    rnd.free.update(r.devices)
                    live.remove(r)

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

    # ---- projections --------------------------------------------------------------------
    def _remaining_s(self, state, p) -> float:
        """Projected time to finish the pipeline's current step on its home devices."""
        gen, train = self._on_share_s(state, p, len(p.static_devices))
        rest = 0.0
        if p.generating:
            rest = max((r.predicted_drain_s() for r in p.replicas), default=0.0)
        elif self._may_start_gen(p):
            rest = gen
        return rest + train

    def _completion_s(self, rnd, p) -> float:
        """Projected time to finish the pipeline's whole run on its static share: this step's
        rest, then its remaining steps at the rate its observed lengths give."""
        got = rnd.completion.get(p.name)
        if got is not None:
            return got
        if p.done:
            rnd.completion[p.name] = 0.0
            return 0.0
        _, per_step = self._step_on_share_s(rnd.state, p)
        later = max(0, p.total_steps - p.train_next - 1)
        rnd.completion[p.name] = got = self._remaining_s(rnd.state, p) + later * per_step
        return got

    def _step_on_share_s(self, state, p) -> tuple[float, float]:
        """(training, whole step) seconds of one step of ``p`` on its static share at its
        observed lengths: an asynchronous step overlaps its generation with training."""
        gen, train = self._on_share_s(state, p, max(1, len(p.static_devices)))
        return train, (max(gen, train) if p.spec.mode == "async" else gen + train)

    def _on_share_s(self, state, p, share: int) -> tuple[float, float]:
        """(``gen_estimate_s``, ``train_estimate_s``) of one step of ``p`` on ``share``
        devices at its observed lengths, each computed once for what it reads."""
        key = (state.cost, p.name, share, p.lengths)  # a run's pipeline name stands for its spec
        got = self._share_s.get(key)
        if got is None:
            if len(self._share_s) >= _SHARE_ESTIMATES_KEPT:
                self._share_s.clear()
            stats = observed_stats(p)
            got = self._share_s[key] = (gen_estimate_s(p, state.cost, share, stats),
                                        train_estimate_s(p, state.cost, share, stats))
        return got

    def _critical_s(self, rnd) -> float:
        """The job set's projected completion: the furthest of its pipelines'."""
        if rnd.critical_s is None:
            rnd.critical_s = max((self._completion_s(rnd, p) for p in rnd.state.order if not p.done), default=0.0)
        return rnd.critical_s

    def _slack(self, rnd, p) -> float:
        """How much a tail move may stretch ``p``'s generation: ``latency_slack`` on the job
        set's critical path, up to ``max_slack`` where its completion has headroom."""
        cfg = self.config
        if not (cfg.lookahead and cfg.priority):
            return cfg.latency_slack
        mine = self._completion_s(rnd, p)
        head = (self._critical_s(rnd) - mine) / max(mine, 1e-9)
        return min(cfg.max_slack, max(cfg.latency_slack, head))

    def _busy_for_s(self, state, d) -> float:
        """Projected time until device ``d`` is free."""
        task = state.devices[d].task
        if task is None:
            return 0.0
        if task.kind == "replica":
            rep = state.replicas.get(task.replica)
            if rep is None:
                return 0.0
            o = state.pipelines[task.pipeline]
            drain = rep.predicted_drain_s()
            if (o.lengths.tool_s > 0 and sum(1 for r in o.replicas if not r.retiring) == 1
                    and self._between_turns(o) > o.load()):
                # the last replica stays for the next turns of the trajectories in tool calls
                # (``_retire_drained``), so what it holds now does not say when it empties
                return max(drain, self._tool_calls_left_s(o))
            return drain
        o = state.pipelines[task.pipeline]
        if task.stage is not None and task.stage == o.alongside_stage:
            end = o.alongside_end_t
            return max(0.0, end - state.t) if end is not None else 0.0
        rs = o.running_stage
        if rs is not None and rs.resize_to is not None and d not in rs.resize_to:
            return max(0.0, rs.boundary_t - state.t)  # being handed back at the next boundary
        end = o.running_stage_end_t
        return max(0.0, end - state.t) if end is not None else 0.0

    @staticmethod
    def _tool_calls_left_s(p) -> float:
        """How long ``p``'s trajectories in tool calls keep its rollout going at least: each
        returns after its call, then may call again, about half the observed mean turns
        left, at the observed mean call (``LengthSummary.tool_s``; at least one call)."""
        return p.lengths.tool_s * max(1.0, (p.lengths.turns - 1) / 2)

    @staticmethod
    def _between_turns(p) -> int:
        """Trajectories of ``p``'s generating steps that no replica holds now: in a tool call
        or a sandbox, their next turn still to come."""
        if not p.generating:
            return 0
        open_ = 0
        for k in range(p.train_next, p.gen_next):  # the steps before are trained: all generated
            s = p.steps.get(k)
            if s is not None:
                open_ += s.samples - s.gen_done
        return max(0, open_ - p.load())

    def _needed_in_s(self, rnd, owner: str) -> float:
        """When the owner of a home device is projected to want it back."""
        got = rnd.need.get(owner)
        if got is not None:
            return got
        state = rnd.state
        o = state.pipelines[owner]
        if o.done:
            got = _INF
        elif self._wants_home_now(rnd, o) or o.next_stage:
            got = 0.0
        elif o.stage_running or o.alongside_stage is not None:
            ends = [e for e in (o.running_stage_end_t, o.alongside_end_t) if e is not None]
            got = max(0.0, min(ends) - state.t) if ends else 0.0
        elif o.generating:
            got = max((r.predicted_drain_s() for r in o.replicas), default=0.0)
            if (self.config.tool_wait and o.lengths.tool_s > 0 and self._between_turns(o) > 0
                    and not self._paced_critical(rnd, o)):
                # trajectories in tool calls come back for more turns: the rollout, and the
                # training after it, are that far off at least, whatever the replicas hold now
                # (an owner on the critical path keeps its claim: its next turns would wait
                # for a loan to end, and they set the makespan)
                got = max(got, self._tool_calls_left_s(o))
        elif self.config.reward_wait:
            got = self._reward_wait_s(o, state.t)
        else:
            got = 0.0
        rnd.need[owner] = got
        return got

    @staticmethod
    def _reward_wait_s(o, t: float) -> float:
        """``reward_wait``: how long ``o``, whose step has generated every trajectory and
        waits on their rewards, leaves its home unused, less the time it has waited so far:
        at least the shortest wait from a step's last generated trajectory to its last reward
        that its earlier steps saw, and at least the mean reward of the trajectories so far
        (the step's last trajectory takes one too: this holds from a pipeline's first step).
        0 (it wants its home now) before any reward was timed, or when nothing waits on
        rewards."""
        s = o.steps.get(o.train_next)
        if s is None or s.gen_end_t is None or s.gen_done < s.samples or s.rewarded >= s.samples:
            return 0.0
        waits = o.stage_history_s.get("reward")
        wait = max(min(waits) if waits else 0.0, o.lengths.reward_s)
        return max(0.0, wait - (t - s.gen_end_t))

    def _paused(self, rnd, p) -> bool:
        rs = p.running_stage
        return rs is not None and rs.resizable and not rnd.stage_devices(p)

    def _wants_home_now(self, rnd, o) -> bool:
        """``o`` has work ready that its home devices should run now: a ready stage, a stage
        paused or still able to grow, a rollout to start or requests waiting for a replica."""
        rs = o.running_stage
        if rs is not None and rs.resizable and (rs.micro_batches_left >= 2 or not rnd.stage_devices(o)):
            return True
        return self._has_ready_work(o)

    def _would_use_home(self, rnd, o) -> bool:
        """As ``_wants_home_now``, but a running stage counts only where it would take the
        devices: paused, or able to grow this round (``_stage_may_grow``)."""
        rs = o.running_stage
        if rs is not None and rs.resizable and (not rnd.stage_devices(o) or (
                rs.micro_batches_left >= 2 and self._stage_may_grow(rnd, o))):
            return True
        return self._has_ready_work(o)

    def _stage_may_grow(self, rnd, p) -> bool:
        """``p``'s running stage may grow at its boundaries onto lent devices: every stage
        with ``loans``, the critical pipeline's alone with ``critical_loans`` (onto its own
        home's free devices, every stage may: ``grow_at_home``)."""
        return self.config.loans or self._paced_critical(rnd, p)

    def _has_ready_work(self, o) -> bool:
        """A ready stage, a rollout to start or requests waiting for a replica."""
        stage = o.next_stage
        if runs_on_gang(stage):
            return True
        return (self._may_start_gen(o) and not o.generating) or o.pending > 0

    def _lendable(self, rnd, p, duration, training: bool = False) -> list:
        """Free devices outside ``p``'s home whose owners can spare them for ``duration``;
        for a ``training`` gang of a pipeline on the job set's critical path at its observed
        pace (``lend_to_critical``), also devices of owners off it, however soon they want
        them back: such an owner has slack, the borrower sets the makespan."""
        if not self.config.multiplex:
            return []
        state = rnd.state
        mine = set(rnd.share[p.name])
        out = []
        critical = training and self.config.lend_to_critical and self._paced_critical(rnd, p)
        if training and not critical and self._claim_s(rnd, p) < self.config.loan_margin * duration:
            return []  # the critical pipeline's gang is ready sooner and would borrow them
        for d in sorted(rnd.free):
            if d in mine:
                continue
            owner = rnd.owner.get(d)
            if owner is None:
                out.append(d)
            elif not self.config.lookahead or self._needed_in_s(rnd, owner) >= self.config.loan_margin * duration:
                out.append(d)
            elif critical and not self._paced_critical(rnd, state.pipelines[owner]):
                out.append(d)
        return out

    def _claim_s(self, rnd, p) -> float:
        """``critical_claim``: seconds until a pipeline other than ``p`` on the critical
        path at its observed pace has a training stage ready, where it is in its host-side
        stage (the advantage computation, on no device) and a training stage on devices
        follows; infinite otherwise. What it runs next is read from its stage order, and when
        the host stage ends from the executor's report of the stage running: the policy
        predicts nothing here."""
        if not (self.config.critical_claim and self.config.lookahead):
            return math.inf
        if rnd.claim is None:
            rnd.claim = (math.inf, None)
            state = rnd.state
            for c in state.order:
                if c.done or not c.stage_running or c.running_stage_end_t is None:
                    continue
                k = c.stage_next
                after = c.stages[k + 1] if k + 1 < len(c.stages) else None
                if c.stages[k] not in HOST_STAGES or not runs_on_gang(after) or not self._paced_critical(rnd, c):
                    continue
                rnd.claim = min(rnd.claim, (max(0.0, c.running_stage_end_t - state.t), c.name),
                                key=lambda x: x[0])
        wait, claimant = rnd.claim
        return math.inf if claimant == p.name else wait

    # ---- micro-batch loans ----------------------------------------------------------------
    def _reclaim(self, rnd, out) -> None:
        """Owners with work ready get their lent home devices back: a borrowing stage shrinks
        at its next micro-batch boundary; a borrowed replica's requests move to a sibling."""
        state = rnd.state
        shrink: dict[str, set] = {}
        replicas: set = set()
        for o in state.order:
            if o.done or not self._wants_home_now(rnd, o):
                continue
            # an owner that would leave the devices idle lets the critical pipeline keep them
            yields = self.config.keep_critical_loans and not self._would_use_home(rnd, o)
            for d in rnd.share[o.name]:
                task = state.devices[d].task
                if task is None or task.pipeline == o.name:
                    continue
                if yields and self._paced_critical(rnd, state.pipelines[task.pipeline]):
                    continue
                if task.kind == "stage":
                    shrink.setdefault(task.pipeline, set()).add(d)
                elif task.kind == "replica" and task.replica is not None:
                    replicas.add(task.replica)
        for q, devs in shrink.items():
            qv = state.pipelines[q]
            if qv.running_stage is None or not qv.running_stage.resizable:
                continue
            base = rnd.stage_devices(qv)
            new = tuple(x for x in base if x not in devs)
            if len(new) < state.cost.stage_min_gang(qv.model, qv.running_stage.stage):
                new = ()  # what is left cannot hold its state: it pauses until devices free up
            if new != base:
                rnd.resize(out, qv, new)
                # devices a pending resize claimed but the stage never ran on are released at
                # once (both executors): this round's gangs may take them
                rnd.free.update(d for d in base if d not in new and d not in qv.running_stage.devices)
        if self.config.migration:
            for rid in sorted(replicas):
                self._evict_replica(rnd, state.replicas.get(rid), out)

    def _evict_replica(self, rnd, src, out) -> None:
        """Move a borrowed replica's requests to a sibling with room, then retire it. The
        room counts what this round's earlier moves send the sibling (``rnd.moved_in``):
        the engines' reports do not show them yet."""
        if src is None or src.retiring or src.id in rnd.gone:
            return
        p = rnd.state.pipelines[src.pipeline]
        ctx = sum(r.kv_tokens for r in src.requests) if src.load else 0
        moved = rnd.moved_in
        for dst in sorted((r for r in p.replicas if r is not src and not r.retiring and r.id not in rnd.gone),
                          key=lambda r: r.load + moved.get(r.id, (0, 0.0))[0]):
            n_in, kv_in = moved.get(dst.id, (0, 0.0))
            if dst.load + n_in + src.load <= dst.max_seqs and dst.kv_tokens + kv_in + ctx <= 0.9 * dst.kv_capacity:
                out.append(RetireReplica(src.id))
                if src.load:
                    out.append(Migrate(src.id, dst.id))
                    moved[dst.id] = (n_in + src.load, kv_in + ctx)
                rnd.gone.add(src.id)
                return

    def _micro_batch_s(self, state, p, stage, g) -> float:
        rs = p.running_stage
        mbs = rs.micro_batches if rs is not None else _MICRO_BATCHES
        return self._stage_s(state, p, stage, g) / max(1, mbs)

    def _grow_stages(self, rnd, out) -> None:
        """Running stages take the free devices left, furthest-from-completion first: their
        own home devices, then devices lent for at least a micro-batch. With ``loans`` off
        and ``critical_loans`` on, only the critical pipeline's stage grows, and onto the
        devices ``lend_to_critical`` lends it; with ``grow_at_home``, the others onto their
        own home's free devices alone."""
        state, cfg = rnd.state, self.config
        lending = cfg.multiplex and (cfg.loans or cfg.critical_loans)
        running = [p for p in state.order if p.running_stage is not None and p.running_stage.resizable
                   and p.running_stage.micro_batches_left >= 2
                   and (cfg.grow_at_home or self._stage_may_grow(rnd, p))]
        running.sort(key=lambda p: (-self._completion_s(rnd, p), p.index))
        for p in running:
            if not rnd.free:
                return
            rs = p.running_stage
            base = rnd.stage_devices(p)
            if not base:
                continue  # paused: served as a "resume" demand
            home = set(rnd.share[p.name])
            own = [d for d in sorted(rnd.free) if d in home]
            g0 = len(base)
            lend = []
            if lending and self._stage_may_grow(rnd, p):
                lend = self._lendable(rnd, p, self._micro_batch_s(state, p, rs.stage, g0 + len(own) + 1),
                                      training=not cfg.loans)
            add = self._on_trainer_site(state, own + [d for d in lend if d not in home])
            if not add:
                continue
            left = rs.micro_batches_left - 1  # the one in progress keeps its width
            now = left * self._layout_s(state, p, rs.stage, base) / rs.micro_batches
            grown_set = self._packed(rnd, p, rs.stage, tuple(base) + tuple(self._affinity(rnd, p, add, "train")),
                                     keep=base)
            add = [d for d in grown_set if d not in base]
            if not add:
                continue
            switch = state.cost.context_switch_s(p.model, len(add), train_state=True)
            grown = switch + left * self._layout_s(state, p, rs.stage, grown_set) / rs.micro_batches
            if now - grown <= switch:
                continue
            rnd.resize(out, p, grown_set)
            rnd.free.difference_update(add)

    def _resume_devices(self, rnd, p) -> tuple:
        rs = p.running_stage
        own = [d for d in sorted(rnd.free) if d in set(rnd.share[p.name])]
        lend = self._lendable(rnd, p, self._micro_batch_s(rnd.state, p, rs.stage, max(1, len(own))))
        devs = self._on_trainer_site(rnd.state, own + [d for d in lend if d not in own])
        if len(devs) < rnd.state.cost.stage_min_gang(p.model, rs.stage):
            return ()  # too few to hold its state: it stays paused
        devs = list(self._packed(rnd, p, rs.stage, devs))
        return self._no_slower_gang(rnd, p, rs.stage, devs) or tuple(self._affinity(rnd, p, devs, "train"))

    def _on_trainer_site(self, state, devices: list) -> list:
        """``devices`` a training stage may take: those on the trainer's site where the pool
        is heterogeneous and ``cost_aware`` (a gang priced at its slowest class should not
        reach a spot or remote worker), all of them otherwise."""
        if not self._cost_aware(state):
            return devices
        site = trainer_site(state)
        return [d for d in devices if d in site]

    # ---- migration --------------------------------------------------------------------
    def _consolidate_tails(self, rnd, out) -> None:
        """Move a tail replica's requests to a sibling and retire it, when that pays.

        Pricing a move reads the predicted drain of every live replica of the pipeline,
        which gathers and predicts all of its requests (most of a decide round's state
        build). Checks on what a live system sees come first, so that a pipeline none of
        whose tails could move is not read: a multi-turn pipeline whose open steps have
        most of their samples still generating (a replica with few requests then is one
        whose samples wait on tools or on their next turn, not a rollout tail), and a tail
        no sibling could take (batch or KV full)."""
        state = rnd.state
        if not self.config.multiplex and not any(p.next_stage for p in state.order):
            return  # freed devices would only be lent, and lending is off
        cfg = self.config
        extra = rnd.moved_in  # replica -> (requests, KV tokens) moved to it this round
        for p in state.order:
            if cfg.reprice_on_change and not p.requests_changed:
                continue  # its tails as they were when last priced, a little further on
            live = [r for r in p.replicas if not r.retiring and r.load and r.id not in rnd.gone]
            if len(live) < 2:
                continue
            open_steps = [s for s in p.steps.values() if s.gen_done < s.samples]
            if (p.lengths.turns > 1.0 and open_steps
                    and 2 * sum(s.gen_done for s in open_steps) < sum(s.samples for s in open_steps)):
                continue  # most of its trajectories are still generating: not a rollout tail yet
            tails = self._movable_tails(live)
            if not tails:
                continue  # no replica in its tail that could move: nothing to price (or predict)
            used: set = set()
            # predicted drains, read as the pricing needs them: a tail's own first, every
            # live replica's only once a sibling passes the re-prefill check (most tails
            # are too short to pay for any move: their siblings' drains are not read)
            # the last pipeline's freed devices serve only its own widened tails: a move
            # may not stretch its generation at all (``idle_spread``)
            ends = _Ends(0.0 if self._last_left(state, p) else self._slack(rnd, p))
            widths = {r.tp for r in live}
            # the pipeline critical_spread serves: no merge makes a replica it would spread
            crowd = {w: self._crowd_at(rnd, p, w) for w in widths}
            for src in sorted(tails, key=lambda r: r.load):
                if src.id in used:
                    continue
                move = self._price_move(state, p, src, live, ends, extra, used, widths, crowd)
                if move is None:
                    continue
                dst, end = move
                out.append(RetireReplica(src.id))
                out.append(Migrate(src.id, dst.id))
                rnd.gone.add(src.id)
                n_in, kv_in = extra.get(dst.id, (0, 0.0))
                extra[dst.id] = (n_in + src.load, kv_in + src.kv_tokens)
                ends.moved(src, dst, end)
                used.update((src.id, dst.id))
                rnd.free.update(src.devices)

    def _movable_tails(self, live) -> list:
        """The replicas of ``live`` in their tail (none queued, at most ``tail_requests``)
        that some sibling has batch and KV room for, by the engines' reports (siblings
        only fill up within a round)."""
        limit = self.config.tail_requests
        out = []
        for r in live:
            if r.queued:
                continue
            k = r.load
            if k > limit:
                continue
            kv = r.kv_tokens
            for d in live:
                if d is not r and d.running + k <= d.max_seqs and d.kv_tokens + kv <= 0.9 * d.kv_capacity:
                    out.append(r)
                    break
        return out

    def _price_move(self, state, p, src, live, ends: _Ends, extra, used, widths, crowd: int | None = None):
        """The sibling to move ``src``'s requests to and the move's projected end, or None.
        ``ends``: the pipeline's drains this round (moves made this round set theirs);
        ``extra``: requests and KV tokens this round's moves send each replica;
        ``widths``: the tensor-parallel widths of ``live``.

        Every early exit below turns away only what the full pricing (each destination's
        two step times, end and cost) would turn away too: each compares a figure that
        can only understate the full one (IEEE addition and multiplication are monotone)."""
        cost, cfg = state.cost, self.config
        # the engine's own reports (its request count and KV use), not its request views,
        # whose KV sum differs from ``kv_tokens`` by well under 1%
        k, ctx = src.load, src.kv_tokens
        src_dev_s = ends.of(src) * src.tp
        # the re-prefill depends on the destination's width only: priced once per width, and
        # a tail whose freed device-seconds do not cover min_gain x the re-prefill onto any
        # width is turned away before the siblings are looked at (the loop below would
        # turn each away by the same comparison)
        gain, prefill_of, pays = cfg.min_gain, {}, False
        for w in widths:
            pre = prefill_of[w] = cost.migration_s(p.model, w, ctx)
            if not src_dev_s < gain * pre * w:
                pays = True
        if not pays:
            return None
        src_left = bound = top = src_work = None
        # the slowest a destination's step can be after the move is at least the step of
        # the tail's own batch and KV alone on its width (a step never gets faster with
        # more sequences or KV), and its longest request runs at least the tail's longest:
        # a width on which even that ends past the bound takes no destination (``hopeless``:
        # most tails at 1024 GPUs, whose siblings then need no look), and a destination
        # whose move would end past it at its own longest is turned away before its two
        # step times are priced
        step_floor: dict = {}
        hopeless: set = set()
        best = None
        for dst in live:
            if dst is src or dst.id in used:
                continue
            n_in, kv_in = extra.get(dst.id, (0, 0.0))
            n = dst.running + n_in
            if n + k > dst.max_seqs or dst.kv_tokens + kv_in + ctx > 0.9 * dst.kv_capacity:
                continue
            if crowd is not None and crowd.get(dst.tp) is not None and n + k >= crowd[dst.tp]:
                continue  # ``critical_spread`` would spread it again
            w = dst.tp
            prefill = prefill_of[w]
            # a step never gets faster with more sequences or KV (new >= old), so the move
            # costs at least its re-prefill: priced before the two step times
            if src_dev_s < cfg.min_gain * prefill * w:
                continue
            if bound is None:
                bound, top = ends.latest(live)
                src_left = src.predicted_tokens_left
            floor = step_floor.get(w)
            if floor is None:
                floor = step_floor[w] = cost.decode_step_s(p.model, w, k, ctx)
                if prefill + src_left * floor > bound:
                    hopeless.add(w)
                    if len(hopeless) == len(widths):
                        return best  # no destination of any width can pass (None: see above)
            if w in hopeless:
                continue
            dst_left = dst.predicted_tokens_left
            others = next((e for i, e in top if i not in (src.id, dst.id)), 0.0)
            if max(prefill + max(src_left, dst_left) * floor, others) > bound:
                continue  # would stretch the pipeline's generation beyond its slack (end >= this)
            # each step priced at the KV its requests hold halfway through their predicted
            # work, not now: early in a long step the KV grows many times over, and
            # merged replicas read twice the growth each step
            if src_work is None:
                src_work = src.predicted_work_tokens
            dst_work = dst.predicted_work_tokens
            new = cost.decode_step_s(p.model, w, n + k, dst.kv_tokens + kv_in + ctx + (src_work + dst_work) / 2)
            end = prefill + max(src_left, dst_left) * new
            if max(end, others) > bound:
                continue  # would stretch the pipeline's generation beyond its slack
            old = cost.decode_step_s(p.model, w, max(1, n), dst.kv_tokens + kv_in + dst_work / 2)
            move_dev_s = (prefill + (new - old) * dst_left) * w
            if src_dev_s < cfg.min_gain * move_dev_s:
                continue
            if best is None or end < best[1]:
                best = (dst, end)
        return best

    def _widen_tails(self, rnd, out) -> None:
        """Re-shard a rollout tail onto wider tensor-parallel replicas.

        A tail decodes a few long requests at small batches, where a step is bound by reading
        the weights: splitting them over more devices cuts the per-token time, which is the
        pipeline's critical path, at a device-second price. The tail's replicas are grouped
        into ``k`` groups (1, 2, 4, ...), each absorbed by one replica of width ``w`` (as
        wide as now or wider: several wide replicas where one would decode too large a
        batch); the plan whose projected end of generation is
        earliest is taken when it beats the current one by more than ``latency_slack``
        after the weight load and the re-prefill. The new replicas go on devices the
        pipeline's home has free, devices whose owners can spare them for that long, and
        (``reshard_in_place``, where the executor can) the tail's own devices.
        """
        state = rnd.state
        for p in state.order:
            # replicas retired earlier in this round have their devices back in ``free``
            live = [r for r in p.replicas if not r.retiring and r.id not in rnd.gone]
            if not p.generating or not live or p.pending or any(r.queued for r in live):
                continue
            load = sum(r.load for r in live)
            if load == 0 or load > self.config.widen_requests:
                continue
            if self.config.priority and self._completion_s(rnd, p) < (1 - self.config.latency_slack) * self._critical_s(rnd):
                continue  # not on the critical path: the devices are worth more elsewhere
            now_end = max(r.predicted_drain_s() for r in live)
            beat = now_end * (1 - self.config.latency_slack)
            if self._widen_floor_s(state, p, live) >= beat:
                continue  # no re-shard could end sooner: not worth gathering devices for
            pool = [d for d in rnd.home[p.name][0] if d in rnd.free]
            if self.config.borrow:
                pool += [d for d in self._lendable(rnd, p, now_end) if d not in pool]
            # a projection (the observed pace): without the look-ahead, free devices only (greedy
            # gangs then start narrow, and a tail holding its devices wide starved (a)'s PPO agent: 2787 s)
            critical = self.config.lookahead and self._near_critical(rnd, p)
            in_place = self.config.reshard_in_place and state.reshard_in_place and critical
            best = self._widen_plan(rnd, p, live, pool, in_place, beat, spread=critical)
            if best is None:
                continue
            for devs, group in best:
                out.append(LaunchReplica(p.name, devs, absorb=tuple(r.id for r in group)))
                rnd.gone.update(r.id for r in group)
                for r in group:
                    rnd.free.update(r.devices)
                rnd.free.difference_update(devs)  # after: a re-shard in place takes some of them

    def _widen_floor_s(self, state, p, live) -> float:
        """A floor under every re-shard plan's projected end: the longest predicted request
        alone at batch 1 with no KV on the fastest width a plan may use (a step never gets
        faster with more sequences or KV; the switch and re-prefill only add)."""
        widths = self._widen_widths(state, p, live)
        if not widths:
            return _INF
        left = max(r.predicted_tokens_left for r in live)
        return left * min(state.cost.decode_step_s(p.model, w, 1, 0.0) for w in widths)

    def _widen_widths(self, state, p, live) -> list:
        """The widths a re-shard of ``live`` may use: theirs, doubled up to a node or
        ``max_widen``, those vLLM can shard ``p``'s model over."""
        widths, w = [], max(r.tp for r in live)
        while w <= min(state.gpus_per_node, self.config.max_widen):
            if p.model.fits_tp(w):
                widths.append(w)
            w *= 2
        return widths

    def _widen_plan(self, rnd, p, live, pool, in_place: bool, beat: float, spread: bool = True):
        """The fastest re-shard of ``live`` ending before ``beat`` seconds from now: a list of
        (devices, absorbed replicas), one per new replica, or None."""
        state, cost = rnd.state, rnd.state.cost
        width = max(r.tp for r in live)
        # the engines' KV reports, not request views (within 0.2% of their sum; no rows built)
        ctx = {r.id: r.kv_tokens for r in live}
        best, best_key = None, None
        room = len(pool) + (sum(r.tp for r in live) if in_place else 0)
        longest = max(r.predicted_tokens_left for r in live)
        for w in self._widen_widths(state, p, live):
            switch = cost.context_switch_s(p.model, w, train_state=False)
            # every plan of width w ends no sooner than the switch and the longest request
            # alone at batch 1 with no KV (the group holding it pays its re-prefill too, and a
            # step never gets faster with more sequences or KV; IEEE addition and
            # multiplication are monotone): a width that cannot beat ``beat`` prices no plan
            if switch + longest * cost.decode_step_s(p.model, w, 1, 0.0) >= beat:
                continue
            k = 1
            while k <= (len(live) if spread else 1) and k * w <= room:
                if w == width and k >= len(live):
                    break  # as wide and as many: no change
                groups = _balanced_groups(live, k)
                plan, taken, end = [], set(), 0.0
                spare = list(pool)
                for j, group in enumerate(groups):
                    # free devices, and the devices of replicas absorbed by this or an earlier group
                    own = [d for g in groups[:j + 1] for r in g for d in r.devices] if in_place else []
                    avail = [d for d in spare + own if d not in taken]
                    devs = self._node_group(rnd, p, avail, w)
                    if not devs:
                        plan = None
                        break
                    taken.update(devs)
                    spare = [d for d in spare if d not in taken]
                    n = sum(r.load for r in group)
                    c = sum(ctx[r.id] for r in group)
                    left = max(r.predicted_tokens_left for r in group)
                    end = max(end, switch + cost.migration_s(p.model, w, c) + _tail_s(cost, p.model, w, n, c, left))
                    plan.append((devs, group))
                k *= 2  # 1, 2, 4, ... replicas: the plans a round prices stay few
                if not plan or end >= beat:
                    continue
                key = (end, len(taken))
                if best_key is None or key < best_key:
                    best, best_key = plan, key
        return best

    # ---- admission limits ----------------------------------------------------------------
    def _launch_limits_of(self, rnd, p, widths) -> dict:
        """Width -> the batch limit a replica of ``p`` that width starts with
        (``admission.launch_limit`` on the pipeline's recent finished first turns; None: no
        limit: nothing observed yet, or the engine's own is lower)."""
        state = rnd.state
        if p.history is None:
            return {}
        lengths = p.history.recent_lengths(0)
        out = {}
        for w in set(widths):
            n = launch_limit(lengths, p.lengths.prompt_tokens, state.cost.kv_capacity_tokens(p.model, w))
            out[w] = n if n is not None and n < state.max_num_seqs else None
        return out

    def _limit_before_start(self, rnd, p, live, out) -> None:
        """A step's requests reach the pipeline's live replicas as it starts, and an engine
        admits what fits at once: each gets the launch limit of its width first."""
        limits = self._launch_limits_of(rnd, p, [r.tp for r in live])
        ended = _ended(out)
        for r in live:
            if r.id in ended:
                continue
            n = limits.get(r.tp)
            if n != _limit_of(r, rnd.state.max_num_seqs):
                out.append(AdmissionLimit(r.id, n))

    def _limit_admission(self, rnd, out) -> None:
        """Each replica with requests waiting admits them only while the expected KV peak
        of what it then runs stays within its cache (``admission.fitting`` on the
        requests' predicted remaining tokens, spread as the pipeline's recent lengths;
        below its running sequences where they alone outgrow it, ``shed_admission``); a
        replica whose requests would all fit even at the pipeline's mean final context is
        not read (no prediction asked): no sequence's expected KV peak exceeds that mean."""
        state = rnd.state
        top = state.max_num_seqs
        ended = _ended(out)
        for p in state.order:
            final = p.lengths.context_tokens  # mean tokens a trajectory holds at its end
            shape = _UNSET
            for r in p.replicas:
                if r.retiring or r.id in ended or not r.queued or r.id in rnd.moved_in:
                    continue
                if r.load * final <= r.kv_capacity:
                    if _limit_of(r, top) is not None:
                        out.append(AdmissionLimit(r.id, None))
                    continue
                views = r.requests
                held = np.fromiter((q.context_tokens + q.generated for q in views), float, len(views))
                left = np.fromiter((q.predicted_remaining for q in views), float, len(views))
                running = sum(1 for q in views if not q.queued)
                if shape is _UNSET:
                    shape = spread_of(p.history.recent_lengths()) if p.history is not None else None
                n = fitting(held, left, r.kv_capacity, shape, self.config.admission_margin_sd)
                if n < running and not self.config.shed_admission:
                    n = running  # the running set overflows; admit nothing more, shed nothing
                limit = None if n >= min(top, len(views)) else max(1, n)
                if limit != _limit_of(r, top):
                    out.append(AdmissionLimit(r.id, limit))

    # ---- placement --------------------------------------------------------------------
    def _affinity(self, rnd, p, devices, kind) -> list:
        state = rnd.state
        home = set(rnd.home[p.name][0 if kind == "rollout" else 1])

        def key(d):
            dev = state.devices[d]
            resident = p.name in dev.resident if kind == "rollout" else dev.train_resident == p.name
            return (d not in home, not resident, d)

        return sorted(devices, key=key)

    def _node_group(self, rnd, p, devices, w) -> tuple:
        """``w`` of ``devices`` on one node (tensor-parallel groups stay within a node),
        preferring the pipeline's home and resident devices; () when no node has ``w``. A
        width wider than a node (a spec's ``rollout_tp``, or a model no node holds) takes
        whole nodes, as its replicas at launch do."""
        by_node = self._by_node(rnd.state, self._affinity(rnd, p, devices, "rollout"))
        gpn = max(1, rnd.state.gpus_per_node)
        if w > gpn:
            whole = [ds for ds in by_node.values() if len(ds) == gpn]
            if w % gpn or len(whole) < w // gpn:
                return ()
            return tuple(d for ds in whole[:w // gpn] for d in ds)
        for node in sorted(by_node, key=lambda n: -len(by_node[n])):
            if len(by_node[node]) >= w:
                return tuple(by_node[node][:w])
        return ()

    @staticmethod
    def _pass_tokens(p, stage) -> int:
        """The tokens ``stage`` of the step to train next reads: a forward pass what early
        passes did not read, an update the whole batch."""
        s = p.steps[p.train_next]
        return s.tokens - s.covered.get(stage, 0) if stage in FORWARD_STAGES else s.tokens

    def _stage_s(self, state, p, stage, g) -> float:
        """The pass's time on ``g`` devices (infinite on fewer than hold its state)."""
        price = state.cost.forward_s if stage in FORWARD_STAGES else state.cost.train_s
        return price(p.model, g, self._pass_tokens(p, stage))

    def _layout_s(self, state, p, stage, devices) -> float:
        """The pass's time on exactly ``devices``: in the sharding layouts their nodes allow
        (hybrid sharding needs node-local groups, ``CostModel.shard_sizes``), where
        ``_stage_s`` prices a width as it would be placed at best."""
        price = state.cost.forward_s if stage in FORWARD_STAGES else state.cost.train_s
        return price(p.model, len(devices), self._pass_tokens(p, stage), nodes=self._nodes(state, devices))

    @staticmethod
    def _by_node(state, devices) -> dict:
        """``devices`` grouped by node, each group in the order given."""
        by_node: dict[int, list] = {}
        for d in devices:
            by_node.setdefault(state.devices[d].node, []).append(d)
        return by_node

    def _nodes(self, state, devices) -> tuple:
        """``devices``' count on each node they span (``CostModel.train_s``'s ``nodes``)."""
        return tuple(len(ds) for ds in self._by_node(state, devices).values())

    def _packed(self, rnd, p, stage, devices, keep=()) -> tuple:
        """Of ``devices`` (in the order given, best first), the gang that runs the pass
        soonest, fewer devices on a tie: all of them, or for each hybrid shard size ``s``,
        the multiples of ``s`` each node holds, in node-local groups (a gang that cannot form
        them shards over all its devices, across the node NICs, which fewer devices in
        groups can beat). ``keep``: devices the gang holds already and keeps (a growing
        stage); a size whose groups would drop one of them is skipped."""
        state = rnd.state
        devices = tuple(devices)
        if len(devices) <= 1 or not state.cost.f.hybrid_shard:
            return devices
        by_node = self._by_node(state, devices)
        held = set(keep)
        best_t, best = self._layout_s(state, p, stage, devices), devices
        top = min(max(1, state.gpus_per_node), len(devices) - 1)
        for size in range(top, state.cost.stage_min_gang(p.model, stage) - 1, -1):
            kept = set()
            for ds in by_node.values():
                kept.update(ds[:len(ds) // size * size])
            if not kept or held - kept or len(kept) == len(devices):
                continue
            sub = tuple(d for d in devices if d in kept)
            t = self._layout_s(state, p, stage, sub)
            if t < best_t * (1 - 1e-9) or (t <= best_t * (1 + 1e-9) and len(sub) < len(best)):
                best_t, best = t, sub
        return best

    def _take(self, rnd, p, stage, devices, g: int) -> tuple:
        """``g`` of ``devices`` placed for the layout ``_stage_s`` assumes of that width: in
        whole node-local groups of its hybrid shard size, the nodes with the most of
        ``devices`` first; the first ``g`` where the whole gang shards (or no groups fit)."""
        state = rnd.state
        devices = list(devices)
        cost = state.cost
        update = stage not in FORWARD_STAGES
        price = cost.forward_s if not update else cost.train_s
        tokens = self._pass_tokens(p, stage)
        size = min(cost.shard_sizes(p.model, g, update),
                   key=lambda x: (price(p.model, g, tokens, nodes=(x,) * (g // x)), -x))
        if size >= g:
            return tuple(devices[:g])
        out: list = []
        for ds in sorted(self._by_node(state, devices).values(), key=len, reverse=True):
            n = min(len(ds) // size * size, g - len(out))
            out += ds[:n // size * size]
            if len(out) == g:
                return tuple(out)
        return tuple(devices[:g])

    # ---- early forward passes ---------------------------------------------------------------
    def _early_passes(self, rnd, out) -> None:
        """Run a forward pass over a generating step's finished trajectories on devices left
        free this round (its home's, then devices lent for as long as its rollout is
        projected to run), once the rollout is down to its tail or, under
        ``early_in_reward_wait``, the step waits on its rewards (for as long as
        ``_reward_wait_s`` projects), for a pipeline on the job set's critical path at its
        observed pace. The stage's own pass after the tail then
        reads only the rest: the step's chain shortens by what was read early, on devices
        that would otherwise wait for the tail. The narrowest gang that reads all the
        finished tokens before the rollout is projected to end; else every free device,
        reading what it can by then (a pass still running when the batch is complete would
        hold the stage back), if that is at least ``early_min_fixed`` times the pass's
        fixed cost."""
        state, cfg = rnd.state, self.config
        for p in state.order:
            s = p.steps.get(p.train_next)
            if (p.done or p.stage_running or p.alongside_stage is not None or not rnd.free or s is None
                    or s.rewarded >= s.samples
                    or s.gen_done < cfg.early_from * s.samples):
                continue
            stage = self._early_stage(p, s)
            tp = rollout_tp(p, state.cost)
            if stage is None or len(rnd.free) < tp or not self._in_tail(p):
                continue
            if not self._paced_critical(rnd, p):
                continue  # a pipeline off the critical path would take devices the critical one could use
            in_tools = s.samples - s.gen_done > p.load()
            if in_tools and not cfg.early_in_tool_calls:
                continue  # trajectories in tool calls come back for their next turn: not a tail
            # the rollout's projected end reads its requests' predictions: only now; a step
            # generated in full waits on its rewards for about as long as its earlier steps did
            drain = max((r.predicted_drain_s() for r in p.replicas), default=0.0)
            if in_tools:  # ... and one with trajectories in tool calls waits on them too
                drain = max(drain, self._tool_calls_left_s(p))
            if cfg.early_in_reward_wait:
                drain = max(drain, self._reward_wait_s(p, state.t))
            home = set(rnd.share[p.name])
            pool = [d for d in sorted(rnd.free) if d in home]
            pool += [d for d in self._lendable(rnd, p, drain) if d not in home]
            pool = self._on_trainer_site(state, pool)
            need = state.cost.stage_min_gang(p.model, stage)
            if len(pool) < max(tp, need):
                continue  # fewer devices than hold the model's weights
            tokens = s.finished_tokens - s.covered.get(stage, 0)
            price = lambda g, n: state.cost.forward_s(p.model, g, n)
            fixed = state.cost.f.train_stage_overhead_s
            # the narrowest gang that reads them all before the rollout is projected to end
            # (a pass's fixed cost is paid per device); else all free devices, reading what
            # they can by then (a pass still running when the batch is complete would hold
            # the stage back), if that is worth a pass's fixed cost
            g = next((g for g in range(need, len(pool) + 1) if price(g, tokens) <= drain), 0)
            chunk = tokens
            if not g:
                g = len(pool)
                chunk = int(tokens * (drain - fixed) / max(1e-9, price(g, tokens) - fixed))
                if chunk <= 0 or price(g, chunk) - fixed < cfg.early_min_fixed * fixed:
                    continue
            devs = tuple(self._affinity(rnd, p, pool, "train")[:g])
            out.append(RunStage(p.name, p.train_next, stage, devs, colocated=False, early=True,
                                tokens=0 if chunk >= tokens else chunk))
            rnd.free.difference_update(devs)

    def _paced_finish_t(self, p) -> float | None:
        """When ``p`` is projected to finish its run at the pace of its steps so far (the
        wall time its trained steps took, observed; None before its first step is trained).
        The clock is the start of the next step to train's generation: a synchronous step's
        starts once every step before it is trained; an asynchronous one's under staleness
        ``s`` once all but the last ``s`` are (it generates ``s`` steps ahead), so those
        ``s`` are not counted (counted, a pipeline at staleness 1 whose second step started
        at t = 0 was projected to finish at 0, and off the critical path)."""
        s = p.steps.get(p.train_next)
        trained = p.train_next - self.staleness_bound(p)
        if p.done or trained <= 0 or s is None:
            return None
        return s.gen_start_t * p.total_steps / trained

    def _paced_critical(self, rnd, p) -> bool:
        """``p`` is projected, at its observed pace, to finish within ``latency_slack`` of
        the last of the pipelines: its chain is the job set's makespan. Before its first
        step ends (no pace), with ``predicted_pace``: ``p`` is the one pipeline projected
        to finish clearly last (``_predicted_last``)."""
        mine = self._paced_finish_t(p)
        if mine is None:
            return self._predicted_last(rnd) is p
        return mine >= (1 - self.config.latency_slack) * self._paced_last(rnd)

    def _predicted_last(self, rnd):
        """With ``predicted_pace``: the pipeline with no pace observed yet whose projected
        finish (``_projected_finish_t``) is past every other pipeline's by more than
        ``max_slack``, or None. Once a round."""
        if rnd.predicted_last is not _UNSET:
            return rnd.predicted_last
        rnd.predicted_last = None
        if not self.config.predicted_pace:
            return None
        left = [q for q in rnd.state.order if not q.done]
        if not any(self._paced_finish_t(q) is None for q in left):
            return None  # every pipeline has a pace
        top = max(left, key=lambda q: self._projected_finish_t(rnd, q))
        rest = max((self._projected_finish_t(rnd, q) for q in left if q is not top), default=0.0)
        if self._paced_finish_t(top) is None and self._projected_finish_t(rnd, top) > (1 + self.config.max_slack) * rest:
            rnd.predicted_last = top
        return rnd.predicted_last

    def _projected_finish_t(self, rnd, p) -> float:
        """When ``p`` is projected to finish its run: at its observed pace
        (``_paced_finish_t``); before its first step ends, now plus the rest of its step and
        its later steps at the rate its observed lengths give on its static share
        (``gen_estimate_s``, ``train_estimate_s``; the step's rest is its projected length
        less the time since its generation started). No length prediction is read: every
        round asks for every pipeline's. Once a round a pipeline."""
        got = rnd.projected.get(p.name)
        if got is not None:
            return got
        got = self._paced_finish_t(p)
        if got is None:
            t = rnd.state.t
            train, per_step = self._step_on_share_s(rnd.state, p)
            s = p.steps.get(p.train_next)
            since = t - s.gen_start_t if s is not None else 0.0
            later = max(0, p.total_steps - p.train_next - 1)
            got = t + max(train, per_step - since) + later * per_step
        rnd.projected[p.name] = got
        return got

    def _paced_last(self, rnd) -> float:
        """The latest projected finish of the pipelines at their observed paces (once a
        round: _lendable asks for every free device's owner), or the projected finish of
        the pipeline projected to finish clearly last (``_predicted_last``)."""
        if rnd.paced_last is None:
            rnd.paced_last = max((f for q in rnd.state.order if (f := self._paced_finish_t(q)) is not None),
                                 default=0.0)
            top = self._predicted_last(rnd)
            if top is not None:
                rnd.paced_last = max(rnd.paced_last, self._projected_finish_t(rnd, top))
        return rnd.paced_last

    def _near_critical(self, rnd, p) -> bool:
        """``p`` may be on the job set's critical path: before its first step ends (no pace
        observed yet), or projected at its observed pace to finish within ``max_slack`` of
        the last of the pipelines."""
        mine = self._paced_finish_t(p)
        return mine is None or mine >= (1 - self.config.max_slack) * self._paced_last(rnd)

    def _in_tail(self, p) -> bool:
        """The rollout is down to its tail (the engines' loads say so): ``widen_requests``
        or fewer requests in all, the devices of the rest free from here on."""
        return sum(r.load for r in p.replicas if not r.retiring) + p.pending <= self.config.widen_requests

    def _early_stage(self, p, s) -> str | None:
        """The first forward stage (before any stage that needs the whole batch) with enough
        finished tokens its early passes have not read."""
        for stage in early_stages(p.stages):
            if s.finished_tokens - s.covered.get(stage, 0) >= self.config.early_chunk * max(1, s.finished_tokens):
                return stage
        return None

    def _gang(self, rnd, p, unnarrowed: bool = False) -> tuple:
        """The devices ``p``'s next stage starts on now, () to wait; ``unnarrowed``: every
        device the look-ahead would start it with, before the width rules narrow it."""
        state, free = rnd.state, rnd.free
        stage = p.next_stage
        home = rnd.home[p.name][1]
        home_free = [d for d in home if d in free]
        if stage == "weight_sync":
            devs = home_free or self._lendable(rnd, p, 5.0)
            return tuple(self._affinity(rnd, p, devs, "train")[:1])
        if not self.config.resize:
            return tuple(home) if len(home_free) == len(home) else ()
        room = self._rollout_room(rnd, p)
        if room:  # the rollout's part of the home stays free for it (async_reserve)
            leave = set(self._affinity(rnd, p, home_free, "rollout")[:room])
            home = [d for d in home if d not in leave]
            home_free = [d for d in home_free if d not in leave]
        loans = self.config.loans
        # with micro-batch loans a loan need only last one micro-batch: its owner reclaims it
        # at a boundary; without, it must outlast the whole stage
        g_est = max(1, len(home))
        duration = (self._micro_batch_s(state, p, stage, g_est) if loans else self._stage_s(state, p, stage, g_est))
        lent = self._lendable(rnd, p, duration, training=True)
        home, lent, home_free = (self._on_trainer_site(state, x) for x in (home, lent, home_free))
        now = home_free + [d for d in lent if d not in home_free]
        if not self.config.lookahead:
            return tuple(now) if len(now) >= state.cost.stage_min_gang(p.model, stage) else ()
        # look-ahead: start now with what is free (and, with loans, grow at the first
        # micro-batch boundary onto the home devices free by then), or wait for the i-th
        # busy home device and start bigger; pick the earliest projected end
        later = sorted(self._busy_for_s(state, d) for d in home if d not in free)
        best = None
        for i in range(0, min(len(later), self.config.width - 1) + 1):  # ``width`` candidate plans
            wait = later[i - 1] if i else 0.0
            if wait > self.config.horizon_s:
                break
            g = len(now) + i
            if g == 0:
                continue
            whole = self._gang_s(rnd, p, stage, g)
            if whole == _INF:
                continue  # too few devices to hold the pass's state
            end = wait + whole
            if loans and i == 0:
                first = self._micro_batch_s(state, p, stage, g)
                joined = sum(1 for x in later if x <= first)
                rest = (_MICRO_BATCHES - 1) / _MICRO_BATCHES
                end = min(end, first + rest * self._stage_s(state, p, stage, g + joined))
            if best is None or end < best[0] - 1e-9:
                best = (end, i)
        if best is None or best[1] > 0:
            return ()  # waiting for busy home devices finishes sooner
        if self.config.wait_for_freed and self._freed_soon_sooner(rnd, p, stage, len(now), later, best[0]):
            return ()  # waiting for devices that free up soon, and that no one takes back, finishes sooner
        if unnarrowed:
            return tuple(self._affinity(rnd, p, now, "train"))
        narrow = self._no_slower_gang(rnd, p, stage, now)
        if narrow:
            return narrow
        if self.config.idle_spread and all(o.done for o in state.order if o is not p):
            narrow = self._fastest_gang(rnd, p, stage, now, best[0])
            if narrow:
                return narrow
        return self._packed(rnd, p, stage, self._affinity(rnd, p, now, "train"))

    def _freed_soon_sooner(self, rnd, p, stage, g: int, home_later: list, end_now: float) -> bool:
        """``wait_for_freed``: a gang of the ``g`` devices free to ``p`` now, projected to
        end at ``end_now`` (seconds from now), would end past the job set's projected
        finish (``_paced_last``: the latest at the observed paces), so would move it, and
        later than one that waits for the first k of the busy devices outside its home whose
        owner has finished (or never had them) and starts on those, the ``g`` and the home
        devices free by then, by ``wait_gain``. The look-ahead's candidates wait for home
        devices only; these devices go to whoever is ready when they free up, and a pass
        started on a narrow home grows onto them only at its first micro-batch boundary.
        Off the critical path the rule measured chaotic (docs/simulator.md)."""
        state = rnd.state
        if state.t + end_now <= self._paced_last(rnd):
            return False  # the narrow start does not move the job set's projected finish
        home = set(rnd.home[p.name][1])
        pipelines = state.pipelines
        spare = [d for d in range(len(state.devices)) if d not in rnd.free and d not in home
                 and ((o := rnd.owner.get(d)) is None or pipelines[o].done)]
        spare = self._on_trainer_site(state, spare)
        if not spare:
            return False
        total = g + len(home_later) + len(spare)
        if self._stage_s(state, p, stage, total) >= end_now:
            return False  # no wait, however long, ends sooner: the pass on all of them does not
        soon = sorted(self._busy_for_s(state, d) for d in spare)
        for k in sorted({min(len(soon), 2 ** i) for i in range(len(soon).bit_length() + 1)}):  # 1, 2, 4, ... all
            wait = soon[k - 1]
            if wait >= end_now:
                return False
            joined = sum(1 for x in home_later if x <= wait)
            if wait + self._stage_s(state, p, stage, g + joined + k) < end_now * (1 - self.config.wait_gain):
                return True
        return False

    def _run_alongside(self, rnd, p, out) -> bool:
        """``concurrent_stages``: start ``p``'s next stage (the log-prob pass, the critic's
        update) on a gang of its own and its partner (the reference pass, the actor's
        update; ``algorithms.ALONGSIDE``) beside it, the devices the look-ahead would
        start the first with split so that the later of the two ends soonest (each at its
        fastest width within its part), when that beats the two one after the other on all
        of them by ``alongside_gain``. True if it did."""
        state, cfg = rnd.state, self.config
        stage = p.next_stage
        if not (cfg.concurrent_stages and state.concurrent_stages and cfg.resize and cfg.lookahead
                and may_run_alongside(stage, p.stages, p.stage_next)):
            return False
        pool = self._gang(rnd, p, unnarrowed=True)
        n = len(pool)
        if n < 2:
            return False
        partner = p.stages[p.stage_next + 1]
        first = _prefix_fastest(self._stage_times(rnd, p, stage, n)[:n])
        second = _prefix_fastest(self._stage_times(rnd, p, partner, n)[:n])
        # (end, width of the first, width of the second) for each split k | n - k
        end, w1, w2 = min((max(first[k - 1][0], second[n - k - 1][0]), first[k - 1][1], second[n - k - 1][1])
                          for k in range(1, n))
        if end == _INF or end > (first[n - 1][0] + second[n - 1][0]) * (1 - cfg.alongside_gain):
            return False
        gpn = max(1, state.gpus_per_node)
        a = (self._node_group(rnd, p, list(pool), w1) if w1 <= gpn else ()) or self._take(rnd, p, stage, pool, w1)
        rest = [d for d in pool if d not in a]
        b = (self._node_group(rnd, p, rest, w2) if w2 <= gpn else ()) or self._take(rnd, p, partner, rest, w2)
        out.append(RunStage(p.name, p.train_next, stage, tuple(a), colocated=False, alongside=True))
        out.append(RunStage(p.name, p.train_next, partner, tuple(b), colocated=False))
        rnd.free.difference_update(a)
        rnd.free.difference_update(b)
        return True

    def _no_slower_gang(self, rnd, p, stage, devices: list) -> tuple:
        """``fastest_width``: the narrowest gang of the fastest width below ``len(devices)``
        when every one of ``devices`` would make the pass slower (few tokens a device leave
        it bound by parameter all-gathers, over the node NICs once it outgrows a node); ()
        when all of them are the fastest."""
        if not self.config.fastest_width or len(devices) < 2:
            return ()
        state = rnd.state
        full = self._stage_s(state, p, stage, len(devices))
        fastest = self._gang_s(rnd, p, stage, len(devices))
        if fastest >= full * (1 - 1e-9):
            return ()
        return self._fastest_gang(rnd, p, stage, devices, fastest)

    def _gang_s(self, rnd, p, stage, g: int) -> float:
        """The pass's time on ``g`` devices, or with ``fastest_width`` on the fastest
        gang they hold (any width up to ``g``: FSDP shards over any count)."""
        if not self.config.fastest_width:
            return self._stage_s(rnd.state, p, stage, g)
        return min(self._stage_times(rnd, p, stage, g)[:g])

    def _stage_times(self, rnd, p, stage, upto: int) -> list:
        """The pass's time on 1, 2, ... devices (index ``w - 1``), at least ``upto`` of them
        (maybe more: callers slice), each width priced once for what the pass reads: the
        look-ahead and the width rules read every width below a gang's, every round the
        stage waits."""
        key = (rnd.state.cost, p.model, stage, self._pass_tokens(p, stage))
        times = self._widths_s.get(key)
        if times is None:
            if len(self._widths_s) >= _STAGE_TIMES_KEPT:
                self._widths_s.clear()
            times = self._widths_s[key] = []
        while len(times) < upto:
            times.append(self._stage_s(rnd.state, p, stage, len(times) + 1))
        return times

    def _fastest_gang(self, rnd, p, stage, now: list, end: float) -> tuple:
        """The narrowest gang of fewer than ``now`` devices that ends no later than ``end``,
        on one node where it fits; () if none: for ``fastest_width`` (``end`` the fastest
        width's time) and for the run's last pipeline (``idle_spread``: ``end`` the
        look-ahead's best with all of them). A gang's time is not monotone in its
        width: few tokens a device leave a pass bound by its parameter all-gathers, which
        cross the node NICs once the gang outgrows a node (a 14B update over 64K tokens: 4.7 s
        on one 4-device node, 29 s on 16 devices over four). The narrowest gang that merely
        matches the whole width's end is for the last pipeline only: while others run, such
        a gang changes who gets which devices when, and measured chaotic (docs/simulator.md)."""
        gpn = max(1, rnd.state.gpus_per_node)
        for g, t in enumerate(self._stage_times(rnd, p, stage, len(now) - 1)[:len(now) - 1], 1):
            if t <= end + 1e-9:
                group = self._node_group(rnd, p, now, g) if g <= gpn else ()
                return group or self._take(rnd, p, stage, self._affinity(rnd, p, now, "train"), g)
        return ()

    def _spread_batch(self, state, p, tp: int, context: float) -> int:
        """The smallest batch at which a decoded token costs at most ``spread_cost`` x its
        cost at the engine's largest batch: replicas below it waste device-seconds."""
        cost, top = state.cost, state.max_num_seqs
        ideal = cost.decode_step_s(p.model, tp, top, top * context) / top
        b = top
        while b > 1 and cost.decode_step_s(p.model, tp, b // 2, b // 2 * context) / (b // 2) <= self.config.spread_cost * ideal:
            b //= 2
        return b

    def _wanted_replicas(self, rnd, p) -> int:
        state = rnd.state
        tp = self._bulk_tp(rnd, p)
        home = rnd.home[p.name][0]
        if not self.config.resize:
            return max(1, len(home) // tp)
        ctx = max(1.0, p.lengths.context_tokens)
        per = _batch_held(state, p.model, tp, ctx)
        outstanding = p.load() if p.generating else p.spec.samples_per_step
        want = max(math.ceil(outstanding / per), len(home) // tp, 1)
        if self._borrows() and not p.generating:
            # a step's rollout starts on more than its home: as many replicas as keep each
            # near its ideal batch (later, consolidation shrinks it as the batch thins)
            spread = min(per, self._spread_batch(state, p, tp, ctx / 2))
            if self._last_left(state, p):
                spread = min(spread, self._fast_batch(state, p, tp, ctx / 2))
            want = max(want, math.ceil(outstanding / max(1, spread)))
        return want

    def _grow_fills(self, rnd, p) -> int:
        """New replicas the requests waiting for a batch slot fill (a "grow" demand, whose
        ``LaunchReplica`` takes them: ``rebalance``): each admits as many as an engine's
        batch and KV cache hold at the context its running requests hold now, as the
        engine admits them. A replica launched beyond them starts empty and is retired the
        next round: on a synthetic mix (s21) a rollout waiting for 3,051 slots grew onto its
        whole home of 32 devices and its first three new replicas admitted them all; 4,802
        of the run's 5,066 replicas were closed so, 350 with this count (docs/simulator.md,
        "Growing a rollout")."""
        live = [r for r in p.replicas if not r.retiring]
        waiting = p.pending + sum(r.queued for r in live)
        if not waiting:
            return 0
        state, tp = rnd.state, self._bulk_tp(rnd, p)
        running = sum(r.running for r in live)
        ctx = sum(r.kv_tokens for r in live) / running if running else p.lengths.context_tokens
        return math.ceil(waiting / _batch_held(state, p.model, tp, max(1.0, ctx)))

    def _last_left(self, state, p) -> bool:
        """``p`` is the run's last unfinished pipeline, synchronous (an asynchronous one's
        next step could use the devices its rollout frees), and ``idle_spread`` is on."""
        return (self.config.idle_spread and all(o.done for o in state.order if o is not p)
                and p.spec.mode == "sync")

    def _fast_batch(self, state, p, tp: int, context: float) -> int:
        """Sequences a replica takes at the step's start under ``idle_spread``: those that
        keep its decoding batch at the size below which halving it shortens a decode step
        by less than ``idle_spread_gain`` (smaller batches buy little speed). A multi-turn
        trajectory decodes for only part of its time, the rest in tool calls (observed mean
        latency x turns after the first), so a replica takes that many more."""
        cost, b = state.cost, state.max_num_seqs
        keep = 1.0 - self.config.idle_spread_gain
        while b > 1 and cost.decode_step_s(p.model, tp, b // 2, b // 2 * context) <= keep * cost.decode_step_s(
                p.model, tp, b, b * context):
            b //= 2
        lens = p.lengths
        tools = lens.tool_s * max(0.0, lens.turns - 1.0)
        if tools <= 0.0:
            return b
        decoding = lens.generated_tokens * cost.decode_step_s(p.model, tp, b, b * context)
        return math.ceil(b * (decoding + tools) / max(decoding, 1e-9))

    def _spread_pick(self, rnd):
        """(pipeline, batch) for ``critical_spread``: the pipeline projected to finish last
        (``_projected_finish_t``: at its observed pace, or from its observed lengths; no
        length prediction is read), if it is generating and no batch of it waits to be
        trained, and the batch its replicas aim at (``_fast_batch`` at the context its
        running requests hold); None otherwise. Once a round."""
        if rnd.spread is not _UNSET:
            return rnd.spread
        rnd.spread = None
        cfg = self.config
        if not (cfg.critical_spread and cfg.migration and self._borrows()):  # borrowing needs multiplex
            return None
        state = rnd.state
        left = [q for q in state.order if not q.done]
        if not left:
            return None
        p = max(left, key=lambda q: self._projected_finish_t(rnd, q))
        if not p.generating or self._rollout_cap(rnd, p) is not None:
            return None  # its rollout is not what sets the makespan now, or a batch of it waits to be trained
        if not any(r.running for r in p.replicas if not r.retiring):
            return None
        rnd.spread = (p, self._aim_batch(rnd, p, self._bulk_tp(rnd, p)))
        return rnd.spread

    def _crowd_at(self, rnd, p, width: int) -> int | None:
        """The batch at which a width-``width`` replica of ``p`` counts as crowded, where
        ``p`` is the pipeline ``critical_spread`` serves (None otherwise): twice the batch a
        spread aims at (on that width under ``spread_in_tail``; at the launch width
        without). No tail merge leaves a replica of it that crowded: a spread would undo it."""
        pick = self._spread_pick(rnd) if self.config.critical_spread else None
        if pick is None or pick[0] is not p:
            return None
        return 2 * (self._aim_batch(rnd, p, width) if self.config.spread_in_tail else pick[1])

    def _aim_batch(self, rnd, p, width: int) -> int:
        """The batch a spread of ``p`` (the pipeline ``critical_spread`` serves) aims at on
        a width-``width`` replica (``_fast_batch`` at the context its running requests
        hold), once a round per width."""
        got = rnd.aim.get(width)
        if got is None:
            ctx = _running_context([r for r in p.replicas if not r.retiring])
            got = rnd.aim[width] = self._fast_batch(rnd.state, p, width, ctx)
        return got

    def _spread_critical(self, rnd, out) -> None:
        """``critical_spread``: the crowded rollout furthest from completing takes free
        devices its home has and devices whose owners can spare them until it drains, as
        new replicas that take running requests from the most loaded (``LaunchReplica``
        with ``spread``). A replica is crowded at twice the batch a spread aims at
        (``_crowd_at``), and the tail consolidation merges none of the pipeline's replicas
        into a crowded one (no spread and merge in turn); under ``spread_in_tail`` a tail
        spreads too (where ``_widen_tails`` has not re-sharded it this round)."""
        if not rnd.free or not any(
                not p.done and p.generating and any(not r.retiring for r in p.replicas) for p in rnd.state.order):
            return
        pick = self._spread_pick(rnd)
        if pick is None:
            return
        p, batch = pick
        state, cost, cfg = rnd.state, rnd.state.cost, self.config
        if p.pending or (self._in_tail(p) and not cfg.spread_in_tail):
            return  # a tail is re-sharded wider instead (``_widen_tails``)
        live = [r for r in p.replicas if not r.retiring and r.id not in rnd.gone]
        if not live or max(r.running for r in live) < 2 * batch:
            return
        load = sum(r.load for r in live)
        want = math.ceil(load / batch) - len(live)
        if want <= 0:
            return
        drain, last = max(((r.predicted_drain_s(), r) for r in live), key=lambda x: x[0])
        if last.running < 2 * batch:
            return  # the replica that ends last is not crowded: a spread would not end it sooner
        if cfg.spread_in_tail and last.running < self._crowd_at(rnd, p, last.tp):
            return  # nor at its own width (a re-shard made it wider)
        tp = self._bulk_tp(rnd, p)
        pool = [d for d in self._affinity(rnd, p, rnd.share[p.name], "rollout") if d in rnd.free]
        pool += [d for d in self._lendable(rnd, p, drain) if d not in pool]
        groups = self._take_groups(rnd, p, pool, [d for r in live for d in r.devices], tp, [], want)
        if not groups:
            return
        ctx = _running_context(live)
        per = max(1.0, load / (len(live) + len(groups)))
        step_now = cost.decode_step_s(p.model, last.tp, last.running, last.kv_tokens)
        # a replica runs what its KV cache holds and queues the rest: its drain is its load in
        # waves of that batch. The slower of the relieved replica and a new one on its own
        # width (narrower than a widened tail's: the requests it takes decode slower there)
        waves_now_s = step_now * last.load / max(1, last.running)
        waves_new_s = max(self._waves_s(state, p, w, per, ctx) for w in (last.tp, tp))
        saved = drain * (1.0 - waves_new_s / waves_now_s)
        price = cost.context_switch_s(p.model, tp, train_state=False) + cost.migration_s(p.model, tp, per * ctx)
        if saved < cfg.min_gain * price:
            return
        for g in groups:
            out.append(LaunchReplica(p.name, g, spread=True))
            rnd.free.difference_update(g)

    @staticmethod
    def _waves_s(state, p, width: int, load: float, ctx: float) -> float:
        """Seconds a width-``width`` replica of ``p`` takes per token of its ``load``
        requests at context ``ctx``: a decode step of the batch its KV cache holds (at most
        ``max_num_seqs``), once per wave of that batch the load makes."""
        run = max(1.0, min(load, _batch_held(state, p.model, width, max(ctx, 1.0))))
        return state.cost.decode_step_s(p.model, width, round(run), run * ctx) * load / run

    def _home_returning(self, rnd, p, now: int, want: int) -> bool:
        """``p``'s step would start its rollout on ``now`` of the ``want`` replicas it wants,
        while busy home devices for at least as many more are projected free within
        ``home_wait`` of its projected generation (``wait_for_home``)."""
        cfg = self.config
        if not (cfg.wait_for_home and cfg.lookahead) or now >= want or self._rollout_cap(rnd, p) is not None:
            return False  # (an asynchronous rollout held to part of its home takes no more)
        state = rnd.state
        tp = self._bulk_tp(rnd, p)
        horizon = cfg.home_wait * gen_estimate_s(p, state.cost, max(1, len(p.static_devices)), observed_stats(p))
        # busy when the round began (devices this round's decisions took are not coming back)
        soon = sum(1 for d in rnd.share[p.name]
                   if state.devices[d].task is not None and self._returns_in_s(rnd, d) <= horizon)
        return min(want - now, soon // tp) >= max(1, now)

    def _returns_in_s(self, rnd, d) -> float:
        """Projected time until device ``d`` is free, counting a stage's hand-back asked for
        earlier in this round (at its next micro-batch boundary)."""
        state = rnd.state
        task = state.devices[d].task
        if task is not None and task.kind == "stage":
            o = state.pipelines[task.pipeline]
            if o.running_stage is not None and d not in rnd.stage_devices(o):
                return max(0.0, o.running_stage.boundary_t - state.t)
        return self._busy_for_s(state, d)

    def _bulk_tp(self, rnd, p) -> int:
        """The width a rollout's replicas decode on (``bulk_width``): the narrowest of the
        spec's width and its doublings (within a node, no wider than the model's KV heads,
        which a wider replica would copy, and only widths vLLM can shard it over) whose decoded token costs within 5% of the
        cheapest, at the batch its KV cache holds at the context observed so far (the
        requests outstanding at most; ``fill_width``: a step's rollout off the critical
        path at the batch its requests give the replicas its home's free devices hold,
        since it fills them: 32 requests on 4 devices run 8 a one-device replica, where a
        4-device replica runs all 32 with a faster step and a cheaper token). A long
        context fills a narrow replica's cache with a few sequences, each decode step
        reading the weights for them alone; a wider replica holds more sequences per copy
        of the weights. Before any trajectory has finished
        (no context observed) the spec's width: the prior, the length budget, would widen
        every rollout."""
        got = rnd.bulk_tp.get(p.name)
        if got is None:
            # ``fill_width``: a step's rollout off the critical path starts on its home's free
            # devices (the spreads and loans serve the critical one's)
            fills = 0
            if self.config.fill_width and not p.generating and not self._paced_critical(rnd, p):
                fills = sum(1 for d in rnd.home[p.name][0] if d in rnd.free)
            got = rnd.bulk_tp[p.name] = self._cheapest_width(rnd.state, p, fills)
        return got

    def _cheapest_width(self, state, p, fills: int = 0) -> int:
        """``_bulk_tp``'s choice, computed once a round. ``fills``: the devices the
        rollout's replicas will fill (0: as many replicas as its requests need), so that
        each width is priced at the batch its replicas will run."""
        base = rollout_tp(p, state.cost)
        if not (self.config.bulk_width and self.config.resize) or p.lengths.observed == 0:
            return base
        cost, m = state.cost, p.model
        ctx = max(1.0, p.lengths.context_tokens)
        n = max(1, p.load() if p.generating else p.spec.samples_per_step)
        per_token = {}
        for w in m.tp_widths(min(state.gpus_per_node, max(base, m.kv_heads))):
            if w < base:
                continue
            # the batch each replica runs: what its cache holds, or fewer where the requests
            # are spread over ``fills // w`` replicas
            b = min(_batch_held(state, m, w, ctx), n / max(1, fills // w))
            per_token[w] = cost.decode_step_s(m, w, b, b * ctx) * w / b
        if not per_token:
            return base
        cheapest = min(per_token.values())
        return min(w for w, c in per_token.items() if c <= 1.05 * cheapest)

    def _cost_aware(self, state) -> bool:
        """Whether rollout goes on activation's devices and training on the trainer's site
        (a pool of more than one device class)."""
        return self.config.cost_aware and len(state.classes) > 1

    def _borrows(self) -> bool:
        """Rollout replicas go beyond the home only where the look-ahead can tell how long
        their owners can spare the devices (greedy borrowing starved (c)'s trainers: -66%)."""
        cfg = self.config
        return cfg.borrow and cfg.multiplex and cfg.resize and cfg.lookahead

    def _rollout_cap(self, rnd, p) -> int | None:
        """Home devices an asynchronous pipeline's rollout may hold while a batch of it waits
        to be trained (``async_reserve``); None: no cap.

        Under a staleness bound the next step's rollout overlaps this step's training, and
        the two share the home. A training gang cannot grow once started, a rollout can add
        replicas at any time: so the gang's part is kept free for it, and the rollout gets
        the split of the home that balances the next step's generation against this step's
        training (both projected from the lengths observed so far; a whole number of
        replicas, at least one). While no batch waits (the step to train next is still
        generating) the rollout is what holds the training back: no cap. A step generated
        in full counts as waiting while its rewards are computed (a sandbox): the gang
        will want its part when they are in, and a rollout started in the wait would hold it."""
        if p.name in rnd.rollout_cap:
            return rnd.rollout_cap[p.name]
        cap = None
        s = p.steps.get(p.train_next)
        cfg = self.config
        if (cfg.async_reserve and cfg.resize and p.spec.mode == "async" and not p.done
                and s is not None and s.gen_done >= s.samples):
            cost, stats = rnd.state.cost, observed_stats(p)
            tp = self._bulk_tp(rnd, p)
            n = len(rnd.share[p.name])
            cap = tp
            if n > tp:
                cap = min(range(tp, n, tp), key=lambda r: (max(gen_estimate_s(p, cost, r, stats),
                                                               train_estimate_s(p, cost, n - r, stats)), r))
        rnd.rollout_cap[p.name] = cap
        return cap

    def _rollout_room(self, rnd, p) -> int:
        """Free home devices a training gang of ``p`` leaves for its rollout: what its
        rollout cap allows beyond the replicas it holds, when the rollout wants devices now
        (its next step may start, or requests wait for a replica)."""
        cap = self._rollout_cap(rnd, p)
        if cap is None:
            return 0
        wants = (self._may_start_gen(p) and not p.generating) or p.pending > 0 or any(r.queued for r in p.replicas)
        if not wants:
            return 0
        return self._under_cap(rnd, p, cap, self._bulk_tp(rnd, p))

    def _under_cap(self, rnd, p, cap: int, tp: int) -> int:
        """Home devices ``p``'s rollout may still take under ``cap``: whole replicas."""
        return max(0, (cap - self._rollout_held(rnd, p)) // tp * tp)

    @staticmethod
    def _rollout_held(rnd, p) -> int:
        """Home devices ``p``'s live rollout replicas hold."""
        mine = set(rnd.share[p.name])
        return sum(1 for r in p.replicas if not r.retiring for d in r.devices if d in mine)

    def _replica_devices(self, rnd, p, want) -> list:
        if want <= 0:
            return []
        state, free = rnd.state, rnd.free
        tp = self._bulk_tp(rnd, p)
        home = rnd.home[p.name][0]
        if self.config.resize:  # idle training-home devices may serve the rollout too
            home = self._affinity(rnd, p, rnd.share[p.name], "rollout")
        avail = [d for d in home if d in free]
        cap = self._rollout_cap(rnd, p)
        if cap is not None:  # the rest of the home is its training gang's (async_reserve)
            avail = avail[:self._under_cap(rnd, p, cap, tp)]
        if self._cost_aware(state):
            avail = list(activate(state, p, avail, tp).devices)
        if not self.config.resize and len(avail) < want * tp:
            return []
        groups = [tuple(avail[i:i + tp]) for i in range(0, len(avail) - tp + 1, tp)][:want]
        if len(groups) < want and self._borrows():
            # the rest on other pipelines' spare devices, for as long as the rollout is projected to run
            if p.generating:
                duration = max((r.predicted_drain_s() for r in p.replicas), default=0.0)
            else:
                duration = gen_estimate_s(p, state.cost, max(1, len(p.static_devices)), observed_stats(p))
            taken = {d for g in groups for d in g}
            pool = [d for d in self._lendable(rnd, p, duration) if d not in taken]
            groups = self._take_groups(rnd, p, pool, taken, tp, groups, want)
        return groups

    def _take_groups(self, rnd, p, pool: list, held, tp: int, groups: list, want: int) -> list:
        """``groups`` and more ``tp``-wide groups of ``pool``, each on one node, up to
        ``want``; on a cost-aware pool only the devices activation picks beside the ``held``
        ones (the cheapest that keep the learner fed, activation.py)."""
        if self._cost_aware(rnd.state):
            pool = [d for d in activate(rnd.state, p, [*held, *pool], tp).devices if d not in held]
        while len(groups) < want:
            g = self._node_group(rnd, p, pool, tp)
            if not g:
                break
            groups.append(g)
            pool = [d for d in pool if d not in g]
        return groups
