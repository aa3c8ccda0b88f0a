"""The baselines, as faithful to the systems they name as the simulator allows.

Each is a pure policy (DESIGN.md section 6); docs/simulator.md says how each was checked.

- ``verl-sync``: verl 0.9's colocated hybrid engine. Each pipeline alone on its static
  share; rollout on every device of the share, then each training stage on all of them,
  strictly in sequence; requests routed by the global least-in-flight balancer, sticky per
  trajectory; weights resharded in place.
- ``one-step-off``: verl's one_step_off_policy recipe. Separate rollout and training
  devices inside the share; generating step k+1 overlaps training step k (staleness 1);
  weights broadcast over NCCL between generations.
- ``streamrl``: StreamRL. Disaggregated like one-step-off, with skew-aware dispatch
  (requests submitted longest predicted first to the replica with the least predicted
  outstanding work; the ranker is the run's length predictor, as StreamRL's is learned)
  and the rollout/training split balanced on an offline profile of the workload
  (``estimates.balanced_split``; every disaggregated baseline's default).
- ``areal``: AReaL. Fully asynchronous: generation runs ahead of training by up to the
  staleness bound, weights are pushed while requests are in flight and those requests are
  interrupted and continue under the new weights (their KV recomputed).
- ``rollmux``: RollMux. Its inter-group plan (``groups.plan_groups``) puts the jobs in
  co-execution groups of one or two and sizes each group's rollout and training pools for
  the least estimated makespan; inside a group the jobs alternate phases round-robin
  (phase-level multiplexing, no sub-stage migration), both jobs' weights resident.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_plugin.algorithms import early_stages
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler.base import LIVE_RECHECK_S, Policy, PolicySetup, register_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica, RetireReplica, RunStage, StartGen
from jigsaw_plugin.scheduler.estimates import balanced_split, rollout_tp, split_rollout_sizes
from jigsaw_plugin.scheduler.groups import plan_groups

__all__ = ["VerlSync", "OneStepOff", "StreamRL", "AReaL", "RollMux"]


def all_free(state, devices) -> bool:
    return all(d in state.free for d in devices)


def launch_replicas(state, p, devices) -> list:
    # one width for all of them, as the frameworks run it, on the class with the least
    # memory among ``devices`` (the first class's width may not fit a smaller one)
    tp = rollout_tp(p, state.cost_of(devices))
    return [LaunchReplica(p.name, tuple(devices[i:i + tp])) for i in range(0, len(devices) - tp + 1, tp)]


def check_rollout_room(state, p, devices, policy: str) -> None:
    """``SpecError`` unless ``devices`` (where ``policy`` runs ``p``'s rollout) hold one of
    its replicas at the width of their smallest class, with room for a KV cache. On pools
    of several classes only: a host executor's pool (one pretend class) places its own
    engines, and its profile's memory says nothing about them."""
    if len(state.classes) <= 1:
        return
    cost = state.cost_of(devices)
    tp = rollout_tp(p, cost)
    if len(devices) < tp or cost.kv_capacity_tokens(p.model, tp) <= 0:
        raise SpecError(f"pipelines[{p.index}].gpus", len(p.static_devices),
                        f"a share whose {len(devices)} rollout devices under {policy} hold a replica of "
                        f"{p.model.name} on their smallest class ({cost.hw.name}, {cost.hw.memory_gb:g} GB: "
                        f"{tp} device(s) with room for a KV cache)")


def retire_all(p) -> list:
    return [RetireReplica(r.id) for r in p.replicas if not r.retiring]


def rollout_drained(p) -> bool:
    return not p.generating and all(r.load == 0 for r in p.replicas)


@register_policy("verl-sync")
class VerlSync(Policy):
    name = "verl-sync"

    def setup(self, state) -> PolicySetup:
        """Each step trains on the whole share (colocated): on a pool of several classes it
        must hold the training state on its devices' smallest class."""
        for p in state.order:
            need = state.cost_of(p.static_devices).min_gang(p.model, update=True)
            if len(p.static_devices) < need:
                raise SpecError(f"pipelines[{p.index}].gpus", len(p.static_devices),
                                f"a share that holds {p.model.name}'s training state on its smallest class "
                                f"(at least {need} devices), as {self.name} trains on all of it")
            check_rollout_room(state, p, p.static_devices, self.name)
        return super().setup(state)

    def decide(self, state) -> list:
        out = []
        for p in state.order:
            if p.done:
                continue
            devs = p.static_devices
            if p.replicas:
                if rollout_drained(p):
                    out += retire_all(p)  # sleep the engines: training takes the devices
                continue
            if not all_free(state, devs):
                continue
            if p.next_stage:
                out.append(RunStage(p.name, p.train_next, p.next_stage, devs, colocated=True))
            elif p.pending:  # a preemption took the step's replicas: its engines start again
                out += launch_replicas(state, p, devs)
            elif p.gen_next == p.train_next < p.total_steps and p.rollout_version == p.gen_next:
                out += launch_replicas(state, p, devs)
                out.append(StartGen(p.name, p.gen_next))
        return out


@dataclass
class _SplitConfig:
    # rollout devices of each pipeline's share: one count for every pipeline, or a mapping
    # pipeline name -> count (pipelines it leaves out, and None: the profiled balance)
    rollout_gpus: int | dict | None = None


class _Disaggregated(Policy):
    """Shared mechanics of the baselines with separate rollout and training devices."""

    config_class = _SplitConfig
    interrupt_on_sync = False
    wait_for_idle_rollout = True  # weights are pushed between generations

    def __init__(self, rollout_gpus: int | None = None):
        self.config = _SplitConfig(rollout_gpus)

    def staleness_bound(self, pipeline) -> int:
        return 1

    def setup(self, state) -> PolicySetup:
        """The rollout/training split of each share: the user's ``rollout_gpus`` (one count,
        or one per pipeline), or balanced on an offline profile of the workload (what
        StreamRL and AReaL profile for; ``estimates.balanced_split``)."""
        split = {}
        given = self.config.rollout_gpus
        if isinstance(given, dict):
            unknown = sorted(set(given) - {p.name for p in state.order})
            if unknown:
                raise SpecError(f"{self.name}.rollout_gpus", unknown[0],
                                "a pipeline of the workload: " + ", ".join(p.name for p in state.order))
        for p in state.order:
            devs = p.static_devices
            tp = rollout_tp(p, state.cost)
            if len(devs) <= tp:
                raise SpecError(f"pipelines[{p.index}].gpus", len(devs),
                                f"at least {tp + 1} devices for {self.name}, which keeps rollout "
                                f"({tp} per replica) and training on separate devices")
            need = state.cost.min_gang(p.model, update=True)  # the trainer holds the training state
            if len(devs) < tp + need:
                raise SpecError(f"pipelines[{p.index}].gpus", len(devs),
                                f"at least {tp + need} devices for {self.name}: {tp} for a rollout replica and "
                                f"{need} that hold {p.model.name}'s training state on separate devices")
            r = self._rollout_gpus(p) or balanced_split(p, state.cost, len(devs))
            sizes = split_rollout_sizes(tp, p.model, state.cost, len(devs))
            if isinstance(r, bool) or r not in sizes:
                raise SpecError(f"{self.name}.rollout_gpus", r,
                                f"a multiple of {tp} in {tp}..{sizes[-1]} for pipeline {p.name} (the rest trains: "
                                f"at least {need} devices hold its training state)")
            # on a pool of several classes the trainers hold its state on their own class
            held = state.cost_of(devs[r:]).min_gang(p.model, update=True)
            if len(devs) - r < held:
                raise SpecError(f"pipelines[{p.index}].gpus", len(devs),
                                f"a share whose {len(devs) - r} training devices after {self.name}'s {r} rollout "
                                f"devices hold {p.model.name}'s training state on their class (at least {held})")
            check_rollout_room(state, p, devs[:r], self.name)
            split[p.name] = (devs[:r], devs[r:])
        return PolicySetup(super().setup(state).residency, memo=split)

    def _rollout_gpus(self, p) -> int | None:
        """The user's rollout size for ``p`` (``rollout_gpus``), None where not given."""
        given = self.config.rollout_gpus
        if isinstance(given, dict):
            return given.get(p.name)
        return given

    def may_start_gen(self, p) -> bool:
        k = p.gen_next
        return (not p.generating and k - p.rollout_version <= self.staleness_bound(p)
                and not self._syncing(p))

    @staticmethod
    def _syncing(p) -> bool:
        return p.stage_running and p.stages[p.stage_next] == "weight_sync"

    def decide(self, state) -> list:
        out = []
        for p in state.order:
            if p.done:
                continue
            roll, train = state.memo[p.name]
            # the rollout is (re)launched for a step still to generate, or for requests that
            # wait without a replica (a preemption took the last step's replicas)
            wanted = p.gen_next < p.total_steps or p.pending > 0
            if not p.replicas and wanted and all_free(state, roll):
                out += launch_replicas(state, p, roll)
            if p.replicas and p.gen_next >= p.total_steps and rollout_drained(p):
                out += retire_all(p)
            if p.gen_next < p.total_steps and (p.replicas or out) and self.may_start_gen(p):
                out.append(StartGen(p.name, p.gen_next))
            stage = p.next_stage
            if stage and all_free(state, train):
                if stage == "weight_sync" and self.wait_for_idle_rollout and p.generating:
                    continue
                out.append(RunStage(p.name, p.train_next, stage, train, colocated=False))
        return out


@register_policy("one-step-off")
class OneStepOff(_Disaggregated):
    name = "one-step-off"


@register_policy("streamrl")
class StreamRL(_Disaggregated):
    name = "streamrl"

    routes_by_predicted_length = True
    # a stream-training pass starts once enough samples have finished, which no event
    # announces: decided at the live executors' cadence, as they run it ((a) 2,874 s
    # against 2,919 s on events only; (c) the same)
    decide_period_s = LIVE_RECHECK_S
    #: a streamed forward pass reads at least this many times its stage's fixed cost's worth
    #: of compute (each pass pays the stage's dispatch, so not one per finished sample)
    stream_min_fixed = 2.0

    def decide(self, state) -> list:
        """one-step-off's decisions, and stream training: while the next batch generates and
        the trainer is free, the trainer's forward passes (log-prob, reference, values) read
        the samples finished so far (``RunStage.early``, where the executor runs early
        passes), so less is left once the batch is complete. The batch generating is the
        step to train next, or the one after while the former's weight sync waits for the
        rollout to go idle. The update itself still takes the whole batch."""
        out = super().decide(state)
        if not state.early_passes:
            return out
        taken = {d for x in out if isinstance(x, RunStage) for d in x.devices}
        fixed = state.cost.f.train_stage_overhead_s
        for p in state.order:
            if p.done or p.stage_running:
                continue
            if p.next_stage is None:
                k = p.train_next
            elif p.next_stage == "weight_sync" and p.generating:
                k = p.train_next + 1
            else:
                continue
            s = p.steps.get(k)
            _, train = state.memo[p.name]
            if s is None or s.rewarded >= s.samples or taken.intersection(train) or not all_free(state, train):
                continue
            for stage in early_stages(p.stages):
                tokens = s.finished_tokens - s.covered.get(stage, 0)
                if tokens > 0 and state.cost.forward_s(p.model, len(train), tokens) - fixed >= self.stream_min_fixed * fixed:
                    out.append(RunStage(p.name, k, stage, train, colocated=False, early=True))
                    break
        return out

    def order(self, requests: list) -> list:
        return sorted(requests, key=lambda r: -r.pred_tokens)  # longest predicted first (skew-aware)

    def route(self, replicas: list, request):
        prev = request.replica
        if prev is not None and prev in replicas:
            return prev
        if not replicas:
            return None
        return min(replicas, key=lambda r: (r.predicted_work, r.id))  # least predicted outstanding tokens


@register_policy("areal")
class AReaL(_Disaggregated):
    name = "areal"
    interrupt_on_sync = True
    wait_for_idle_rollout = False

    def staleness_bound(self, pipeline) -> int:
        spec = pipeline.spec
        return spec.staleness if spec.mode == "async" and spec.staleness > 0 else 1

    def may_start_gen(self, p) -> bool:
        return p.gen_next - p.rollout_version <= self.staleness_bound(p)


@register_policy("rollmux")
class RollMux(Policy):
    name = "rollmux"
    resident_slots = 2

    def setup(self, state) -> PolicySetup:
        """RollMux's inter-group plan (``groups.plan_groups``): which jobs share a
        co-execution group and each group's rollout / training pools; memo: pipeline ->
        (its group's names, rollout pool, training pool)."""
        plan = plan_groups(list(state.order), state.cost)
        if plan is None:
            small = min(state.order, key=lambda p: len(p.static_devices))
            raise SpecError(f"pipelines[{small.index}].gpus", len(small.static_devices),
                            "enough devices that every co-execution group of rollmux keeps separate "
                            "rollout and training pools (a replica's devices, and a training pool that "
                            "holds each job's training state)")
        res, pools = {}, {}
        for g in plan:
            train = g.devices[g.rollout:]
            for name in g.names:
                q = state.pipelines[name]
                held = state.cost_of(train).min_gang(q.model, update=True)  # on the trainers' own class
                if len(train) < held:
                    raise SpecError(f"pipelines[{q.index}].gpus", len(q.static_devices),
                                    f"a share whose rollmux group's {len(train)} training devices hold "
                                    f"{q.model.name}'s training state on their class (at least {held})")
                check_rollout_room(state, q, g.devices[:g.rollout], self.name)
                pools[name] = (g.names, g.devices[:g.rollout], train)
                res[name] = g.devices
        return PolicySetup(res, memo=pools)

    def decide(self, state) -> list:
        out = []
        seen = set()
        for p in state.order:
            names, roll, train = state.memo[p.name]
            pair = [state.pipelines[n] for n in names]
            if names[0] in seen:
                continue
            seen.add(names[0])
            for q in pair:
                if q.replicas and rollout_drained(q):
                    out += retire_all(q)
            if all_free(state, roll) and not any(q.replicas for q in pair):
                ready = [q for q in pair if not q.done and q.gen_next == q.train_next < q.total_steps
                         and q.rollout_version == q.gen_next]
                lost = [q for q in pair if q.pending]  # a preemption took its step's replicas
                if lost:
                    out += launch_replicas(state, lost[0], roll)
                elif ready:
                    q = min(ready, key=lambda q: (q.gen_next, q.index))
                    out += launch_replicas(state, q, roll)
                    out.append(StartGen(q.name, q.gen_next))
            if all_free(state, train):
                ready = [q for q in pair if q.next_stage]
                if ready:
                    q = min(ready, key=lambda q: (q.train_next, q.index))
                    out.append(RunStage(q.name, q.train_next, q.next_stage, train, colocated=False))
        return out
