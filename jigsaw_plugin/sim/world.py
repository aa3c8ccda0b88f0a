"""The simulator's executor: replicas and stages on the cost model's clock.

``World`` is ``core.ExecutorCore`` plus simulated mechanics: requests decode in simulated
replicas (``sim.replica``); a training stage runs as ``micro_batches`` micro-batch
sub-stages (``MicroBatchDone``), each priced at the width it runs on, so that it can grow,
shrink or pause at a boundary (``ResizeStage``); weight syncs and host stages end at one
priced time (``StageDone``); tool calls and rewards take their sampled latencies. Every duration is priced through
``jigsaw_predict_duration`` (``core.pricing``). The event loop is ``sim.engine``.
Device classes (``sim.devices``) price each device by its class; preemptions
(``sim.preemption``) decide when a device is lost and call the small mechanics below.
"""

from __future__ import annotations

from jigsaw_plugin.core.executor import ExecutorCore, PolicyViolation
from jigsaw_plugin.core.pipelines import HOST_STAGES, PipelineRun, StepRun
from jigsaw_plugin.costmodel.colocation import split_kv
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, ResizeStage, RunStage, StartGen
from jigsaw_plugin.scheduler.state import DeviceTask, RunningStageView
from jigsaw_plugin.sim.devices import ClassPricer, DeviceClasses
from jigsaw_plugin.sim.events import MicroBatchDone, ReplicaTick, RewardDone, StageDone, ToolDone
from jigsaw_plugin.sim.preemption import RECOVERIES, Preemptions
from jigsaw_plugin.sim.replica import Replica, Request

__all__ = ["World", "PolicyViolation"]


class _StageRun:
    """A training stage in progress, micro-batch by micro-batch."""

    __slots__ = ("p", "s", "stage", "colocated", "devices", "pending", "index", "epoch", "seg_start", "boundary_t",
                 "rest", "read_before", "fixed_left")

    def __init__(self, p: PipelineRun, s: StepRun, stage: str, colocated: bool, devices: tuple, t: float):
        self.p, self.s, self.stage, self.colocated, self.devices = p, s, stage, colocated, devices
        self.pending = None  # devices from the next boundary on (ResizeStage), or None
        self.index = 0  # micro-batches done
        self.epoch = 0
        self.seg_start = t  # start of the current run of micro-batches on ``devices``
        self.boundary_t = t  # end of the micro-batch in progress
        self.rest = False  # an early pass that goes on as the stage's own pass (ResizeStage.rest)
        self.read_before = 0  # tokens its early part read, where it went on as the stage's own pass
        self.fixed_left = 0.0  # ... and the share of a pass's fixed cost its early part left unpaid


class World(ExecutorCore):
    supports_early_passes = True  # forward passes over finished trajectories while the rest generate
    reports_kv_preemptions = True  # its engines' cache overflows (Replica.preempt_overflow)
    supports_colocation = True  # two pipelines' rollout replicas may share devices (docs/colocation.md)
    supports_reshard_in_place = True  # a widened tail may take its own replicas' devices
    supports_concurrent_stages = True  # a stage on a gang of its own beside the next (algorithms.ALONGSIDE)
    supports_admission_limits = True  # a replica's batch limit set by the policy (AdmissionLimit)

    def __init__(self, workload, policy, push, seed: int = 0, micro_batches: int = 8,
                 preemption_recovery: str = "migrate", **kw):
        from collections import Counter, defaultdict

        from jigsaw_plugin.errors import SpecError

        if not isinstance(micro_batches, int) or micro_batches < 1:
            raise SpecError("micro_batches", micro_batches, "an integer >= 1")
        if preemption_recovery not in RECOVERIES:
            raise SpecError("preemption_recovery", preemption_recovery, " | ".join(RECOVERIES))
        self.t = 0.0
        self.dirty = True
        self._push = push
        self.micro_batches = micro_batches  # micro-batch sub-stages per training stage
        self._stage_runs: dict[str, _StageRun] = {}
        # replica id -> (since, its busy_s then, its time_split then) for the replica holding
        # its devices' record: a co-located guest has none until its host closes
        # (docs/colocation.md)
        self._booked: dict[int, tuple] = {}
        # replica width -> device-seconds of [memory-bound decode, compute-bound decode,
        # prefill, empty, the decode's host-side step work, its all-reduces] on the replicas
        # holding the devices' record (result: ``rollout_time``; the last two None where a
        # plugin priced a decode step)
        self.rollout_time: dict[int, list] = {}
        self.colocations: list[dict] = []  # one record per co-located pair launched
        # before the executor's init: the policy's setup reads the classes (``SchedulerState.classes``)
        self.device_classes = DeviceClasses(workload.cluster, kw.get("factors"))
        self.preemptions: Preemptions | None = None  # none at the policy's setup (t = 0)
        super().__init__(workload, policy, seed, **kw)
        self.tail_threshold = getattr(policy, "tail_threshold", 0)  # policy asks to hear when a replica's load falls to this
        self.decides_on_preemption = getattr(policy, "decides_on_preemption", False)
        self.decide_period_s = float(getattr(policy, "decide_period_s", 0.0))
        self.interrupt_on_sync = getattr(policy, "interrupt_on_sync", False)
        self._predicts_at_submit = getattr(policy, "routes_by_predicted_length", False)
        if self.device_classes.heterogeneous:
            self.pricer = ClassPricer(self.device_classes, self.pm, {p.name: p.model for p in self.order})
        # pipeline -> step -> Counter of the policy version each trained sample was generated by
        self.sample_versions: dict = defaultdict(lambda: defaultdict(Counter))
        self.preemptions = Preemptions(self, self.device_classes, preemption_recovery, seed)
        self.preemptions.start()

    def true_length(self, request_id: RequestId) -> int:
        """The sampled length of a turn (the oracle ablation's answer; never in a policy's state)."""
        s = self.pipelines[request_id.pipeline].steps[request_id.step].samples
        return int(s.gen_tokens[int(s.turn_offset[request_id.sample]) + (request_id.turn or 0)])

    def advance_engines(self) -> None:
        """Each simulated replica decodes up to now before the round (``ExecutorCore``): the
        engines' work, which the snapshot would otherwise do inside the timed round when it
        asks each replica for its report (the same sync, so the same state and decisions)."""
        t = self.t
        for p in self.order:
            for rep in p.replicas:
                if t > rep.t_sync:
                    rep.sync(t)

    def _schedule(self, r: Replica) -> None:
        self._schedule_one(r)
        partner = r.partner
        if partner is not None:  # its step is priced with r's batch: re-price it from now on
            partner.sync(self.t)
            self._schedule_one(partner)

    def _schedule_one(self, r: Replica) -> None:
        r.tick_epoch += 1
        when = r.next_event_t()
        if when is not None:
            self._push(ReplicaTick(when, r, r.tick_epoch))

    # ---- decisions ----------------------------------------------------------------------
    def _start_gen(self, d: StartGen) -> None:
        p, s = self._open_step(d)
        samples = s.samples
        self._emit("jigsaw_stage_start", pipeline=p.name, step=d.step, stage="gen",
                   devices=tuple(sorted(x for r in p.replicas for x in r.devices)),
                   samples=s.n, tokens=int(samples.prompt_len.sum()), t=self.t)
        off = samples.turn_offset
        spp = p.spec.samples_per_prompt
        reqs = [
            Request(p.name, d.step, i, 0, int(samples.prompt_len[i]), int(samples.gen_tokens[off[i]]),
                    p.rollout_version, group=i // spp, budget=p.spec.max_response_len)
            for i in range(s.n)
        ]
        self._route_many(p, reqs)

    def _predict_at_submit(self, p: PipelineRun, reqs: list) -> None:
        """The predictor's length of each new request (nothing generated yet), for policies
        that order or route by predicted length (StreamRL's skew-aware dispatch)."""
        import numpy as np

        from jigsaw_plugin.scheduler.state import RequestBatch

        n = len(reqs)
        batch = RequestBatch(
            ids=tuple(r.id for r in reqs), group=np.fromiter((r.group for r in reqs), np.int64, n),
            turn=np.fromiter((r.turn for r in reqs), np.int64, n), step=np.fromiter((r.step for r in reqs), np.int64, n),
            generated=np.fromiter((r.done for r in reqs), np.int64, n),
            max_tokens=np.fromiter((r.budget for r in reqs), np.int64, n),
            context_tokens=np.fromiter((r.context for r in reqs), np.int64, n), in_flight_s=np.zeros(n),
            replica=np.full(n, -1), queued=np.ones(n, bool), prompt_key=(None,) * n)
        for r, v in zip(reqs, self.predict_remaining(p, batch)):
            r.pred_tokens = float(v)

    def _route_many(self, p: PipelineRun, reqs: list) -> None:
        if self._predicts_at_submit and reqs:
            self._predict_at_submit(p, reqs)
        touched = {}
        for r in self.policy.order(reqs):
            prev = r.replica
            live = [x for x in p.replicas if not x.retiring]
            rep = self.policy.route(live, r)
            if rep is None:  # no replica takes it: the policy decides where it goes
                p.pending.append(r)
                self.dirty = True
                continue
            if rep is not prev:
                r.cached = 0  # another server: no prefix cache for this trajectory
            r.submit_t = self.t
            if r.done == 0:
                r.turn_submit_t = self.t
            rep.sync(self.t)
            rep.enqueue(r, self.t)
            touched[rep.id] = rep
            if self.record_requests:
                self._emit("jigsaw_request_submitted", pipeline=p.name, step=r.step, request_id=r.rid,
                           turn=r.turn, replica=rep.id, prompt_tokens=r.context + r.done,
                           max_tokens=r.remaining, t=self.t)
        for rep in touched.values():
            rep.admit(self.t)
            self._schedule(rep)

    def cost_for(self, devices: tuple):
        return self.device_classes.cost_for(devices)

    def _launch(self, d: LaunchReplica) -> None:
        p = self.pipelines[d.pipeline]
        devices = tuple(d.devices)
        cost = self.cost_for(devices)
        if cost.kv_capacity_tokens(p.model, len(devices)) <= 0:  # before anything is booked
            w = cost.rollout_width(p.model, len(devices))
            room = f"{w} of that class or " if cost.kv_capacity_tokens(p.model, w) > 0 else ""
            raise PolicyViolation(
                f"LaunchReplica.devices: {devices} for {p.name}'s {p.model.name}, whose weights leave no room "
                f"for a KV cache on {len(devices)} {cost.hw.name} device(s) ({cost.hw.memory_gb:g} GB); allowed: "
                f"{room}devices of a class with more memory")
        host, split = self._check_colocation(d, p, devices) if d.colocate_with is not None else (None, None)
        handed = self._hand_over(d, p, devices)
        rep_id = self._new_replica_id()
        if host is None:
            self._claim(devices, DeviceTask("replica", p.name, replica=rep_id))
        absent = tuple(x for x in devices if p.name not in self.resident[x])
        switch = self._switch_s(p, devices, "rollout")
        if handed:  # re-sharded in place: the weights are loaded again at the new width
            switch = max(switch, self.pricer.context_switch_s(p.name, devices, train_state=False))
        if absent:  # weights not resident: devices behind a wide-area link pull them over it
            switch += self.device_classes.weight_pull_s(p.model, [absent])
        other = split.guest_other_bytes if split is not None else self._other_weight_bytes(p, devices)
        rep = Replica(rep_id, p.name, devices, p.model, cost,
                      other, ready_t=self.t, pricer=self.pricer)
        if host is not None:
            self._pair(host, rep, split)
        else:
            self._booked[rep_id] = (self.t, 0.0, (0.0,) * 6)
        rep.busy_until = self.t + switch
        rep.switch_s = switch
        rep.start_t = self.t
        if d.max_seqs is not None:
            rep.max_seqs = d.max_seqs  # the engine's batch limit from its start (validated by apply)
        self.replicas[rep_id] = rep
        p.replicas.append(rep)
        self._emit("jigsaw_lease_granted", pipeline=p.name, devices=devices, purpose="rollout", t=self.t)
        if p.pending:
            reqs, p.pending = p.pending, []
            self._route_many(p, reqs)
        if d.rebalance:
            self._rebalance_into(p, rep)
        if d.spread:
            self._spread_into(p, rep.id)
        for src, moved in handed:
            self._move(p, src, rep, moved)
        for rid in d.absorb:
            if rid not in self.replicas:  # handed over above
                continue
            src = self.replicas[rid]
            if src.pipeline != p.name:
                raise PolicyViolation(f"replica {rid} of {src.pipeline} cannot move into {p.name}")
            src.retiring = True
            self._migrate(Migrate(rid, rep.id))

    def _hand_over(self, d: LaunchReplica, p: PipelineRun, devices: tuple) -> list:
        """An in-place re-shard: absorbed replicas whose devices the new replica takes stop
        first (their requests aborted with the tokens they have, their devices released);
        the caller resumes the requests on the new replica. Returns (replica, requests)."""
        want = set(devices)
        stopping = []
        for rid in d.absorb:  # every check before anything stops: a refusal loses nothing
            src = self.replicas.get(rid)
            if src is None:
                raise PolicyViolation(f"LaunchReplica.absorb: unknown replica {rid}; allowed: live replica ids of {p.name}")
            if src.pipeline != p.name:
                raise PolicyViolation(f"replica {rid} of {src.pipeline} cannot move into {p.name}")
            if not want & set(src.devices):
                continue
            if src.partner is not None:
                raise PolicyViolation(f"LaunchReplica.devices: {devices} take devices of replica {rid}, which shares "
                                      f"them with replica {src.partner.id}; allowed: the devices of unshared replicas")
            stopping.append(src)
        if stopping:
            held = {x for src in stopping for x in src.devices}
            busy = [x for x in devices if x not in self.free and x not in held]
            if busy:
                raise PolicyViolation(f"LaunchReplica.devices: {busy} of {devices} are busy "
                                      f"({[self.task.get(x) for x in busy]!r}); allowed: free devices and those "
                                      f"of the replicas it absorbs")
        handed = []
        for src in stopping:
            src.sync(self.t)
            moved = src.take_all()
            src.retiring = True
            self._close(src)
            handed.append((src, moved))
        return handed

    # ---- co-location (docs/colocation.md) -------------------------------------------------
    def _check_colocation(self, d: LaunchReplica, p: PipelineRun, devices: tuple):
        """Validate a co-located launch; returns the host replica and the KV split."""
        host = self.replicas.get(d.colocate_with)
        if host is None:
            raise PolicyViolation(f"LaunchReplica.colocate_with: replica {d.colocate_with} does not exist; "
                                  f"allowed: the id of a live rollout replica of another pipeline")
        if host.retiring:
            raise PolicyViolation(f"LaunchReplica.colocate_with: replica {host.id} is retiring; allowed: a live one")
        if host.pipeline == p.name:
            raise PolicyViolation(f"LaunchReplica.colocate_with: replica {host.id} belongs to {p.name} itself; "
                                  f"allowed: a replica of another pipeline (co-location pairs two pipelines)")
        if sorted(devices) != sorted(host.devices):
            raise PolicyViolation(f"LaunchReplica.devices: got {devices} to share replica {host.id}'s "
                                  f"{host.devices}; allowed: exactly the host replica's devices")
        if host.partner is not None:
            raise PolicyViolation(f"LaunchReplica.colocate_with: replica {host.id}'s devices {host.devices} "
                                  f"already carry two replicas ({host.id}, {host.partner.id}); allowed: at most two")
        cost = self.device_classes.cost_for(devices)
        split = split_kv(cost, host.model, p.model, len(devices), d.kv_share)
        host.sync(self.t)
        if split.guest_tokens <= 0 or split.host_tokens < host.kv_tokens:
            raise PolicyViolation(
                f"LaunchReplica.kv_share: {d.kv_share} of the KV room on {devices} leaves {p.name} "
                f"{split.guest_tokens} tokens and {host.pipeline}'s replica {host.id} {split.host_tokens} "
                f"tokens while it holds {host.kv_tokens:.0f}; the memory does not fit both")
        return host, split

    def _pair(self, host: Replica, guest: Replica, split) -> None:
        """Book ``guest`` beside ``host`` on its devices: the host keeps the device record
        (the trace and the gap breakdown count each device once) and shrinks its cache to
        its part of the split; both weights stay resident while the pair lives."""
        host.resize_cache(split.host_other_bytes)
        host.partner, guest.partner = guest, host
        for x in host.devices:
            self.resident[x] = [host.pipeline, guest.pipeline]
        self._devices_version += 1
        self.colocations.append({"host": host.id, "host_pipeline": host.pipeline, "guest": guest.id,
                                 "guest_pipeline": guest.pipeline, "devices": host.devices, "start_t": self.t,
                                 "end_t": None, "host_kv_tokens": host.cap, "guest_kv_tokens": guest.cap})
        host.preempt_overflow()
        self._schedule_one(host)

    def _unpair(self, rep: Replica) -> None:
        """``rep`` closes while its partner runs on: the partner keeps the devices alone (its
        KV split stays as launched: vLLM sizes its cache once)."""
        partner = rep.partner
        rep.partner = partner.partner = None
        partner.sync(self.t)
        for rec in self.colocations:
            if rec["end_t"] is None and {rec["host"], rec["guest"]} == {rep.id, partner.id}:
                rec["end_t"] = self.t
        if rep.id in self._booked:  # the device record passes to the partner from now on
            self._booked.pop(rep.id)
            self._booked[partner.id] = (self.t, partner.busy_s, partner.time_split())
            task = DeviceTask("replica", partner.pipeline, replica=partner.id)
            for x in partner.devices:
                self.task[x] = task
            self._devices_version += 1
        self._schedule_one(partner)

    def _rebalance_into(self, p: PipelineRun, dst: Replica) -> None:
        """Move queued (not yet admitted: nothing to recompute) requests from the more loaded
        replicas until ``dst`` holds the average load, then those queued at any replica
        (the most queued first) up to it: an engine that preempted requests as its KV cache
        filled holds them queued below the average load, and a replica grown for them that
        took none was retired empty the next round, then grown again, up to 8 times in one
        instant (a 7B on H100 + L40S + RTX 4090: 994 of 1,184 replicas)."""
        live = [r for r in p.replicas if not r.retiring]
        target = sum(r.load for r in live) // max(1, len(live))
        for src in sorted((r for r in live if r is not dst), key=lambda r: -r.load):
            self._move_queued(src, dst, min(src.load - target, target - dst.load))
        for src in sorted((r for r in live if r is not dst and r.queue), key=lambda r: -len(r.queue)):
            self._move_queued(src, dst, min(len(src.queue), target - dst.load))
        dst.admit(self.t)
        self._schedule(dst)

    def _move_queued(self, src: Replica, dst: Replica, n: int) -> None:
        """Move up to ``n`` of ``src``'s queued requests, the last queued first, to ``dst``."""
        if n <= 0:
            return
        src.sync(self.t)
        for r in list(src.queue)[::-1][:n]:
            src.take(r)
            dst.enqueue(r, self.t)
        src.admit(self.t)
        self._schedule(src)

    def _retire(self, rep: Replica) -> None:
        rep.retiring = True
        self.dirty = True
        if rep.load == 0:
            self._close(rep)

    def _close(self, rep: Replica) -> None:
        rep.sync(self.t)
        p = self.pipelines[rep.pipeline]
        p.kv_preemptions += rep.kv_preemptions
        p.kv_recompute_tokens += rep.kv_recompute_tokens
        p.replicas.remove(rep)
        del self.replicas[rep.id]
        rep.tick_epoch += 1
        booked = self._booked.get(rep.id)
        if booked is not None:  # it holds the device record: its time counts once per device
            since, busy0, split0 = booked
            first = since == rep.start_t
            self.busy_s += (rep.busy_s - busy0 + (rep.switch_s if first else 0.0)) * rep.tp
            into = self.rollout_time.setdefault(rep.tp, [0.0] * 6)
            for i, (now, then) in enumerate(zip(rep.time_split(), split0)):
                # the decode's host and all-reduce parts: None where a plugin priced a step
                into[i] = None if now is None or then is None or into[i] is None else into[i] + (now - then) * rep.tp
            self.trace.append((f"{rep.pipeline} rollout r{rep.id}", "rollout", rep.devices, since, self.t))
        if rep.partner is not None:
            self._unpair(rep)  # the devices stay booked by the partner
            self._booked.pop(rep.id, None)
            self._emit("jigsaw_lease_released", pipeline=rep.pipeline, devices=rep.devices, t=self.t)
            self.dirty = True
            return
        self._booked.pop(rep.id, None)
        self._release(rep.devices)
        self._emit("jigsaw_lease_released", pipeline=rep.pipeline, devices=rep.devices, t=self.t)

    def _limit_admission(self, rep: Replica, max_seqs: int | None) -> None:
        """The replica's batch limit from now on; a lower one preempts nothing, a higher one
        admits what waits at once."""
        rep.sync(self.t)
        rep.max_seqs = rep.cost.f.max_num_seqs if max_seqs is None else max_seqs
        rep.admit(self.t)
        self._schedule(rep)

    def _migrate(self, d: Migrate) -> None:
        src, dst = self.replicas.get(d.src), self.replicas.get(d.dst)
        if src is None or dst is None:
            raise PolicyViolation(f"migrate between unknown replicas {d.src} -> {d.dst}")
        if src.pipeline != dst.pipeline:
            raise PolicyViolation(f"migrate between pipelines {src.pipeline} and {dst.pipeline}")
        if dst.retiring:
            raise PolicyViolation(f"migrate into retiring replica {dst.id}")
        src.sync(self.t)
        dst.sync(self.t)
        if d.requests:
            wanted = set(d.requests)
            moved = [r for r in list(src.queue) + src.running() if r.rid in wanted]
            for r in moved:
                src.take(r)
        else:
            moved = src.take_all()
        self._move(self.pipelines[src.pipeline], src, dst, moved)

    def _move(self, p: PipelineRun, src: Replica, dst: Replica, moved: list) -> None:
        """Resume ``moved`` (taken from ``src``) on ``dst`` with the tokens they have."""
        for r in moved:
            r.migrations += 1
            p.steps[r.step].migrations += 1
            self.migrations += 1
            r.submit_t = self.t
            dst.enqueue(r, self.t)
            self._emit("jigsaw_request_migrated", pipeline=p.name, step=r.step, request_id=r.rid,
                       turn=r.turn, src_replica=src.id, dst_replica=dst.id,
                       generated_tokens=r.done, t=self.t)
        dst.admit(self.t)
        self._schedule(dst)
        if src.id in self.replicas:  # still open (not handed over in a re-shard)
            src.admit(self.t)
            self._schedule(src)
            if src.retiring and src.load == 0:
                self._close(src)
        self.dirty = True

    def _run_stage(self, d: RunStage) -> None:
        p, s, devices = self._check_stage(d)
        # priced whole: host stages, weight syncs, and a stage run alongside the sequence (on
        # its own gang, its context switch included; the micro-batched run is the sequence's)
        if d.alongside or d.stage in HOST_STAGES or d.stage == "weight_sync":
            switch = self._switch_s(p, devices, "train") if d.alongside else 0.0
            dur = switch + self.price_stage(p, s, d.stage, devices, d.colocated)
            s.stage_t[d.stage] = (self.t, self.t + dur)
            self.busy_s += dur * len(devices)
            if devices:
                self.trace.append((f"{p.name} {d.stage} s{d.step}", d.stage, devices, self.t, self.t + dur))
            self._push(StageDone(self.t + dur, p.name, d.step, d.stage, devices))
            return
        switch = self._switch_s(p, devices, "train")
        self.busy_s += switch * len(devices)
        run = _StageRun(p, s, d.stage, d.colocated, devices, self.t)
        self._stage_runs[p.name] = run
        s.stage_t[d.stage] = (self.t, self.t)
        self._next_micro_batch(run, self.t + switch)

    def price_stage(self, p: PipelineRun, s: StepRun, stage: str, devices: tuple, colocated: bool,
                    tokens: float | None = None) -> float:
        """As the core prices it; a weight sync also waits for the copy over the slowest
        wide-area link to this pipeline's replicas (ECHO-2's dissemination latency)."""
        dur = super().price_stage(p, s, stage, devices, colocated, tokens)
        if stage == "weight_sync" and self.device_classes.heterogeneous:
            dur = max(dur, self.device_classes.weight_pull_s(p.model, [r.devices for r in p.replicas]))
        return dur

    def _micro_batch_s(self, run: _StageRun, devices: tuple) -> float:
        """One micro-batch on ``devices``: the stage's price at that width, split evenly (a
        stage that never resizes costs exactly its whole-stage price). An early pass gone on
        as the stage's own pass (``ResizeStage.rest``) prices the tokens it reads past those
        its early part read, plus the share of the pass's fixed cost (its price over one
        token) the early part's micro-batches left unpaid: the two parts pay one fixed cost."""
        p, s, stage, co = run.p, run.s, run.stage, run.colocated
        if run.read_before:
            rest, read = s.pass_tokens.get(stage, s.tokens), run.read_before
            marginal = self.price_stage(p, s, stage, devices, co, rest + read) - self.price_stage(
                p, s, stage, devices, co, read)
            return (marginal + run.fixed_left * self.price_stage(p, s, stage, devices, co, 1)) / self.micro_batches
        return self.price_stage(p, s, stage, devices, co) / self.micro_batches

    def _next_micro_batch(self, run: _StageRun, start: float) -> None:
        dur = self._micro_batch_s(run, run.devices)
        run.s.stage_t[run.stage] = (run.s.stage_t[run.stage][0], start + dur * (self.micro_batches - run.index))
        self.busy_s += dur * len(run.devices)
        run.epoch += 1
        run.boundary_t = start + dur
        self._push(MicroBatchDone(start + dur, run.p.name, run.epoch))

    def _close_segment(self, run: _StageRun) -> None:
        if run.devices and self.t > run.seg_start:
            self.trace.append((f"{run.p.name} {run.stage} s{run.s.step}", run.stage, run.devices, run.seg_start,
                               self.t))
        run.seg_start = self.t

    def on_micro_batch_done(self, ev: MicroBatchDone) -> None:
        run = self._stage_runs.get(ev.pipeline)
        if run is None or ev.epoch != run.epoch:
            return
        run.index += 1
        if run.rest and run.index < self.micro_batches:
            self._go_on_as_stage(run)
        if run.index >= self.micro_batches:
            self._close_segment(run)
            del self._stage_runs[ev.pipeline]
            # a ResizeStage asked for during the last micro-batch never applies: the devices
            # it claimed beyond the stage's own go back with them
            extra = tuple(d for d in (run.pending or ()) if d not in run.devices)
            if extra:
                self._release(extra)
            self._stage_done(run.p, run.s.step, run.stage, run.devices)
            return
        if run.pending is None:
            self._next_micro_batch(run, self.t)
            return
        new, run.pending = run.pending, None
        self._close_segment(run)
        self._release(tuple(d for d in run.devices if d not in new))
        added = tuple(d for d in new if d not in run.devices)
        run.devices = new
        self._devices_version += 1
        if not new:  # paused: resumes when a ResizeStage gives it devices
            run.s.stage_t[run.stage] = (run.s.stage_t[run.stage][0], float("inf"))
            return
        switch = self._switch_s(run.p, added, "train") if added else 0.0
        self.busy_s += switch * len(new)
        self._next_micro_batch(run, self.t + switch)

    def _go_on_as_stage(self, run: _StageRun) -> None:
        """``ResizeStage.rest`` at a boundary: the early pass ends having read its
        micro-batches so far, and its gang goes on as the stage's own pass over the rest."""
        p, s, stage = run.p, run.s, run.stage
        read = s.pass_tokens[stage] * run.index // self.micro_batches
        s.pass_tokens[stage] = read
        self._close_segment(run)
        self._early_pass_done(p, s, stage, run.devices)
        p.stage_running = True
        s.stage_t[stage] = (self.t, self.t)
        self._emit("jigsaw_stage_start", pipeline=p.name, step=s.step, stage=stage, devices=run.devices,
                   samples=s.n, tokens=self._own_pass_tokens(s, stage), t=self.t)
        run.rest, run.read_before, run.fixed_left = False, read, 1.0 - run.index / self.micro_batches
        run.index = 0

    def running_stage_view(self, p: PipelineRun):
        run = self._stage_runs.get(p.name)
        if run is None:
            return None
        return RunningStageView(run.s.step, run.stage, run.devices, run.pending, self.micro_batches - run.index,
                                self.micro_batches, run.boundary_t if run.devices else float("inf"), True, run.rest)

    def _resize_stage(self, d: ResizeStage) -> None:
        run = self._stage_runs.get(d.pipeline)
        if run is None or run.s.step != d.step or run.stage != d.stage:
            raise PolicyViolation(f"{d.pipeline}: ResizeStage of {d.stage} step {d.step}, which is not running "
                                  f"micro-batch by micro-batch")
        run.rest = run.rest or d.rest  # (validated by the core: an early pass of a complete batch)
        new = tuple(d.devices)
        held = set(run.devices) | set(run.pending or ())
        for dev in (run.pending or ()):  # an earlier request not yet applied: its extra devices go back
            if dev not in new and dev not in run.devices:
                self._release((dev,))
        self._claim(tuple(x for x in new if x not in held), DeviceTask("stage", d.pipeline, stage=d.stage))
        paused = not run.devices
        run.pending = new
        if paused and new:  # a paused stage resumes at once
            run.pending = None
            run.devices = new
            run.seg_start = self.t
            switch = self._switch_s(run.p, new, "train")
            self.busy_s += switch * len(new)
            self._next_micro_batch(run, self.t + switch)

    # ---- event handlers -----------------------------------------------------------------
    def on_stage_done(self, ev: StageDone) -> None:
        self._stage_done(self.pipelines[ev.pipeline], ev.step, ev.stage, ev.devices)

    def _on_weights_synced(self, p: PipelineRun) -> None:
        if self.interrupt_on_sync:
            for rep in p.replicas:
                rep.sync(self.t)
                rep.interrupt(self.t)
                self._schedule(rep)
        self._stale_remote_sites(p)

    def _stale_remote_sites(self, p: PipelineRun) -> None:
        """A site behind a wide-area link holds the version it was last sent: the sync just
        ended pulled the new one only to the classes holding ``p``'s live replicas (it waited
        for that copy, ``price_stage``). On the others ``p``'s weights stop being resident,
        so a later launch there pulls the version over the link (``_launch``) instead of
        starting on weights sent before (the start's preload, ``make_resident``)."""
        dc = self.device_classes
        linked = [k for k, c in enumerate(dc.specs) if c.link is not None]
        if not linked:
            return
        synced = set(dc.classes_of([d for r in p.replicas for d in r.devices]))
        for k in linked:
            if k in synced:
                continue
            for d in range(dc.first[k], dc.first[k] + dc.specs[k].count):
                if p.name in self.resident[d]:
                    self.resident[d].remove(p.name)
                    self._devices_version += 1

    def on_replica_tick(self, rep: Replica) -> None:
        rep.sync(self.t)
        finished = rep.pop_finished()
        if rep.preempt_overflow() and self.decides_on_preemption:
            self.dirty = True  # its cache overflowed: the policy may hold admissions back (AdmissionLimit)
        rep.admit(self.t)
        p = self.pipelines[rep.pipeline]
        for r in finished:
            self._turn_done(p, r, rep)
        if rep.retiring and rep.load == 0:
            self._close(rep)
        else:
            self._schedule(rep)
            if finished and rep.load <= self.tail_threshold:
                self.dirty = True

    def _turn_done(self, p: PipelineRun, r: Request, rep: Replica) -> None:
        s = p.steps[r.step]
        smp = s.samples
        self._turn_finished(p, r.id, r.target, rep.id)
        if self.record_requests:
            self._emit("jigsaw_request_finished", pipeline=p.name, step=r.step, request_id=r.rid,
                       turn=r.turn, replica=rep.id, generated_tokens=r.target, t=self.t)
        last = r.turn + 1 >= int(smp.turns[r.sample])
        if not last:
            k = int(smp.turn_offset[r.sample]) + r.turn
            if self.record_requests:
                self._emit("jigsaw_tool_call_start", pipeline=p.name, step=r.step, request_id=r.rid,
                           turn=r.turn, t=self.t)
            nxt = Request(p.name, r.step, r.sample, r.turn + 1,
                          r.context + r.target + int(smp.observation_len[k]),
                          int(smp.gen_tokens[k + 1]), min(r.version, p.rollout_version),
                          group=r.group, budget=r.budget - r.target)
            nxt.replica = rep  # sticky: the trajectory's previous server (prefix cache)
            nxt.cached = r.context + r.target
            nxt.tool_t = self.t
            self._push(ToolDone(self.t + float(smp.tool_latency_s[k]), nxt))
            return
        self._trajectory_finished(p, s, r.sample)
        s.min_version = min(s.min_version, r.version)
        self.sample_versions[p.name][r.step][r.version] += 1
        latency = float(smp.reward_latency_s[r.sample])
        self._push(RewardDone(self.t + latency, p.name, r.step, r.version, latency))

    def on_tool_done(self, r: Request) -> None:
        p = self.pipelines[r.pipeline]
        self._tool_call_returned(p, self.t - r.tool_t)
        if self.record_requests:
            self._emit("jigsaw_tool_call_end", pipeline=p.name, step=r.step, request_id=r.rid,
                       turn=r.turn - 1, observation_tokens=r.context - r.cached, t=self.t)
        self._route_many(p, [r])

    def on_reward_done(self, ev: RewardDone) -> None:
        p = self.pipelines[ev.pipeline]
        self._rewarded(p, p.steps[ev.step], ev.latency_s)

    # ---- preemption mechanics (sim.preemption decides when) -------------------------------
    def stage_run_on(self, device: int) -> _StageRun | None:
        """The micro-batched training stage running on ``device``, if any."""
        for run in self._stage_runs.values():
            if device in run.devices:
                return run
        return None

    def restart_stage(self, run: _StageRun, device: int, resume_t: float) -> None:
        """A device of a training gang was preempted: the micro-batches done since the last
        checkpointed version (the stage's start: the version is bumped only when an update
        ends) are lost, and the stage runs again from ``resume_t`` (the replacement joins),
        the replacement loading the training state first."""
        self._close_segment(run)
        self.train_resident.pop(device, None)
        self.resident[device] = []
        run.index = 0
        run.seg_start = resume_t
        switch = self._switch_s(run.p, run.devices, "train")
        self.busy_s += switch * len(run.devices)
        self._next_micro_batch(run, resume_t + switch)

    def lose_replica(self, rep: Replica, keep_tokens: bool) -> list:
        """A device of ``rep`` was preempted: close it and resume its in-flight requests on
        the pipeline's other replicas through the migration path (re-prefill priced), with
        the tokens they generated (``keep_tokens``). Without (the baseline that restarts
        the step), every request of the same steps still in flight on any replica of the
        pipeline is generated again from its first token."""
        rep.sync(self.t)
        partner = rep.partner
        moved = rep.take_all()
        rep.retiring = True
        self._close(rep)
        if partner is not None and partner.id in self.replicas:  # it shared the lost device
            self.lose_replica(partner, keep_tokens)
        p = self.pipelines[rep.pipeline]
        if not keep_tokens:
            steps = {r.step for r in moved}
            for other in p.replicas:
                other.sync(self.t)
                hit = [r for r in list(other.queue) + other.running() if r.step in steps]
                for r in hit:
                    other.take(r)
                other.admit(self.t)
                self._schedule(other)
                moved += hit
            for r in moved:
                r.done = 0
        self._route_many(p, moved)
        self.dirty = True
        return moved

    def push_event(self, ev) -> None:
        self._push(ev)

    def take_down(self, device: int) -> None:
        """A free device leaves the pool; nothing stays resident on it."""
        self.free.discard(device)
        self.resident[device] = []
        self.train_resident.pop(device, None)
        self._devices_version += 1

    def bring_up(self, device: int) -> None:
        """The replacement of a preempted device joins the pool (empty)."""
        self._release((device,))

    def preemptions_seen(self) -> tuple:
        if self.preemptions is None or not any(self.preemptions.count):
            return ()
        return self.preemptions.seen(self.t)

    # ---- end of run ---------------------------------------------------------------------
    def close_all(self) -> None:
        for rep in list(self.replicas.values()):
            rep.retiring = True
            self._close(rep)
