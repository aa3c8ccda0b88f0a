"""The jigsaw policy's switches (one per mechanism, ``jigsaw bench --ablate``) and knobs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler.base import LIVE_RECHECK_S

__all__ = ["JigsawConfig"]


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
    # for a pipeline running alone (every other one done), the look-ahead prices "start
    # now" with that growth: the stage grows at its micro-batch boundaries onto the busy
    # home devices its wait candidates weigh, as each is projected free, paying the load of
    # the training state there. A job alone -0.28% over 58 never-run pipelines (s23002
    # -10.2%: an update waited 613 s for a device projected free in 103 s); (a)-(f) and the
    # 60 synthetic mixes unchanged. Beside other pipelines (stop 89's form) it was mixed:
    # the growth went to the critical pipeline's loans (docs/simulator.md, its row)
    grow_in_plan: bool = True
    # ... and the running stage of the pipeline projected to finish last
    # (``_projected_finish_t``) grows onto free devices no unfinished pipeline's home holds
    # (their owners finished: no one reclaims them) even before a pace marks it critical: a
    # 14B REINFORCE update in its first step ran 391 s on its 14-device home while the 32
    # devices of a finished 32B pipeline stood free (synthetic mix s6). With ``grow_at_home``
    # only: off, no stage off the critical path grows at all
    grow_onto_orphans: bool = True
    # a rollout whose engines report requests waiting for a batch slot (their caches full
    # at the context their running requests hold) grows by the replicas those requests fill
    # (``_grow_fills``), on its home or devices others can spare; off: never past the count
    # the mean context of finished trajectories asks for (``_wanted_replicas``), which is
    # short while the long ones still run: a 32B PPO rollout's first step, the last
    # pipeline left on 20 devices, queued 10-30 requests a replica for 500 s beside 4 idle
    # devices (synthetic mix s2). Measured (stop 56): (a)-(f) unchanged; held-out mixes
    # (seed 12000) -0.37% geometric mean, 5 faster, none slower; the benchmark's 60
    # synthetic mixes -0.40% (11 faster, 3 slower: s41 +6.3%) (docs/simulator.md)
    grow_on_queue: bool = True
    # ... and an owner whose engines queue more requests than its replicas run at once
    # (more than a whole wave waits) wants its home now, as one whose requests wait for a
    # replica: it reclaims home devices others' replicas borrowed and lends none. A 7B
    # agent's second step (the decision-latency run at 64 / 8) started on one replica, its
    # home's other 7 devices held by another agent's borrowed replicas; all 4,052 requests
    # went to the one replica, no request waited for a replica, and its home came back
    # only 3.5 s later (docs/simulator.md)
    reclaim_for_queue: bool = True
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
    # the run's last synchronous pipeline (every other one finished, ``idle_spread`` on)
    # launches its rollout at the width that ends its bulk soonest over the whole pool, not
    # the one whose token is cheapest: no one else will use the device-seconds
    alone_width: bool = True
    # ... and tries wider widths on its steps, one step each while steps remain, keeping the
    # width whose steps ended soonest (``trials.py``: the projection leaves out
    # a multi-turn agent's thinning batch)
    width_trials: bool = False
    # a critical pipeline's training gang (projected last at the pipelines' observed paces)
    # may take free devices of owners off the critical path even when they want them back
    # soon: they wait, the makespan does not (docs/simulator.md)
    lend_to_critical: bool = True
    # ... and, with this, a synchronous critical pipeline's rollout replicas too, from owners
    # projected to finish at least ``max_slack`` before the last pipeline; they reclaim the
    # devices by evicting the replicas (requests to a sibling). Off: the synthetic mixes
    # -0.8%, but (d) +1.3% (its 32B's replicas evicted again and again; docs/simulator.md)
    lend_rollouts_to_critical: bool = False
    # an owner whose running stage would not grow onto its home's free devices (growing
    # priced as ``grow_at_home`` prices it: the gang's all-gathers past a node, its switch)
    # lends them to rollout replicas until that stage ends, not "wanting them now": an
    # 8-device 32B update beside 24 free home devices kept a critical rollout off them for
    # 100 s (synthetic mix s52). Training gangs still see them wanted now (docs/simulator.md)
    lend_beside_stages: bool = True
    # the critical pipeline's next training gang is served first: among stages ready in one
    # round it forms its gang before the others', and while it is in its host-side stage
    # (the advantage computation) with a training stage next, no other pipeline's gang
    # borrows devices beyond its home for longer than that stage has left (docs/simulator.md)
    critical_claim: bool = True
    # on a heterogeneous pool under ``cost_aware``, neither a tail merge nor a re-shard holds
    # trainer-site devices past the time a training gang is due on them: a running stage's
    # end where a gang stage follows, now where one is ready (``_gang_claims``). A merge is
    # priced against the rollout's slack only, and heterogeneous S = 2 seed 1 merged every
    # L40S replica onto the fastest destination, an H100 replica on the trainer's site: five
    # updates then ran on 3 of the 4 H100s (docs/simulator.md)
    gang_claims: bool = True
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
    # serve the pipeline furthest from whole-run completion first (off: furthest in its
    # step); on, measured 2-5% slower on (a), so off by default
    priority: bool = False
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
    # and a long context's KV reads make a smaller batch decode each token faster; its tail
    # moves may not stretch its generation, and none is made while a device stands idle
    idle_spread: bool = True
    idle_spread_gain: float = 0.2
    # while others still run, a synchronous pipeline projected to finish within
    # ``max_slack`` of the last starts a step's rollout on the free devices of pipelines that
    # have finished too, at that faster batch: no owner wants them back (a 32B DAPO step on
    # 4 tp4 replicas beside 16 devices a finished pipeline left, held-out mix s8100). Off by
    # default: the 60 synthetic mixes -0.15% geometric mean (6 faster, 2 slower), 40 held-out
    # ones -0.23% (3 faster, none slower), but (b) +0.1% and (e) +0.2% (docs/simulator.md)
    orphan_spread: bool = False
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
    # ... and from ``idle_widen_requests`` down (at most half a step's samples) in a round
    # where no other pipeline has work ready (a stage, a rollout to start, requests waiting
    # for a replica): the devices the wider replicas take would wait otherwise. 256
    # everywhere (stop 104) sped the sets one chain binds
    # ((d) -1.9%) and cost the work-bound ones ((b) +1.0%), where a tail widened early
    # spends device-seconds that other pipelines' ready work wanted
    widen_when_idle: bool = True
    idle_widen_requests: int = 256
    max_widen: int = 8  # widest tensor-parallel replica a tail is re-sharded onto
    reshard_in_place: bool = True  # a widened tail may take its own replicas' devices (re-shard in place)
    # move a tail onto another pipeline's tail replica's devices where it pays
    # (docs/colocation.md)
    colocate: bool = False
    # the tail consolidation prices a pipeline's tails only where its engines' request
    # counts changed or a trajectory of it finished since its requests were last read
    # (``requests_changed``), not while its tails merely decode on: a pricing that found no
    # move is not redone. Why: at 1024 GPUs / 32 pipelines the first rollout's tails were
    # re-priced every round, 550 tails and 30 gathers a round, and the decision p99 went past
    # 10 ms; measured neutral on the makespans (with the reclaim fix of stop 35: +0.09%
    # geometric mean over (a)-(f) at seeds 0-2; docs/simulator.md)
    reprice_on_change: bool = True
    # the simulator wakes the policy at least this often (simulated seconds, at the next
    # event; 0: on its events only: ``Policy.decide_period_s``): by default as often as the
    # live executors re-check it (``LIVE_RECHECK_S``, 0.05 s). Events only, synthetic mix
    # s21026 took 1,273 s against 1,110 s: a 1.5B's rollout sat on 8 one-device replicas
    # for 226 s beside 48 idle devices, no event between to wake the policy (docs/simulator.md)
    decide_period_s: float = LIVE_RECHECK_S
    # the actor's log-prob pass beside the reference pass, and a PPO step's critic update
    # beside the actor's, each on a gang of its own (as OpenRLHF runs them), the ready
    # devices split between the two where both end sooner than one after the other; only
    # on executors that can (``concurrent_stages``; algorithms.ALONGSIDE)
    concurrent_stages: bool = True
    # ... when the later of the two ends at least this fraction sooner than the two in turn:
    # a pass that scales with its devices gains nothing from the split, and the gang run
    # alongside keeps its width (it cannot grow onto devices that free up meanwhile)
    alongside_gain: float = 0.1
    # ... and where the devices ready now are too few for the pair to gain so, the pair waits
    # for busy devices of the pipeline's home that free up soon, when started then it ends
    # ``alongside_gain`` sooner than the pair now and the two in turn started now: a
    # first stage started alone holds its partner back for its whole pass (a 72B PPO step's
    # critic update ran 273 s on 17 devices while 39 idled and the actor's waited)
    alongside_wait: bool = True
    # forward passes (log-prob, reference, values) over a step's finished trajectories on
    # devices its rollout no longer needs, while the tail still generates: the stage's own
    # pass then reads only the rest (docs/simulator.md, "Early forward passes")
    early_passes: bool = True
    early_from: float = 0.5  # ... once this fraction of the step's trajectories has finished
    early_chunk: float = 0.25  # ... and reading at least this fraction of the finished tokens again
    early_min_fixed: float = 2.0  # a pass reads at least this many times its fixed cost's worth
    # an early pass still running when its step's batch is complete goes on, from its next
    # micro-batch boundary, as the stage's own pass (``ResizeStage.rest``): one fixed cost,
    # no wait for it to end and a new gang to form (off: the stage's pass starts after it)
    early_rest: bool = True
    # merges that feed early passes (on since stop 100; docs/simulator.md): early passes for a
    # pipeline off the job set's critical path too, on its own home's devices that nothing
    # else took this round (never on lent ones: those may be the critical one's), and a
    # tail merge may stretch a synchronous pipeline's generation by up to ``merge_for_early``
    # of the tail's projected end beyond ``latency_slack`` once its step has ``early_from``
    # of its trajectories finished and a forward pass to run early (the devices it frees
    # read them), held to what that pass would take off the chain after the tail; none while
    # a pass of it runs or its home has free devices enough for one (the pass needs no merge)
    early_merges: bool = True
    # a tail's re-shard priced with the early pass its spare devices then run: among the plans
    # that beat the tail's projection, the one whose end plus the forward pass left after it
    # is soonest (a lone DAPO 7B on 8 H100: one tp4 replica for the tail and an early log-prob
    # pass on the other four, not two tp4 replicas on all eight; off: the fastest tail)
    widen_for_early: bool = True
    merge_for_early: float = 0.2
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
    # ... and past that count where it pays: each count from it up is priced as the rate it
    # decodes at, a full cache's overflow thinning its batch and each dropped token
    # prefilled again (``admission.trade_count``, the cost model's decode steps and prefill)
    admission_trade: bool = True
    # requests an engine preempted (its cache overflowed: they re-prefill wherever they
    # resume) that wait in its queue move to a sibling replica of the same pipeline whose
    # cache holds them now by the admission rule (``admission.fitting``), for the pipeline
    # projected to finish last: they resume now instead of waiting for the full replica's
    # sequences to end (a 32B agent's tp4 replicas queued shed requests at 97-100% of their
    # caches for 400 s beside its tp8 replicas at 30-40%: held-out mix s20004). On since
    # stop 82: faster on average on each of five sets of mixes (-0.07% to -0.48%), with
    # moves of up to 8% either way a mix (docs/simulator.md, "Preempted requests on a sibling")
    move_preempted: bool = True
    # an empty replica on its own home, of a pipeline on the job set's critical path whose
    # trajectories are between turns (in tool calls), is retired only where a decision of
    # the round takes a device of it: otherwise it stays for their next turns, which come
    # back to it (the engine's prefix cache). Off: every empty replica but the last goes at
    # once, and the next turns queue on the replicas left while its devices stand idle
    # (agents whose turns end together: the tail-free (d) 1,494.7 -> 1,352.1 s)
    keep_between_turns: bool = True
    # training gangs priced with the restarts the preemptions seen so far foretell (a pass
    # restarts whenever a device of its gang is preempted: scheduler/jigsaw/restarts.py);
    # off: gangs priced as if their devices stayed. Nothing changes before a preemption
    restart_pricing: bool = True

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


_COUNT_KNOBS = ("width", "tail_requests", "widen_requests", "idle_widen_requests", "max_widen")
_FRACTION_KNOBS = ("home_wait", "min_share", "latency_slack", "max_slack", "idle_spread_gain", "alongside_gain",
                   "early_from", "early_chunk", "wait_gain", "merge_for_early")
_FACTOR_KNOBS = ("loan_margin", "spread_cost")  # multiples of a duration or of the ideal token cost
