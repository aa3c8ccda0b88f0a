"""The simulator's executor: replicas and stages on the cost model's clock.

``World`` is ``core.ExecutorCore`` plus simulated mechanics: requests decode in simulated
replicas (``sim.replica``); a training stage runs as ``micro_batches`` micro-batch
sub-stages (``MicroBatchDone``), each priced at the width it runs on, so that it can grow,
shrink or pause at a boundary (``ResizeStage``); weight syncs and host stages end at one
priced time (``StageDone``); tool calls and rewards take their sampled latencies. Every duration is priced through
``jigsaw_predict_duration`` (``core.pricing``). The event loop is ``sim.engine``.
"""

from __future__ import annotations

from jigsaw_plugin.core.executor import ExecutorCore, PolicyViolation
from jigsaw_plugin.core.pipelines import HOST_STAGES, PipelineRun, StepRun
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, ResizeStage, RunStage, StartGen
from jigsaw_plugin.scheduler.state import DeviceTask, RunningStageView
from jigsaw_plugin.sim.events import MicroBatchDone, ReplicaTick, RewardDone, StageDone, ToolDone
from jigsaw_plugin.sim.replica import Replica, Request

__all__ = ["World", "PolicyViolation"]


class _StageRun:
    """A training stage in progress, micro-batch by micro-batch."""

    __slots__ = ("p", "s", "stage", "colocated", "devices", "pending", "index", "epoch", "seg_start", "boundary_t")

    def __init__(self, p: PipelineRun, s: StepRun, stage: str, colocated: bool, devices: tuple, t: float):
        self.p, self.s, self.stage, self.colocated, self.devices = p, s, stage, colocated, devices
        self.pending = None  # devices from the next boundary on (ResizeStage), or None
        self.index = 0  # micro-batches done
        self.epoch = 0
        self.seg_start = t  # start of the current run of micro-batches on ``devices``
        self.boundary_t = t  # end of the micro-batch in progress


class World(ExecutorCore):
    def __init__(self, workload, policy, push, seed: int = 0, micro_batches: int = 8, **kw):
        from jigsaw_plugin.errors import SpecError

        if not isinstance(micro_batches, int) or micro_batches < 1:
            raise SpecError("micro_batches", micro_batches, "an integer >= 1")
        self.t = 0.0
        self.dirty = True
        self._push = push
        self.micro_batches = micro_batches  # micro-batch sub-stages per training stage
        self._stage_runs: dict[str, _StageRun] = {}
        super().__init__(workload, policy, seed, **kw)
        self.tail_threshold = getattr(policy, "tail_threshold", 0)  # policy asks to hear when a replica's load falls to this
        self.interrupt_on_sync = getattr(policy, "interrupt_on_sync", False)
        self._predicts_at_submit = getattr(policy, "routes_by_predicted_length", False)

    def true_length(self, request_id: RequestId) -> int:
        """The sampled length of a turn (the oracle ablation's answer; never in a policy's state)."""
        s = self.pipelines[request_id.pipeline].steps[request_id.step].samples
        return int(s.gen_tokens[int(s.turn_offset[request_id.sample]) + (request_id.turn or 0)])

    def _schedule(self, r: Replica) -> None:
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
            if rep is None:
                p.pending.append(r)
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

    def _launch(self, d: LaunchReplica) -> None:
        p = self.pipelines[d.pipeline]
        devices = tuple(d.devices)
        rep_id = self._new_replica_id()
        self._claim(devices, DeviceTask("replica", p.name, replica=rep_id))
        switch = self._switch_s(p, devices, "rollout")
        rep = Replica(rep_id, p.name, devices, p.model, self.cost, self._other_weight_bytes(p, devices),
                      ready_t=self.t, pricer=self.pricer)
        rep.busy_until = self.t + switch
        rep.switch_s = switch
        rep.start_t = self.t
        self.replicas[rep_id] = rep
        p.replicas.append(rep)
        self._emit("jigsaw_lease_granted", pipeline=p.name, devices=devices, purpose="rollout", t=self.t)
        if p.pending:
            reqs, p.pending = p.pending, []
            self._route_many(p, reqs)
        if d.rebalance:
            self._rebalance_into(p, rep)
        for rid in d.absorb:
            src = self.replicas[rid]
            if src.pipeline != p.name:
                raise PolicyViolation(f"replica {rid} of {src.pipeline} cannot move into {p.name}")
            src.retiring = True
            self._migrate(Migrate(rid, rep.id))

    def _rebalance_into(self, p: PipelineRun, dst: Replica) -> None:
        """Move queued (not yet admitted: nothing to recompute) requests from the more loaded
        replicas until ``dst`` holds the average load."""
        live = [r for r in p.replicas if not r.retiring]
        target = sum(r.load for r in live) // max(1, len(live))
        for src in sorted((r for r in live if r is not dst), key=lambda r: -r.load):
            want = min(src.load - target, target - dst.load)
            if want <= 0:
                continue
            src.sync(self.t)
            for r in list(src.queue)[::-1][:want]:
                src.take(r)
                dst.enqueue(r, self.t)
            src.admit(self.t)
            self._schedule(src)
        dst.admit(self.t)
        self._schedule(dst)

    def _retire(self, rep: Replica) -> None:
        rep.retiring = True
        self.dirty = True
        if rep.load == 0:
            self._close(rep)

    def _close(self, rep: Replica) -> None:
        rep.sync(self.t)
        p = self.pipelines[rep.pipeline]
        p.replicas.remove(rep)
        del self.replicas[rep.id]
        self.busy_s += (rep.busy_s + rep.switch_s) * rep.tp
        self.trace.append((f"{rep.pipeline} rollout r{rep.id}", "rollout", rep.devices, rep.start_t, self.t))
        rep.tick_epoch += 1
        self._release(rep.devices)
        self._emit("jigsaw_lease_released", pipeline=rep.pipeline, devices=rep.devices, t=self.t)

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
        p = self.pipelines[src.pipeline]
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
        src.admit(self.t)
        self._schedule(src)
        self._schedule(dst)
        if src.retiring and src.load == 0:
            self._close(src)
        self.dirty = True

    def _run_stage(self, d: RunStage) -> None:
        p, s, devices = self._check_stage(d)
        if d.stage in HOST_STAGES or d.stage == "weight_sync":
            dur = self.price_stage(p, s, d.stage, devices, d.colocated)
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

    def _micro_batch_s(self, run: _StageRun, devices: tuple) -> float:
        """One micro-batch on ``devices``: the stage's price at that width, split evenly (a
        stage that never resizes costs exactly its whole-stage price)."""
        return self.price_stage(run.p, run.s, run.stage, devices, run.colocated) / self.micro_batches

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
        if run.index >= self.micro_batches:
            self._close_segment(run)
            del self._stage_runs[ev.pipeline]
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

    def running_stage_view(self, p: PipelineRun):
        run = self._stage_runs.get(p.name)
        if run is None:
            return None
        return RunningStageView(run.s.step, run.stage, run.devices, run.pending, self.micro_batches - run.index,
                                self.micro_batches, run.boundary_t if run.devices else float("inf"), True)

    def _resize_stage(self, d: ResizeStage) -> None:
        run = self._stage_runs.get(d.pipeline)
        if run is None or run.s.step != d.step or run.stage != d.stage:
            raise PolicyViolation(f"{d.pipeline}: ResizeStage of {d.stage} step {d.step}, which is not running "
                                  f"micro-batch by micro-batch")
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

    def on_replica_tick(self, rep: Replica) -> None:
        rep.sync(self.t)
        finished = rep.pop_finished()
        rep.preempt_overflow()
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
        self._turn_finished(p, r.id, r.target)
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
            self._push(ToolDone(self.t + float(smp.tool_latency_s[k]), nxt))
            return
        self._trajectory_finished(p, s, r.sample)
        s.min_version = min(s.min_version, r.version)
        self._push(RewardDone(self.t + float(smp.reward_latency_s[r.sample]), p.name, r.step, r.version))

    def on_tool_done(self, r: Request) -> None:
        p = self.pipelines[r.pipeline]
        if self.record_requests:
            self._emit("jigsaw_tool_call_end", pipeline=p.name, step=r.step, request_id=r.rid,
                       turn=r.turn - 1, observation_tokens=r.context - r.cached, t=self.t)
        self._route_many(p, [r])

    def on_reward_done(self, ev: RewardDone) -> None:
        p = self.pipelines[ev.pipeline]
        self._rewarded(p, p.steps[ev.step])

    # ---- end of run ---------------------------------------------------------------------
    def close_all(self) -> None:
        for rep in list(self.replicas.values()):
            rep.retiring = True
            self._close(rep)
