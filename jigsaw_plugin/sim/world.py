"""The simulated cluster: devices, replicas, pipelines, and the mechanics of each decision.

``World`` is the executor a policy's decisions run against in simulation. It owns no
policy: the engine asks the policy for decisions and hands them to ``apply``. Every
duration comes from the injected ``CostModel``.
"""

from __future__ import annotations

from jigsaw_plugin.costmodel import CostModel
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, RetireReplica, RunStage, StartGen
from jigsaw_plugin.sim.events import ReplicaTick, RewardDone, StageDone, ToolDone
from jigsaw_plugin.sim.pipeline_state import HOST_STAGES, PipelineRun, StepRun, sample_tokens
from jigsaw_plugin.sim.replica import Replica, Request

__all__ = ["World", "PolicyViolation"]


class PolicyViolation(RuntimeError):
    """A decision broke an invariant of the executor (named in the message)."""


class World:
    def __init__(self, pipelines: list[PipelineRun], gpus: int, cost: CostModel, seed: int,
                 sample_step, push, staleness_bound, hooks=None, record_requests=False,
                 resident_slots: int = 1, gpus_per_node: int = 8):
        self.pipelines = {p.name: p for p in pipelines}
        self.order = pipelines
        self.gpus = gpus
        self.gpus_per_node = gpus_per_node
        self.cost = cost
        self.seed = seed
        self._sample_step = sample_step
        self._push = push
        self._bound = staleness_bound  # pipeline -> max staleness the policy promises
        self.hooks = hooks
        self.record_requests = record_requests and hooks is not None
        self.t = 0.0
        self.free: set[int] = set(range(gpus))
        self.task: dict[int, object] = {}  # device -> replica or stage tuple
        self.resident: dict[int, list] = {d: [] for d in range(gpus)}  # LRU of pipelines' rollout weights
        self.train_resident: dict[int, str] = {}
        self.resident_slots = resident_slots
        self.replicas: dict[int, Replica] = {}
        self._next_replica = 0
        self.dirty = True
        self.busy_s = 0.0  # device-seconds of finished stages (replicas counted on retire/end)
        self.migrations = 0
        self.tail_threshold = 0  # policy asks to hear when a replica's load falls to this
        self.trace: list = []  # (name, cat, device, start, end) for the Chrome trace

    # ---- helpers ------------------------------------------------------------------------
    def _emit(self, name: str, **kw) -> None:
        if self.hooks is not None:
            getattr(self.hooks, name)(**kw)

    def _claim(self, devices: tuple, owner) -> None:
        for d in devices:
            if d not in self.free:
                raise PolicyViolation(f"device {d} is busy ({self.task.get(d)!r}); cannot run {owner!r}")
        for d in devices:
            self.free.discard(d)
            self.task[d] = owner

    def _release(self, devices: tuple) -> None:
        for d in devices:
            self.task.pop(d, None)
            self.free.add(d)
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
        else:
            missing = [d for d in devices if self.train_resident.get(d) != p.name]
            for d in devices:
                self.train_resident[d] = p.name
        if not missing:
            return 0.0
        p.context_switches += 1
        s = self.cost.context_switch_s(p.model, len(devices), train_state=(kind == "train"))
        self._emit("jigsaw_context_switch", devices=tuple(missing), from_pipeline=None,
                   to_pipeline=p.name, duration_s=s, t=self.t)
        return s

    def make_resident(self, pipeline: str, devices) -> None:
        """Preload state (a static partition starts with its pipeline resident)."""
        for d in devices:
            if pipeline not in self.resident[d]:
                self.resident[d].append(pipeline)
            self.train_resident[d] = pipeline

    def _other_weight_bytes(self, p: PipelineRun, devices: tuple) -> float:
        """Bytes per device held by other pipelines' resident rollout weights."""
        worst = 0.0
        for d in devices:
            b = sum(self.pipelines[o].model.weight_bytes / len(devices) for o in self.resident[d] if o != p.name)
            worst = max(worst, b)
        return worst

    def _schedule(self, r: Replica) -> None:
        r.tick_epoch += 1
        when = r.next_event_t()
        if when is not None:
            self._push(ReplicaTick(when, r, r.tick_epoch))

    # ---- decisions ----------------------------------------------------------------------
    def apply(self, d) -> None:
        if isinstance(d, StartGen):
            self._start_gen(d)
        elif isinstance(d, LaunchReplica):
            self._launch(d)
        elif isinstance(d, RetireReplica):
            self._retire(self.replicas[d.replica])
        elif isinstance(d, Migrate):
            self._migrate(d)
        elif isinstance(d, RunStage):
            self._run_stage(d)
        else:
            raise PolicyViolation(f"unknown decision {d!r}")

    def _open_step(self, d: StartGen):
        """Check a StartGen against the staleness bound and record the new step."""
        p = self.pipelines[d.pipeline]
        if d.step != p.gen_next or d.step >= p.total_steps:
            raise PolicyViolation(f"{p.name}: StartGen step {d.step}, expected {p.gen_next}")
        if d.step - p.rollout_version > self._bound(p):
            raise PolicyViolation(
                f"{p.name}: step {d.step} would be generated by version {p.rollout_version}, "
                f"staler than the bound {self._bound(p)}"
            )
        samples = self._sample_step(p.spec, d.step, self.seed)
        s = StepRun(step=d.step, samples=samples, n=len(samples.prompt_len))
        s.tokens, s.generated = sample_tokens(samples)
        s.gen_start_t = self.t
        s.min_version = p.rollout_version
        p.steps[d.step] = s
        p.gen_next += 1
        self._emit("jigsaw_step_start", pipeline=p.name, step=d.step, t=self.t)
        return p, s

    def _start_gen(self, d: StartGen) -> None:
        p, s = self._open_step(d)
        samples = s.samples
        self._emit("jigsaw_stage_start", pipeline=p.name, step=d.step, stage="gen",
                   devices=tuple(sorted(x for r in p.replicas for x in r.devices)),
                   samples=s.n, tokens=int(samples.prompt_len.sum()), t=self.t)
        off = samples.turn_offset
        reqs = [
            Request(p.name, d.step, i, 0, int(samples.prompt_len[i]), int(samples.gen_tokens[off[i]]),
                    p.rollout_version)
            for i in range(s.n)
        ]
        self._route_many(p, reqs)

    def _route_many(self, p: PipelineRun, reqs: list) -> None:
        touched = {}
        order = self.policy_order(p, reqs)
        for r in order:
            prev = r.replica
            rep = self.route(p, r)
            if rep is None:
                p.pending.append(r)
                continue
            if rep is not prev:
                r.cached = 0  # another server: no prefix cache for this trajectory
            r.submit_t = self.t
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

    # set by the engine: the policy's routing and ordering (pure functions of state)
    route = None
    policy_order = None
    interrupt_on_sync = False

    def _launch(self, d: LaunchReplica) -> None:
        p = self.pipelines[d.pipeline]
        devices = tuple(d.devices)
        rep_id = self._next_replica
        self._claim(devices, ("replica", p.name, rep_id))
        switch = self._switch_s(p, devices, "rollout")
        rep = Replica(rep_id, p.name, devices, p.model, self.cost,
                      self._other_weight_bytes(p, devices), ready_t=self.t)
        rep.busy_until = self.t + switch
        rep.switch_s = switch
        rep.start_t = self.t
        self._next_replica += 1
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
        src, dst = self.replicas[d.src], self.replicas[d.dst]
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
        p = self.pipelines[d.pipeline]
        if d.step != p.train_next or p.next_stage != d.stage:
            raise PolicyViolation(
                f"{p.name}: RunStage {d.stage} of step {d.step}; next is {p.next_stage} of step {p.train_next}"
            )
        s = p.steps[d.step]
        staleness = p.version - s.min_version
        if d.stage == "update_actor" and staleness > self._bound(p):
            raise PolicyViolation(f"{p.name}: step {d.step} staleness {staleness} > bound {self._bound(p)}")
        devices = tuple(d.devices)
        if d.stage in HOST_STAGES:
            dur, devices = self.cost.f.adv_s, ()
        else:
            if not devices:
                raise PolicyViolation(f"{p.name}: stage {d.stage} needs devices")
            self._claim(devices, ("stage", p.name, d.stage))
            dur = self._stage_s(p, s, d.stage, devices, d.colocated)
            dur += self._switch_s(p, devices, "train") if d.stage != "weight_sync" else 0.0
        p.stage_running = True
        self._emit("jigsaw_stage_start", pipeline=p.name, step=d.step, stage=d.stage, devices=devices,
                   samples=s.n, tokens=s.tokens, t=self.t)
        if d.stage == "weight_sync":
            self._emit("jigsaw_weight_sync_start", pipeline=p.name, step=d.step, version=p.version,
                       devices=devices, bytes=int(p.model.weight_bytes), t=self.t)
        s.stage_t[d.stage] = (self.t, self.t + dur)
        self.busy_s += dur * len(devices)
        if devices:
            self.trace.append((f"{p.name} {d.stage} s{d.step}", d.stage, devices, self.t, self.t + dur))
        self._push(StageDone(self.t + dur, p.name, d.step, d.stage, devices))

    def _stage_s(self, p, s: StepRun, stage: str, devices: tuple, colocated: bool) -> float:
        c, m, n = self.cost, p.model, len(devices)
        if stage in ("old_log_prob", "ref", "values"):
            return c.forward_s(m, n, s.tokens)
        if stage in ("update_actor", "update_critic"):
            return c.train_s(m, n, s.tokens)
        if stage == "weight_sync":
            gpn = max(1, self.gpus_per_node)
            rollout = {x for r in p.replicas for x in r.devices}
            cross = bool(rollout) and len({x // gpn for x in rollout | set(devices)}) > 1
            return c.weight_sync_s(m, colocated=colocated, cross_node=cross)
        raise PolicyViolation(f"unknown stage {stage!r}")

    # ---- event handlers -----------------------------------------------------------------
    def on_stage_done(self, ev: StageDone) -> None:
        p = self.pipelines[ev.pipeline]
        s = p.steps[ev.step]
        self._release(ev.devices)
        p.stage_running = False
        p.stage_next += 1
        self._emit("jigsaw_stage_end", pipeline=p.name, step=ev.step, stage=ev.stage,
                   devices=ev.devices, samples=s.n, tokens=s.tokens, t=self.t)
        if ev.stage == "update_actor":
            p.max_staleness = max(p.max_staleness, p.version - s.min_version)
            s.trained_version = p.version
            p.version += 1
        if ev.stage == "weight_sync":
            p.rollout_version = p.version
            if self.interrupt_on_sync:
                for rep in p.replicas:
                    rep.sync(self.t)
                    rep.interrupt(self.t)
                    self._schedule(rep)
            self._emit("jigsaw_weight_sync_end", pipeline=p.name, step=ev.step, version=p.version,
                       devices=ev.devices, t=self.t)
        if p.stage_next >= len(p.stages):
            p.stage_next = 0
            p.train_next += 1
            self._emit("jigsaw_step_end", pipeline=p.name, step=ev.step, t=self.t)
            if p.done:
                p.finished_t = self.t
                self._emit("jigsaw_pipeline_end", pipeline=p.name, t=self.t)

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
                          int(smp.gen_tokens[k + 1]), min(r.version, p.rollout_version))
            nxt.replica = rep  # sticky: the trajectory's previous server (prefix cache)
            nxt.cached = r.context + r.target
            self._push(ToolDone(self.t + float(smp.tool_latency_s[k]), nxt))
            return
        s.n_gen_done += 1
        if s.n_gen_done == s.n:
            s.gen_end_t = self.t
            self._emit("jigsaw_stage_end", pipeline=p.name, step=r.step, stage="gen", devices=(),
                       samples=s.n, tokens=s.generated, t=self.t)
            self._emit("jigsaw_stage_start", pipeline=p.name, step=r.step, stage="reward", devices=(),
                       samples=s.n, tokens=s.generated, t=self.t)
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
        s = p.steps[ev.step]
        s.n_rewarded += 1
        if s.n_rewarded == s.n:
            s.reward_end_t = self.t
            self.dirty = True
            self._emit("jigsaw_stage_end", pipeline=p.name, step=ev.step, stage="reward", devices=(),
                       samples=s.n, tokens=s.generated, t=self.t)

    # ---- end of run ---------------------------------------------------------------------
    def close_all(self) -> None:
        for rep in list(self.replicas.values()):
            rep.retiring = True
            self._close(rep)
