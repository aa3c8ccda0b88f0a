"""``ExecutorCore``: the bookkeeping and the decide round both executors share.

It owns devices and their claims, weight residency and context switches, steps and
policy versions, the staleness checks, hook emission, the length history the predictor
learns from, and the records the result JSON is built from. Subclasses supply the
mechanics: the simulator's ``World`` prices replicas and stages on the cost model's clock;
the runtime's ``LiveExecutor`` sends requests to live engines and runs real stages.

One decide round serves both: ``decide()`` builds the ``SchedulerState`` (observations
only) and calls ``jigsaw_schedule``, which the policy answers as an ordinary plugin; the
decisions come back to ``apply``.
"""

from __future__ import annotations

import gc
import time

from jigsaw_plugin.algorithms import ALONGSIDE, UPDATE_STAGES, may_run_alongside, waits_for_alongside
from jigsaw_plugin.core.pipelines import HOST_STAGES, PipelineRun, StepRun, build_pipelines, sample_tokens
from jigsaw_plugin.core.pricing import Pricer
from jigsaw_plugin.core.snapshot import RefreshPolicy, build_state, note_finished
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.scheduler.decisions import (
    AdmissionLimit,
    LaunchReplica,
    Migrate,
    ResizeStage,
    RetireReplica,
    RunStage,
    StartGen,
)
from jigsaw_plugin.scheduler.state import DeviceTask, DeviceView

__all__ = ["ExecutorCore", "PolicyViolation", "PREDICTORS"]

#: Remaining-length predictors an executor can run with. "oracle" reads true lengths: an
#: ablation only, offered by executors that know them (the simulator).
PREDICTORS = ("history", "oracle")


class PolicyViolation(RuntimeError):
    """A decision broke an invariant of the executor (named in the message)."""


class ExecutorCore:
    # whether ``LaunchReplica(colocate_with=...)`` can be carried out: two pipelines' rollout
    # replicas on one device group (the simulator; live engines and host executors cannot yet)
    supports_colocation = False
    # forward passes over a step's finished trajectories while the rest generate
    # (RunStage.early; SchedulerState.early_passes): an executor that runs them says so
    supports_early_passes = False
    # whether its engines' KV-overflow preemptions are counted (``PipelineRun.kv_preemptions``;
    # the result reports None where they are not)
    reports_kv_preemptions = False
    # a LaunchReplica whose devices include those of the replicas it absorbs: they stop, and
    # their requests resume on the new, wider replica (re-shard in place; SchedulerState.reshard_in_place)
    supports_reshard_in_place = False
    # a stage on a gang of its own beside the next one (RunStage.alongside, algorithms.ALONGSIDE:
    # the log-prob pass beside the reference pass, the critic's update beside the actor's;
    # SchedulerState.concurrent_stages)
    supports_concurrent_stages = False
    # a replica's batch limit set by the policy (AdmissionLimit, LaunchReplica.max_seqs;
    # SchedulerState.admission_limits)
    supports_admission_limits = False

    def __init__(self, workload, policy, seed: int = 0, factors=None, hooks=None, record_requests: bool = False,
                 pm=None, predictor: str = "history"):
        from jigsaw_plugin.costmodel import CostModel, hardware_profile
        from jigsaw_plugin.errors import SpecError

        if predictor not in PREDICTORS:
            raise SpecError("predictor", predictor, ", ".join(PREDICTORS))
        self.workload = workload
        self.policy = policy
        self.seed = seed
        self.order: list[PipelineRun] = build_pipelines(workload)
        self.pipelines = {p.name: p for p in self.order}
        self.gpus = workload.cluster.gpus
        self.gpus_per_node = workload.cluster.gpus_per_node  # the first class's (its cost model's)
        self.nodes = workload.cluster.device_nodes()  # device id -> node, class by class
        self.node_sizes = workload.cluster.node_sizes()  # node -> its size as provisioned
        self.largest_node = workload.cluster.largest_node
        self.cost = CostModel.for_nodes(hardware_profile(workload.cluster.gpu), workload.cluster.gpus_per_node, factors)
        for p in self.order:
            self._check_share(workload, p, factors)
        self.hooks = hooks
        self.record_requests = record_requests and hooks is not None
        self.free: set[int] = set(range(self.gpus))
        self.task: dict[int, DeviceTask] = {}
        self.resident: dict[int, list] = {d: [] for d in range(self.gpus)}  # LRU of rollout weights
        self.train_resident: dict[int, str] = {}
        self.resident_slots = getattr(policy, "resident_slots", 1)
        self.replicas: dict[int, object] = {}
        self._next_replica = 0
        self._devices_version = 0
        self._device_views = None
        self.busy_s = 0.0  # device-seconds of finished work (replicas counted when closed)
        self.migrations = 0
        # (name, category, devices, start, end) for the Chrome trace; name: "<pipeline> <what ran>"
        self.trace: list = []
        self.decision_us: list[float] = []  # per decide round: jigsaw_schedule (policy + lazy state reads)
        # the same rounds split: building the state (snapshot + the lazy request reads and
        # predictions during the policy) and the policy's own time (core.snapshot)
        self.state_build_us: list[float] = []
        self.policy_us: list[float] = []
        # per decide round, before it: the engines' reports brought to the round's time
        # (``advance_engines``; the simulator's replicas decoding up to now), not in the above
        self.engine_advance_us: list[float] = []
        self._lazy_us = 0.0
        # the decision timers' clock (a benchmark on a shared machine may read CPU time,
        # time.process_time, which other processes' load does not inflate)
        self.clock = time.perf_counter
        self.request_cache: dict = {}  # pipeline -> (key, this round's requests, its cache): core.snapshot
        self.prediction_refresh = RefreshPolicy()  # when cached predictions are asked again
        self.predictor_name = predictor
        self.pm = pm if pm is not None else self._default_manager()
        self._register_builtins()
        self.pricer = Pricer(self.pm, self.cost, {p.name: p.model for p in self.order}, self.nodes)
        from jigsaw_plugin.predict import PredictionLog

        self.prediction_log = PredictionLog()
        setup = policy.setup(build_state(self))
        self.memo = setup.memo
        for name, devices in setup.residency.items():
            self.make_resident(name, devices)

    def _share_classes(self, workload, devices, factors) -> list:
        """(cost model, devices of ``devices`` in it, its name) of each class a static share
        holds devices of (the pool's own cost model for a pool of one class)."""
        classes = workload.cluster.device_classes()
        if len(classes) <= 1:
            gpu = workload.cluster.gpu
            return [(self.cost, len(devices), gpu if isinstance(gpu, str) else str(gpu.get("name", "custom")))]
        from jigsaw_plugin.costmodel import CostModel

        first, held = 0, []
        for k, (c, cost) in enumerate(zip(classes, CostModel.of_classes(workload.cluster, factors))):
            n = sum(1 for d in devices if first <= d < first + c.count)
            if n:
                held.append((cost, n, f"{c.name} (cluster.classes[{k}])"))
            first += c.count
        return held

    def _check_share(self, workload, p, factors) -> None:
        """Each share must hold its training state (a colocated step trains on all of it); on
        a pool of several classes, some of its devices must: those of a class and of the
        classes with more memory a device, as many as that class needs (a gang holds what
        its smallest devices hold; a policy may train on the larger part alone)."""
        from jigsaw_plugin.errors import SpecError

        held = self._share_classes(workload, p.static_devices, factors)
        options = [(cost, sum(n for c, n, _ in held if c.hw.memory_gb >= cost.hw.memory_gb), name)
                   for cost, _, name in held]
        if any(n >= cost.min_gang(p.model, update=True) for cost, n, _ in options):
            return
        cost, _, name = max(options, key=lambda o: o[0].hw.memory_gb)
        raise SpecError(f"pipelines[{p.index}].gpus", len(p.static_devices),
                        f"at least {cost.min_gang(p.model, update=True)} {name} devices for {p.name}: "
                        f"{cost.min_gang_reason(p.model)}")

    # ---- plugins ------------------------------------------------------------------------
    @staticmethod
    def _default_manager():
        from jigsaw_plugin.manager import get_plugin_manager

        return get_plugin_manager()

    def _register_builtins(self) -> None:
        """The policy answers ``jigsaw_schedule`` and the cost model ``jigsaw_predict_duration``
        as ordinary plugins of this run's manager (a ``tryfirst`` plugin may override
        either); the oracle predictor, when asked for, is registered ``tryfirst``."""
        from jigsaw_plugin.builtin import CostModelPlugin, SchedulerPlugin
        from jigsaw_plugin.manager import register

        register(self.pm, SchedulerPlugin(self.policy), f"scheduler:{self.policy.name}:{id(self)}")
        register(self.pm, CostModelPlugin(self.cost, {p.name: p.model for p in self.order}, self.nodes),
                 f"costmodel:{id(self)}")
        if self.predictor_name == "oracle":
            from jigsaw_plugin.predict import OraclePredictor

            register(self.pm, OraclePredictor(self.true_length), f"oracle-predictor:{id(self)}")
        if not self.pm.hook.jigsaw_predict_remaining.get_hookimpls():
            from jigsaw_plugin.predict import HistoryPredictor

            register(self.pm, HistoryPredictor(), f"history-predictor:{id(self)}")

    def true_length(self, request_id: RequestId) -> int:
        """The final length of a request's current turn: only executors that generate from a
        known workload (the simulator) can answer; used by the oracle ablation alone."""
        raise NotImplementedError(f"{type(self).__name__} cannot offer the oracle predictor")

    def predict_remaining(self, p: PipelineRun, batch, step_s: dict | None = None):
        """Predicted remaining tokens of ``batch`` (a ``RequestBatch`` of ``p``); ``step_s``:
        replica -> its decode step time (to score predictions in seconds)."""
        import numpy as np

        if len(batch) == 0:
            return np.zeros(0)
        pred = self.pm.hook.jigsaw_predict_remaining(pipeline=p.name, requests=batch, history=p.history)
        pred = np.minimum(np.asarray(pred, dtype=float), np.maximum(batch.max_tokens - batch.generated, 0))
        self._note_predictions(batch, pred, step_s)
        return pred

    def _note_predictions(self, batch, pred, step_s: dict | None) -> None:
        """Record a few predictions at this decision point (scored when they finish)."""
        pick = slice(0, len(batch), max(1, len(batch) // 16))
        step_s = step_s or {}
        # the picked rows' fields as Python numbers at once, not one numpy scalar at a time
        for rid, queued, replica, generated, p in zip(batch.ids[pick], batch.queued[pick].tolist(),
                                                      batch.replica[pick].tolist(), batch.generated[pick].tolist(),
                                                      pred[pick].tolist()):
            if not queued:
                self.prediction_log.note(rid, int(generated), p, step_s.get(replica, 0.0), self.t)

    # ---- the decide round -----------------------------------------------------------------
    def snapshot(self):
        """The ``SchedulerState`` now: what a policy may read."""
        return build_state(self, self.memo)

    def note_state_build(self, us: float) -> None:
        """Time the snapshot's lazy parts spent while the policy ran (core.snapshot)."""
        self._lazy_us += us

    def advance_engines(self) -> None:
        """Bring what the engines report up to the round's time, before the round starts.

        A live executor's engines decode on their own and have reported already, so it has
        nothing to do here (its snapshot reads their last reports). The simulator overrides
        it: its simulated replicas advance their decode to now, the engines' own work, which
        a live host's round does not do; it is timed apart (``engine_advance_us``) and not
        counted in the decision latency."""

    def decide(self) -> list:
        """One round: the state, then ``jigsaw_schedule``; returns the decisions.

        The cyclic garbage collector is held off for the round: a full collection walks
        every live object of the process (at 1024 GPUs / 32 pipelines, 160-240 ms, several
        in 300 rounds) and would land on whichever round crossed its allocation threshold.
        It runs at the next allocation after the round instead, in the executor's own time
        (docs/benchmarks.md, decision latency)."""
        self._lazy_us = 0.0
        clock = self.clock
        collecting = gc.isenabled()
        gc.disable()
        try:
            t_engines = clock()
            self.advance_engines()
            t0 = clock()
            self.engine_advance_us.append((t0 - t_engines) * 1e6)
            state = self.snapshot()
            t1 = clock()
            decisions = self.pm.hook.jigsaw_schedule(state=state) or []
            call_us = (clock() - t1) * 1e6
        finally:
            if collecting:
                gc.enable()
        self.decision_us.append(call_us)
        self.state_build_us.append((t1 - t0) * 1e6 + self._lazy_us)
        self.policy_us.append(call_us - self._lazy_us)
        return decisions

    def decide_and_apply(self, max_rounds: int = 8) -> None:
        for _ in range(max_rounds):
            self.dirty = False
            decisions = self.decide()
            if not decisions:
                break
            for d in decisions:
                self.apply(d)
        self.dirty = False

    def apply(self, d) -> None:
        self._check_names(d)
        if isinstance(d, StartGen):
            self._start_gen(d)
        elif isinstance(d, LaunchReplica):
            p = self.pipelines.get(d.pipeline)
            if p is not None and not p.model.fits_tp(len(d.devices)):
                raise PolicyViolation(
                    f"LaunchReplica.devices: {len(d.devices)} devices for {d.pipeline}'s {p.model.name}, whose "
                    f"{p.model.attention_heads} attention heads / {p.model.kv_heads} KV heads vLLM cannot shard over "
                    f"{len(d.devices)}; allowed widths: {p.model.tp_widths(self.largest_node)}")
            if d.colocate_with is not None and not self.supports_colocation:
                raise PolicyViolation(
                    f"{type(self).__name__} cannot co-locate rollout replicas (capability 'colocation'): "
                    f"LaunchReplica.colocate_with={d.colocate_with} is for executors whose state says "
                    f"colocation=True (the simulator)")
            if d.max_seqs is not None:
                self._check_max_seqs(d, d.max_seqs)
            if d.absorb and not self.supports_reshard_in_place:
                held = {x for rid in d.absorb if (r := self.replicas.get(rid)) is not None for x in r.devices}
                if held & set(d.devices):
                    raise PolicyViolation(
                        f"{type(self).__name__} cannot re-shard a replica in place (capability 'reshard_in_place'): "
                        f"LaunchReplica.devices {tuple(d.devices)} overlap the absorbed replicas' devices "
                        f"{tuple(sorted(held))}; allowed here: free devices only")
            self._launch(d)
        elif isinstance(d, RetireReplica):
            rep = self.replicas.get(d.replica)
            if rep is None:
                raise PolicyViolation(f"RetireReplica of unknown replica {d.replica}")
            self._retire(rep)
        elif isinstance(d, Migrate):
            self._migrate(d)
        elif isinstance(d, AdmissionLimit):
            rep = self.replicas.get(d.replica)
            if rep is None:
                raise PolicyViolation(f"AdmissionLimit of unknown replica {d.replica}")
            self._check_max_seqs(d, d.max_seqs)
            self._limit_admission(rep, d.max_seqs)
        elif isinstance(d, RunStage):
            self._check_gang_memory(d)
            self._run_stage(d)
        elif isinstance(d, ResizeStage):
            if d.rest:
                self._check_rest(d)
            self._check_gang_memory(d)
            self._resize_stage(d)
        else:
            raise PolicyViolation(f"unknown decision {d!r}")

    def _check_names(self, d) -> None:
        """A decision names a pipeline of the run and devices of the pool (else a
        ``PolicyViolation`` naming the field, the value and what is allowed, not a
        ``KeyError`` from deep in the executor)."""
        name = getattr(d, "pipeline", None)
        if name is not None and name not in self.pipelines:
            raise PolicyViolation(f"{type(d).__name__}.pipeline: {name!r} is no pipeline of this run; "
                                  f"allowed: {sorted(self.pipelines)}")
        for x in getattr(d, "devices", ()):
            if x >= self.gpus:
                raise PolicyViolation(f"{type(d).__name__}.devices: device {x} is not in the pool; "
                                      f"allowed: 0 to {self.gpus - 1}")

    def _check_max_seqs(self, d, max_seqs: int | None) -> None:
        """A batch limit the executor can carry out: it declares admission limits, and the
        limit is at most the engine's configured one."""
        if not self.supports_admission_limits:
            raise PolicyViolation(
                f"{type(self).__name__} cannot set a replica's batch limit (capability 'admission_limits'): "
                f"{type(d).__name__}.max_seqs={max_seqs} is for executors whose state says admission_limits=True "
                f"(the simulator)")
        if max_seqs is not None and max_seqs > self.cost.f.max_num_seqs:
            raise PolicyViolation(f"{type(d).__name__}.max_seqs: {max_seqs}; allowed: 1 to the engine's "
                                  f"max_num_seqs ({self.cost.f.max_num_seqs}), or None")

    def _check_gang_memory(self, d) -> None:
        """A training-side pass on fewer devices than hold its sharded state
        (``CostModel.min_gang``) would run out of memory on a real cluster."""
        p = self.pipelines.get(d.pipeline)
        if p is None or not d.devices:  # no devices: a pause, or a stage the executor refuses itself
            return
        cost = self.cost_for(tuple(d.devices))
        update = d.stage in UPDATE_STAGES
        need = cost.stage_min_gang(p.model, d.stage)
        if len(d.devices) < need:
            raise PolicyViolation(
                f"{type(d).__name__}.devices: {len(d.devices)} devices for {p.name}'s {d.stage}: {p.model.name}'s "
                f"{p.model.gang_contents(update)} ({p.model.gang_bytes(update) / 1e9:.0f} GB) fill at most {cost.f.train_memory_fraction:.0%} of each "
                f"{cost.hw.memory_gb:g} GB device; allowed: at least {need} devices")

    # ---- devices ------------------------------------------------------------------------
    def _emit(self, name: str, **kw) -> None:
        if self.hooks is not None:
            getattr(self.hooks, name)(**kw)

    def announce_pipelines(self) -> None:
        """Each pipeline registered and started (the hooks' record of a run begins with
        them), in the workload's order: the first thing either loop does."""
        for p in self.order:
            self._emit("jigsaw_register_pipeline", pipeline=p.name, spec=p.spec.to_dict())
            self._emit("jigsaw_pipeline_start", pipeline=p.name, t=0.0)

    def preemptions_seen(self) -> tuple:
        """``PreemptionsSeen`` per device class that has lost a device so far (what
        ``SchedulerState.preemptions`` carries); none on an executor without preemptions."""
        return ()

    def device_views(self) -> tuple:
        if self._device_views is None or self._device_views[0] != self._devices_version:
            nodes = self.nodes
            views = tuple(DeviceView(d, nodes[d], self.task.get(d), tuple(self.resident[d]),
                                     self.train_resident.get(d)) for d in range(self.gpus))
            self._device_views = (self._devices_version, views)
        return self._device_views[1]

    def _claim(self, devices: tuple, owner: DeviceTask) -> None:
        for d in devices:
            if d not in self.free:
                raise PolicyViolation(f"device {d} is busy ({self.task.get(d)!r}); cannot run {owner!r}")
        for d in devices:
            self.free.discard(d)
            self.task[d] = owner
        self._devices_version += 1

    def _release(self, devices: tuple) -> None:
        for d in devices:
            self.task.pop(d, None)
            self.free.add(d)
        self._devices_version += 1
        self.dirty = True

    def _switch_s(self, p: PipelineRun, devices: tuple, kind: str) -> float:
        """Context switch: bring the pipeline's state onto devices where it is not resident.

        Rollout weights stay resident on up to ``resident_slots`` pipelines per device (LRU);
        a device keeps one pipeline's training state (weights, grads, optimizer).
        """
        if kind == "rollout":
            missing = [d for d in devices if p.name not in self.resident[d]]
            for d in devices:
                lru = self.resident[d]
                if p.name in lru:
                    lru.remove(p.name)
                lru.append(p.name)
                del lru[: max(0, len(lru) - self.resident_slots)]
            self._make_room(p, devices)
        else:
            missing = [d for d in devices if self.train_resident.get(d) != p.name]
            for d in devices:
                self.train_resident[d] = p.name
        self._devices_version += 1
        if not missing:
            return 0.0
        p.context_switches += 1
        s = self.pricer.context_switch_s(p.name, tuple(devices), train_state=(kind == "train"))
        self._emit("jigsaw_context_switch", devices=tuple(missing), from_pipeline=None,
                   to_pipeline=p.name, duration_s=s, t=self.t)
        return s

    def make_resident(self, pipeline: str, devices) -> None:
        """Preload state (a static partition starts with its pipeline resident)."""
        for d in devices:
            if pipeline not in self.resident[d]:
                self.resident[d].append(pipeline)
            self.train_resident[d] = pipeline
        self._devices_version += 1

    def _make_room(self, p: PipelineRun, devices: tuple) -> None:
        """Other pipelines' rollout weights kept resident on ``devices`` (``resident_slots``)
        that leave ``p``'s new replica no KV room go, oldest first: an engine offloads a
        sleeping model's weights when memory runs short (vLLM's sleep mode), and two models
        that do not fit together cannot both stay. Their next launch there pays the load."""
        cost = self.cost_for(devices)
        while True:
            other = self._other_weight_bytes(p, devices)
            if other <= 0 or cost.kv_capacity_tokens(p.model, len(devices), other) > 0:
                return
            for d in devices:
                lru = self.resident[d]
                oldest = next((o for o in lru if o != p.name), None)
                if oldest is not None:
                    lru.remove(oldest)

    def cost_for(self, devices: tuple):
        """The cost model of the device class ``devices`` belong to (one class here)."""
        return self.cost

    def _other_weight_bytes(self, p: PipelineRun, devices: tuple) -> float:
        """Bytes per device held by other pipelines' resident rollout weights."""
        worst = 0.0
        for d in devices:
            b = sum(self.pipelines[o].model.weight_bytes / len(devices) for o in self.resident[d] if o != p.name)
            worst = max(worst, b)
        return worst

    def _new_replica_id(self) -> int:
        rid = self._next_replica
        self._next_replica += 1
        return rid

    # ---- steps --------------------------------------------------------------------------
    def _open_step(self, d: StartGen) -> tuple[PipelineRun, StepRun]:
        """Check a StartGen against the staleness bound and record the new step."""
        from jigsaw_plugin import workload as _workload

        p = self.pipelines[d.pipeline]
        if d.step != p.gen_next or d.step >= p.total_steps:
            raise PolicyViolation(f"{p.name}: StartGen step {d.step}, expected {p.gen_next}")
        bound = self.policy.staleness_bound(p)
        if d.step - p.rollout_version > bound:
            raise PolicyViolation(
                f"{p.name}: step {d.step} would be generated by version {p.rollout_version}, "
                f"staler than the bound {bound}"
            )
        samples = _workload.sample_step(p.spec, d.step, self.seed)
        s = StepRun(step=d.step, samples=samples, n=len(samples.prompt_len))
        s.tokens, s.generated = sample_tokens(samples)
        s.gen_start_t = self.t
        s.width, s.keep_width = d.width, d.keep_width
        s.min_version = p.rollout_version
        p.steps[d.step] = s
        p.gen_next += 1
        self._emit("jigsaw_step_start", pipeline=p.name, step=d.step, t=self.t)
        return p, s

    def _check_stage(self, d: RunStage) -> tuple[PipelineRun, StepRun, tuple]:
        """Validate a RunStage, claim its devices, emit its start; returns its devices."""
        p = self.pipelines[d.pipeline]
        if d.early:
            return self._check_early_pass(d, p)
        if d.alongside:
            return self._check_alongside(d, p)
        if d.step != p.train_next or p.next_stage != d.stage:
            raise PolicyViolation(
                f"{p.name}: RunStage {d.stage} of step {d.step}; next is {p.next_stage} of step {p.train_next}"
            )
        s = p.steps[d.step]
        staleness = p.version - s.min_version
        bound = self.policy.staleness_bound(p)
        if d.stage == "update_actor" and staleness > bound:
            raise PolicyViolation(f"{p.name}: step {d.step} staleness {staleness} > bound {bound}")
        devices = () if d.stage in HOST_STAGES else tuple(d.devices)
        if d.stage not in HOST_STAGES:
            if not devices:
                raise PolicyViolation(f"{p.name}: stage {d.stage} needs devices")
            self._claim(devices, DeviceTask("stage", p.name, stage=d.stage))
        p.stage_running = True
        tokens = self._own_pass_tokens(s, d.stage)
        self._emit("jigsaw_stage_start", pipeline=p.name, step=d.step, stage=d.stage, devices=devices,
                   samples=s.n, tokens=tokens, t=self.t)
        if d.stage == "weight_sync":
            self._emit("jigsaw_weight_sync_start", pipeline=p.name, step=d.step, version=p.version,
                       devices=devices, bytes=int(p.model.weight_bytes), t=self.t)
        return p, s, devices

    def _check_alongside(self, d: RunStage, p: PipelineRun) -> tuple[PipelineRun, StepRun, tuple]:
        """Validate a stage run alongside the next one (``RunStage.alongside``), claim its
        devices, emit its start; the pipeline's next stage is then its partner."""
        if not self.supports_concurrent_stages:
            raise PolicyViolation(
                f"{type(self).__name__} cannot run a stage alongside the next (capability 'concurrent_stages'): "
                f"RunStage.alongside is for executors whose state says concurrent_stages=True (the simulator)")
        if d.step != p.train_next or p.next_stage != d.stage or p.alongside is not None:
            raise PolicyViolation(f"{p.name}: RunStage {d.stage} of step {d.step} alongside; next is "
                                  f"{p.next_stage} of step {p.train_next}")
        if not may_run_alongside(d.stage, p.stages, p.stage_next):
            raise PolicyViolation(f"{p.name}: {d.stage} cannot run alongside the stage after it; allowed: "
                                  + ", ".join(f"{a} beside {b}" for a, b in ALONGSIDE.items()))
        devices = tuple(d.devices)
        if not devices:
            raise PolicyViolation(f"{p.name}: stage {d.stage} needs devices")
        self._claim(devices, DeviceTask("stage", p.name, stage=d.stage))
        s = p.steps[d.step]
        self._own_pass_tokens(s, d.stage)
        p.alongside = d.stage
        p.stage_next += 1
        self.dirty = True
        self._emit("jigsaw_stage_start", pipeline=p.name, step=d.step, stage=d.stage, devices=devices,
                   samples=s.n, tokens=s.pass_tokens.get(d.stage, s.tokens), t=self.t)
        return p, s, devices

    def alongside_end_t(self, p: PipelineRun) -> float | None:
        """Predicted end of the stage ``p`` runs alongside its sequence (None if none)."""
        s = p.steps.get(p.train_next)
        if p.alongside is None or s is None or p.alongside not in s.stage_t:
            return None
        return s.stage_t[p.alongside][1]

    @staticmethod
    def _own_pass_tokens(s: StepRun, stage: str) -> int:
        """The tokens a stage's own pass over step ``s`` reads: the rest of what its early
        passes read (set as the pass's tokens), else the whole batch."""
        if stage in s.covered:
            s.pass_tokens[stage] = s.tokens - s.covered[stage]
        return s.pass_tokens.get(stage, s.tokens)

    def _check_rest(self, d: ResizeStage) -> None:
        """Validate ``ResizeStage.rest``: an early pass of the step to train next, whose
        batch is complete, of the stage its own pass runs next."""
        if not self.supports_early_passes:
            raise PolicyViolation(
                f"{type(self).__name__} runs no early passes (capability 'early_passes'): ResizeStage.rest=True "
                f"is for executors whose state says early_passes=True (the simulator)")
        p = self.pipelines[d.pipeline]
        if p.early != d.stage or p.early_step != d.step:
            raise PolicyViolation(f"{p.name}: ResizeStage.rest=True for {d.stage} of step {d.step}, which runs no "
                                  f"early pass; allowed: the early pass running now "
                                  f"({p.early or 'none'} of step {p.early_step})")
        if d.step != p.train_next or not p.batch_ready(d.step) or p.stages[p.stage_next] != d.stage \
                or waits_for_alongside(d.stage, p.alongside):
            raise PolicyViolation(f"{p.name}: ResizeStage.rest=True for {d.stage} of step {d.step} before its batch "
                                  f"is complete and that stage's own pass is next")

    def _check_early_pass(self, d: RunStage, p: PipelineRun) -> tuple[PipelineRun, StepRun, tuple]:
        """Validate an early pass (``RunStage.early``), claim its devices, emit its start."""
        if not self.supports_early_passes:
            raise PolicyViolation(
                f"{type(self).__name__} cannot run early passes (capability 'early_passes'): RunStage.early "
                f"is for executors whose state says early_passes=True (the simulator)")
        s = p.steps.get(d.step)
        # the step to train next, or the one after once only the former's weight sync is left
        # (the pass reads the trainer's weights, which that sync only copies to the rollout)
        sync_left = list(p.stages[p.stage_next:]) == ["weight_sync"]
        if d.step not in (p.train_next, p.train_next + 1) or (d.step > p.train_next and not sync_left) \
                or s is None or s.reward_end_t is not None:
            raise PolicyViolation(f"{p.name}: early {d.stage} of step {d.step}: only the step to train next "
                                  f"({p.train_next}), or the one after when only its weight sync is left, "
                                  f"while its batch is still being generated")
        if p.stage_running or p.alongside is not None:
            raise PolicyViolation(f"{p.name}: early {d.stage} of step {d.step} while a stage runs")
        if d.stage not in p.early_stages():
            raise PolicyViolation(f"{p.name}: early {d.stage}: only {', '.join(p.early_stages()) or 'no stage'} "
                                  f"(forward passes before the first stage that needs the whole batch)")
        tokens = s.finished_tokens - s.covered.get(d.stage, 0)
        if tokens <= 0:
            raise PolicyViolation(f"{p.name}: early {d.stage} of step {d.step}: no finished trajectory left to read")
        if isinstance(d.tokens, bool) or not isinstance(d.tokens, int) or d.tokens < 0:
            raise PolicyViolation(f"{p.name}: early {d.stage}: RunStage.tokens={d.tokens!r}; allowed: an integer >= 0 "
                                  f"(0: every finished token not read yet)")
        if d.tokens:
            tokens = min(tokens, d.tokens)
        devices = tuple(d.devices)
        if not devices:
            raise PolicyViolation(f"{p.name}: early {d.stage} needs devices")
        self._claim(devices, DeviceTask("stage", p.name, stage=d.stage))
        p.stage_running = True
        p.early, p.early_step = d.stage, d.step
        s.pass_tokens[d.stage] = tokens
        self._emit("jigsaw_stage_start", pipeline=p.name, step=d.step, stage=d.stage, devices=devices,
                   samples=s.n_gen_done, tokens=tokens, t=self.t)
        return p, s, devices

    def price_stage(self, p: PipelineRun, s: StepRun, stage: str, devices: tuple, colocated: bool,
                    tokens: float | None = None) -> float:
        """The modelled duration of a training-side stage (through ``jigsaw_predict_duration``),
        over ``tokens`` (None: what its pass reads now)."""
        if stage in HOST_STAGES:
            return self.cost.f.adv_s
        cross = False
        if stage == "weight_sync":
            rollout = {x for r in p.replicas for x in r.devices}
            cross = bool(rollout) and len({self.nodes[x] for x in rollout | set(devices)}) > 1
        if tokens is None:
            tokens = s.pass_tokens.get(stage, s.tokens)
        return self.pricer.stage_s(p.name, stage, devices, s.n, tokens, colocated=colocated, cross_node=cross)

    def running_stage_end_t(self, p: PipelineRun) -> float | None:
        """Predicted end of the stage ``p`` runs now (its start + its priced duration)."""
        s = p.steps.get(p.early_step if p.early else p.train_next)
        stage = p.early or p.stages[p.stage_next]
        if s is None or stage not in s.stage_t:
            return None
        return s.stage_t[stage][1]

    def running_stage_view(self, p: PipelineRun):
        """``scheduler.state.RunningStageView`` of ``p``'s running stage, where this executor
        runs it micro-batch by micro-batch; None otherwise."""
        return None

    def _stage_done(self, p: PipelineRun, step: int, stage: str, devices: tuple) -> None:
        """Bookkeeping when a training-side stage ends (both executors)."""
        s = p.steps[step]
        self._release(devices)
        if p.early == stage and p.early_step == step:  # an early pass: the stage itself is still to run
            self._early_pass_done(p, s, stage, devices)
            return
        s.pass_tokens.pop(stage, None)
        start = s.stage_t.get(stage, (self.t, self.t))[0]
        s.stage_t[stage] = (start, self.t)
        s.stages_done.add(stage)
        p.stage_history.setdefault(stage, []).append(self.t - start)
        if p.alongside == stage and step == p.train_next:
            # the sequence moved past it when it started (its partner holds it); no stage run
            # alongside is an update of the actor or a sync, so what follows leaves it be
            p.alongside = None
            self.dirty = True
        else:
            p.stage_running = False
            p.stage_next += 1
        self._emit("jigsaw_stage_end", pipeline=p.name, step=step, stage=stage,
                   devices=devices, samples=s.n, tokens=s.tokens, t=self.t)
        if stage == "update_actor":
            p.max_staleness = max(p.max_staleness, p.version - s.min_version)
            s.trained_version = p.version
            p.version += 1
        if stage == "weight_sync":
            p.rollout_version = p.version
            self._on_weights_synced(p)
            self._emit("jigsaw_weight_sync_end", pipeline=p.name, step=step, version=p.version,
                       devices=devices, t=self.t)
        if p.stage_next >= len(p.stages):
            p.stage_next = 0
            p.train_next += 1
            if s.width is not None:
                p.step_widths.append((s.width, _trained_s(s)))
            self._emit("jigsaw_step_end", pipeline=p.name, step=step, t=self.t)
            if p.done:
                p.finished_t = self.t
                self._emit("jigsaw_pipeline_end", pipeline=p.name, t=self.t)

    def _early_pass_done(self, p: PipelineRun, s: StepRun, stage: str, devices: tuple) -> None:
        tokens = s.pass_tokens.pop(stage)
        s.covered[stage] = s.covered.get(stage, 0) + tokens
        s.early_passes += 1
        s.stage_t.pop(stage, None)  # the stage's own pass records its start and end
        p.early = p.early_step = None
        p.stage_running = False
        self.dirty = True
        self._emit("jigsaw_stage_end", pipeline=p.name, step=s.step, stage=stage,
                   devices=devices, samples=s.n_gen_done, tokens=tokens, t=self.t)

    def _on_weights_synced(self, p: PipelineRun) -> None:
        """New weights are live (AReaL's executor interrupts in-flight requests here)."""

    def _tool_call_returned(self, p: PipelineRun, latency_s: float) -> None:
        """A trajectory's tool call returned after ``latency_s``: what a host sees of its
        tools, for the policy's projections (``LengthSummary.tool_s``)."""
        p.observed.record_tool(latency_s)

    def _turn_finished(self, p: PipelineRun, rid: RequestId, length: int, replica: int | None = None) -> None:
        """A generation turn ended (on ``replica``, where the executor knows it): the history
        learns its length, the prediction log scores it, the snapshot's rows drop it."""
        group = rid.sample // p.spec.samples_per_prompt
        p.history.record_finished(rid.step, group, rid.turn or 0, int(length))
        self.prediction_log.finish(rid, int(length))
        note_finished(self.request_cache, p.name, rid, replica)

    def _trajectory_finished(self, p: PipelineRun, s: StepRun, sample: int) -> None:
        smp = s.samples
        off, turns = int(smp.turn_offset[sample]), int(smp.turns[sample])
        gen = int(smp.gen_tokens[off:off + turns].sum())
        obs = int(smp.observation_len[off:off + turns - 1].sum()) if turns > 1 else 0
        prompt = int(smp.prompt_len[sample])
        p.observed.record(prompt, gen, prompt + gen + obs, turns)
        s.finished_tokens += prompt + gen + obs
        s.n_gen_done += 1
        if s.n_gen_done == s.n:
            s.gen_end_t = self.t
            p.history.close_step(s.step)  # its turns, all finished: the recent lengths
            self.dirty = True
            self._emit("jigsaw_stage_end", pipeline=p.name, step=s.step, stage="gen", devices=(),
                       samples=s.n, tokens=s.generated, t=self.t)
            self._emit("jigsaw_stage_start", pipeline=p.name, step=s.step, stage="reward", devices=(),
                       samples=s.n, tokens=s.generated, t=self.t)

    def _rewarded(self, p: PipelineRun, s: StepRun, latency_s: float | None = None) -> None:
        """A trajectory's reward is in, ``latency_s`` after its generation ended (where the
        executor timed it: the policy sees the mean, ``LengthSummary.reward_s``)."""
        if latency_s is not None:
            p.observed.record_reward(latency_s)
        s.n_rewarded += 1
        if s.n_rewarded == s.n:
            s.reward_end_t = self.t
            if s.gen_end_t is not None:  # the step's wait on its rewards after its last trajectory
                p.stage_history.setdefault("reward", []).append(self.t - s.gen_end_t)
            self.dirty = True
            self._emit("jigsaw_stage_end", pipeline=p.name, step=s.step, stage="reward", devices=(),
                       samples=s.n, tokens=s.generated, t=self.t)

    def request_budget(self, p: PipelineRun, s: StepRun, sample: int, turn: int) -> int:
        """The most tokens turn ``turn`` of a sample may generate as the user configured it
        (``max_response_len`` less what earlier turns generated): observable, unlike its length."""
        smp = s.samples
        off = int(smp.turn_offset[sample])
        return int(p.spec.max_response_len - smp.gen_tokens[off:off + turn].sum())

    def _spread_into(self, p: PipelineRun, dst_id: int) -> None:
        """``LaunchReplica(spread=True)``, in every executor: the new replica ``dst_id`` takes
        requests from the most loaded of ``p``'s other replicas until it holds the average
        load, queued ones first (nothing to recompute), then running ones with the fewest
        tokens generated (the cheapest re-prefill), each moved by a ``Migrate`` (abort +
        resume with the tokens it has). Read from the replicas' observable rows."""
        live = [r for r in p.replicas if not r.retiring]
        target = sum(r.load for r in live) // max(1, len(live))
        have = next((r.load for r in live if r.id == dst_id), 0)
        for src in sorted((r for r in live if r.id != dst_id), key=lambda r: -r.load):
            want = min(src.load - target, target - have)
            if want <= 0:
                continue
            # rows: (id, group, prompt_key, context, generated, max_tokens, in_flight_s, queued)
            rows = sorted(src.request_rows(self.t), key=lambda row: (not row[7], row[4]))[:want]
            if rows:
                self._migrate(Migrate(src.id, dst_id, tuple(str(row[0].trajectory) for row in rows)))
                have += len(rows)

    # ---- what subclasses provide ---------------------------------------------------------
    def _start_gen(self, d: StartGen) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _launch(self, d: LaunchReplica) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _retire(self, rep) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _migrate(self, d: Migrate) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _limit_admission(self, rep, max_seqs: int | None) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _run_stage(self, d: RunStage) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def _resize_stage(self, d: ResizeStage) -> None:
        """Executors whose training stages cannot change width say so (the policy time-shares)."""
        raise PolicyViolation(f"{type(self).__name__} cannot resize a running stage ({d!r})")

    # ---- end of run ---------------------------------------------------------------------
    def result(self, backend: str = "sim", events: int = 0) -> dict:
        from jigsaw_plugin.core.result import build_result

        return build_result(self, backend=backend, events=events)


def _trained_s(s: StepRun) -> float:
    """A trained step's time as ``PipelineRun.step_widths`` keeps it: from its generation's
    start to the end of its last stage before the weight sync (the same at every width),
    its generation included."""
    ends = [end for stage, (_, end) in s.stage_t.items() if end is not None and stage != "weight_sync"]
    if s.gen_end_t is not None:
        ends.append(s.gen_end_t)
    start = s.gen_start_t or 0.0
    return max(ends, default=start) - start
