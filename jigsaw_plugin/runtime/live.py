"""The live executor: the same policies and bookkeeping, on live rollout engines in real time.

``LiveExecutor`` is ``core.ExecutorCore`` (the simulator's sibling, not its subclass) plus
live mechanics: rollouts are real requests sent through one ``Router`` per pipeline to
engines made by ``engine_factory`` (vLLM engines, or EMULATED ones for control-plane
tests); training stages run through ``stage_runner`` (default: the cost model's duration,
slept), which is handed each sample's ``(prompt ids, response ids, prompt index, response
mask)`` (runtime/reference/stage_runner.py); time is the wall clock (``t`` in model
seconds: wall seconds / ``time_scale``).

What the policy reads of a replica (load, KV, the requests it runs and their tokens so
far) comes from the router's live records; a request's remaining work is predicted
(``jigsaw_predict_remaining``), as in the simulator. The engine is told how many tokens
to generate, to reproduce a workload; that number never reaches the policy.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import Counter, defaultdict

from jigsaw_plugin.core.executor import ExecutorCore, PolicyViolation
from jigsaw_plugin.core.snapshot import ReplicaObs
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.runtime.router import Router, RouterError
from jigsaw_plugin.algorithms import FORWARD_STAGES, UPDATE_STAGES
from jigsaw_plugin.scheduler.base import LIVE_RECHECK_S
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, ResizeStage, RunStage, StartGen
from jigsaw_plugin.scheduler.state import DeviceTask

__all__ = ["LiveExecutor", "LiveReplica", "run_live", "run_executor"]


class LiveReplica:
    """A live engine as the executor tracks it."""

    def __init__(self, rid: int, pipeline, devices: tuple, router: Router, cost, pricer, budgets: dict, spawn=None):
        self.id, self.pipeline, self.devices, self.tp = rid, pipeline.name, devices, len(devices)
        self._spp, self._max_len = pipeline.spec.samples_per_prompt, pipeline.spec.max_response_len
        model = pipeline.model
        self.spawn = spawn  # runs a coroutine on the executor's loop (interrupt's aborts)
        self.router, self.model, self.cost, self._pricer = router, model, cost, pricer
        self._budgets = budgets  # turn id -> (budget tokens, submit time): what the user configured
        self.cap = cost.kv_capacity_tokens(model, self.tp)
        self.max_seqs = cost.f.max_num_seqs
        self.retiring = False
        self.start_t = 0.0

    def records(self) -> list:
        """The router's records of the requests on this engine."""
        return self.router.records_on(self.id)

    @property
    def load(self) -> int:
        return self.router.load(self.id)

    @property
    def inflight(self) -> int:
        return self.load

    predicted_work = 0.0  # the router routes live requests itself (least in flight, sticky)

    def observe(self, t: float) -> ReplicaObs:
        recs = self.records()
        load = self.load
        running = min(load, self.max_seqs)
        kv = float(sum(len(r.prompt) + len(r.prefix) + len(r.live) for r in recs))
        step = self._pricer.decode_step_s(self.pipeline, self.devices, max(1, running), kv)
        return ReplicaObs(running, max(0, load - self.max_seqs), kv, float(self.cap), self.max_seqs, step, 0.0)

    def request_rows(self, t: float) -> list:
        rows = []
        for rec in self.records():
            rid = RequestId.parse(rec.request_id)
            # the user's budget, never the record's max_tokens (the engine's stop length)
            budget, submit_t = self._budgets.get(rec.request_id, (self._max_len, t))
            rows.append((rid, rid.sample // self._spp, None, len(rec.prompt), len(rec.prefix) + len(rec.live),
                         budget, t - submit_t, False))
        return rows

    def interrupt(self) -> None:
        """New weights arrived mid-generation: abort every running segment; the router
        resumes each with its tokens so far (sticky: on this replica), and the engine
        recomputes their KV under the new weights (AReaL's interruptible rollout)."""
        segments = [(self.router.engine(self.id), f"{r.request_id}#{r.segments}") for r in self.records()]
        if segments and self.spawn is not None:
            async def abort_all():
                for engine, segment in segments:
                    await engine.abort(segment)

            self.spawn(abort_all())


class _StageGrant:
    """The devices a running training stage may use from its next micro-batch on: the
    stage runner asks it at every boundary (``stage_runner.run(..., grant=)``); devices it
    no longer uses are handed back to the executor at that boundary, never before."""

    def __init__(self, ex, p, step: int, stage: str, devices: tuple):
        self._ex, self.p, self.step, self.stage = ex, p, step, stage
        self.devices = devices  # what runs now
        self.wanted = devices  # what the policy granted (ResizeStage)
        self.seg_start = ex.t
        self.first_end = None  # the first boundary where the devices changed

    def __call__(self, request=None) -> tuple:
        if self.wanted != self.devices:
            self._ex._stage_boundary(self)
        return self.devices


def _tokens(seed: str, n: int) -> list[int]:
    base = zlib.crc32(seed.encode())
    return [(base + 7919 * j) % 2048 for j in range(int(n))]


class LiveExecutor(ExecutorCore):
    """Executes decisions on live engines; see the module docstring."""

    def __init__(self, workload, policy, engine_factory, seed: int = 0, time_scale: float = 1.0,
                 stage_runner=None, sampling: dict | None = None, resize_stages: bool = False, tools=None,
                 **core_kw):
        self._t0 = 0.0
        self._wake: asyncio.Event | None = None
        self._dirty = True
        self.time_scale = time_scale
        super().__init__(workload, policy, seed, **core_kw)
        self.engine_factory = engine_factory
        self.stage_runner = stage_runner
        # run training stages micro-batch by micro-batch on a grant, so that ResizeStage can
        # change their width (off: each stage is one call on its devices, as before)
        self.resize_stages = resize_stages
        self.sampling = dict(sampling or {})  # Router SAMPLING_KEYS; a seed is made per request
        # agentic tool calls and sandboxed rewards: ``await tools.tool_call(pipeline, request_id, turn, context,
        # latency_s, observation_tokens) -> tokens``, ``await tools.reward(pipeline, step, request_id, prompt,
        # response, mask, latency_s)`` (runtime/reference/agentic.py); None: their latencies are slept
        self.tools = tools
        self.faults: list[dict] = []  # replicas whose engine died, in order
        self.trajectories: dict = {}  # with a stage_runner: (pipeline, step) -> {sample: trajectory}
        # pipeline -> step -> Counter(version of each sample): the result's per-sample staleness
        # histogram (build_result), as the simulator records it
        self.sample_versions: dict = {p.name: defaultdict(Counter) for p in self.order}
        self.routers = {p.name: Router(on_event=self._router_event(p.name)) for p in self.order}
        self._budgets: dict = {p.name: {} for p in self.order}  # turn id -> (budget, submit time)
        # trajectories between two turns (waiting on a tool): their next turn is not submitted yet
        self._between_turns: dict[str, set] = {p.name: set() for p in self.order}
        self._grants: dict[str, _StageGrant] = {}  # pipeline -> its running micro-batched stage
        self._tasks: set = set()
        self._error = None
        self.down: set[int] = set()  # preempted devices until their replacement joins (take_down / bring_up)
        self.router_listeners: list = []  # each called (pipeline, event name, **kw) for every router event

    # ---- clock and wake-ups -------------------------------------------------------------
    @property
    def t(self) -> float:
        if not self._t0:
            return 0.0
        return (time.monotonic() - self._t0) / self.time_scale

    @property
    def dirty(self) -> bool:
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value
        if value and self._wake is not None:
            self._wake.set()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._error = task.exception()
            self.dirty = True

    def _router_event(self, pipeline):
        def on_event(name, **kw):
            for listener in self.router_listeners:
                listener(pipeline, name, **kw)
            if name == "migrated":
                rid = RequestId.parse(kw["request_id"])
                self.migrations += 1
                self.pipelines[pipeline].steps[rid.step].migrations += 1
            elif name == "replica_died":
                self._replica_died(pipeline, kw["replica"], kw["request_id"], kw["generated_tokens"])
            elif name in ("waiting", "placed"):  # an evicted request with no live replica: pending
                traj = str(RequestId.parse(kw["request_id"]).trajectory)
                pending = self.pipelines[pipeline].pending
                if name == "waiting":
                    pending.append(traj)
                elif traj in pending:
                    pending.remove(traj)
                self.dirty = True
        return on_event

    def _replica_died(self, pipeline: str, replica: int, request_id: str, generated: int) -> None:
        """A fault: the router already resumes the replica's requests elsewhere; here the
        replica is closed (its devices go back to the policy, which may launch another)
        and the engine is reported dead to whoever lent it (``mark_dead``)."""
        rep = self.replicas.get(replica)
        if rep is None:
            return
        engine = self.routers[pipeline].engine(replica)
        if hasattr(engine, "mark_dead"):
            engine.mark_dead()
        self.faults.append({"pipeline": pipeline, "replica": replica, "devices": rep.devices,
                            "request_id": request_id, "t": self.t})
        rid = RequestId.parse(request_id)
        self._emit("jigsaw_request_aborted", pipeline=pipeline, step=rid.step, request_id=str(rid.trajectory),
                   turn=rid.turn, replica=replica, generated_tokens=generated, reason="fault", t=self.t)
        self._close(rep, force=True)
        self.dirty = True

    # ---- decisions ----------------------------------------------------------------------
    def _start_gen(self, d: StartGen) -> None:
        p, s = self._open_step(d)
        for i in range(s.n):
            self._spawn(self._trajectory(p, s, i))

    async def _trajectory(self, p, s, i: int) -> None:
        smp, router = s.samples, self.routers[p.name]
        off, turns = int(smp.turn_offset[i]), int(smp.turns[i])
        traj = RequestId(p.name, s.step, i)
        rid = str(traj)
        group = i // p.spec.samples_per_prompt  # the samples of one prompt share it (a GRPO group)
        context = _tokens(f"{p.name}/{s.step}/prompt{group}", smp.prompt_len[i])
        prompt, mask = list(context), []  # mask: 1 on generated tokens, 0 on observations
        version = p.rollout_version
        for turn in range(turns):
            turn_id = str(traj.at_turn(turn))
            self._budgets[p.name][turn_id] = (self.request_budget(p, s, i, turn), self.t)
            while True:
                if self.record_requests:  # the router picks the replica: None here
                    self._emit("jigsaw_request_submitted", pipeline=p.name, step=s.step, request_id=rid, turn=turn,
                               replica=None, prompt_tokens=len(context), max_tokens=int(smp.gen_tokens[off + turn]),
                               t=self.t)
                try:
                    out = await router.generate(turn_id, context, int(smp.gen_tokens[off + turn]), sticky=rid,
                                                sampling=self._sampling(turn_id))
                    break
                except RouterError:  # no live replica: wait for the policy to launch one
                    p.pending.append(rid)
                    self.dirty = True
                    await self._replica_added(p)
                    p.pending.remove(rid)
            self._budgets[p.name].pop(turn_id, None)
            self._turn_finished(p, traj.at_turn(turn), len(out))
            self._emit("jigsaw_request_finished", pipeline=p.name, step=s.step, request_id=rid, turn=turn,
                       replica=router.trajectory_replica(rid), generated_tokens=len(out), t=self.t)
            self._after_finish(p)
            context = context + out
            mask += [1] * len(out)
            if turn + 1 < turns:
                latency_s, n_obs = float(smp.tool_latency_s[off + turn]), int(smp.observation_len[off + turn])
                self._emit("jigsaw_tool_call_start", pipeline=p.name, step=s.step, request_id=rid, turn=turn, t=self.t)
                self._between_turns[p.name].add(rid)
                called_t = self.t
                if self.tools is not None:  # a tool server answers over HTTP (runtime/tool_server.py)
                    obs = list(await self.tools.tool_call(p.name, rid, turn, context, latency_s * self.time_scale,
                                                          n_obs))
                else:
                    await asyncio.sleep(latency_s * self.time_scale)
                    obs = _tokens(f"{rid}/obs{turn}", n_obs)
                self._between_turns[p.name].discard(rid)
                self._tool_call_returned(p, self.t - called_t)
                self._emit("jigsaw_tool_call_end", pipeline=p.name, step=s.step, request_id=rid, turn=turn,
                           observation_tokens=len(obs), t=self.t)
                context, mask = context + obs, mask + [0] * len(obs)
        if self.stage_runner is not None:  # what the training stages read
            self.trajectories.setdefault((p.name, s.step), {})[i] = (prompt, context[len(prompt):], group, mask)
        router.end_trajectory(rid)
        s.min_version = min(s.min_version, version)
        self.sample_versions[p.name][s.step][version] += 1
        self._trajectory_finished(p, s, i)
        scored_t = self.t
        reward_s = float(smp.reward_latency_s[i]) * self.time_scale
        if self.tools is not None and p.spec.reward.kind == "sandbox":  # the tool server's sandbox
            await self.tools.reward(p.name, s.step, rid, prompt, context[len(prompt):], mask, reward_s)
        else:
            await asyncio.sleep(reward_s)
        self._rewarded(p, s, self.t - scored_t)

    def _sampling(self, request_id: str) -> dict:
        """The run's sampling keywords, with a per-request seed (the samples of one GRPO
        group share a prompt: one seed for all would make them identical)."""
        if self.sampling.get("sampling_seed") is None:
            return self.sampling
        return {**self.sampling, "sampling_seed": (int(self.sampling["sampling_seed"])
                                                   + zlib.crc32(request_id.encode())) % 2**31}

    async def _replica_added(self, p) -> None:
        while not [r for r in p.replicas if not r.retiring]:
            await asyncio.sleep(0.001)

    def _after_finish(self, p) -> None:
        for rep in list(p.replicas):
            if rep.retiring and rep.load == 0:
                self._close(rep)
            elif rep.load <= getattr(self.policy, "tail_threshold", 0):
                self.dirty = True

    def _launch(self, d: LaunchReplica) -> None:
        p = self.pipelines[d.pipeline]
        devices = tuple(d.devices)
        rid = self._new_replica_id()
        self._claim(devices, DeviceTask("replica", p.name, replica=rid))
        self._switch_s(p, devices, "rollout")
        rep = LiveReplica(rid, p, devices, self.routers[p.name], self.cost, self.pricer, self._budgets[p.name],
                          spawn=self._spawn)
        rep.start_t = self.t
        self.routers[p.name].add_replica(rid, self.engine_factory(p, devices))
        self.replicas[rid] = rep
        p.replicas.append(rep)
        self._emit("jigsaw_lease_granted", pipeline=p.name, devices=devices, purpose="rollout", t=self.t)
        if d.rebalance:
            self._rebalance_into(p)
        if d.spread:
            self._spread_into(p, rid)
        for src in d.absorb:
            self._retire(self.replicas[src])
            self._migrate(Migrate(src, rid))

    def _rebalance_into(self, p) -> None:
        """``LaunchReplica(rebalance=True)`` live: take over work not yet admitted. A live
        engine admits every request at once, so none waits in front of it; what is not yet
        admitted is the next turn of each trajectory waiting on a tool. Those forget their
        replica (sticky routing), so the router sends each next turn, with the whole context
        so far, to the replica with the fewest in flight: the new one first."""
        router = self.routers[p.name]
        for traj in self._between_turns[p.name]:
            router.end_trajectory(traj)

    def _retire(self, rep) -> None:
        rep.retiring = True
        self.routers[rep.pipeline].mark_retiring(rep.id)
        self.dirty = True
        if rep.load == 0:
            self._close(rep)

    def _close(self, rep, force: bool = False) -> None:
        if rep.id not in self.replicas:
            return
        p = self.pipelines[rep.pipeline]
        p.replicas.remove(rep)
        del self.replicas[rep.id]
        self.routers[rep.pipeline].detach_replica(rep.id, force=True)
        self.trace.append((f"{rep.pipeline} rollout r{rep.id}", "rollout", rep.devices, rep.start_t, self.t))
        self.busy_s += (self.t - rep.start_t) * rep.tp
        self._release(rep.devices)
        self._emit("jigsaw_lease_released", pipeline=rep.pipeline, devices=rep.devices, t=self.t)

    def _migrate(self, d: Migrate) -> None:
        """Mark the requests to move and release a retiring source at once (as the
        simulator does, so the policy's plan holds); the aborts follow asynchronously."""
        src, dst = self.replicas.get(d.src), self.replicas.get(d.dst)
        if src is None or dst is None:
            raise PolicyViolation(f"migrate between unknown replicas {d.src} -> {d.dst}")
        if src.pipeline != dst.pipeline:
            raise PolicyViolation(f"migrate between pipelines {src.pipeline} and {dst.pipeline}")
        router = self.routers[src.pipeline]
        wanted = set(d.requests) if d.requests else None
        aborts = []
        for rec in src.records():
            if wanted is None or str(RequestId.parse(rec.request_id).trajectory) in wanted:
                pending = router.begin_migrate(rec.request_id, dst.id)
                if pending is not None:
                    aborts.append(pending)
        if src.retiring and (wanted is None or src.load == len(aborts)):
            self._close(src)

        async def abort_all():
            for engine, segment in aborts:
                await engine.abort(segment)
            self.dirty = True

        self._spawn(abort_all())

    def _on_weights_synced(self, p) -> None:
        if getattr(self.policy, "interrupt_on_sync", False):
            for rep in p.replicas:
                rep.interrupt()

    def _resizable(self, p, stage: str) -> bool:
        """A stage the runner executes micro-batch by micro-batch on granted devices (the
        runner says so: ``stage_runner.resizable(pipeline, stage)``)."""
        check = getattr(self.stage_runner, "resizable", None)
        return (self.resize_stages and stage in FORWARD_STAGES + UPDATE_STAGES and check is not None
                and bool(check(p, stage)))

    def _run_stage(self, d: RunStage) -> None:
        p, s, devices = self._check_stage(d)
        modelled = self.price_stage(p, s, d.stage, devices, d.colocated)
        if devices and d.stage != "weight_sync":
            modelled += self._switch_s(p, devices, "train")
        start = self.t
        s.stage_t[d.stage] = (start, start + modelled)  # predicted end until it ends
        grant = _StageGrant(self, p, d.step, d.stage, devices) if self._resizable(p, d.stage) else None
        if grant is not None:
            self._grants[p.name] = grant
        at = len(self.trace) if devices else None
        if devices:
            self.trace.append((f"{p.name} {d.stage} s{d.step}", d.stage, devices, start, start + modelled))
        traj = self.trajectories.get((p.name, d.step), {})

        async def run():
            if self.stage_runner is None:  # the cost model's duration, slept (emulated)
                await asyncio.sleep(modelled * self.time_scale)
            elif grant is not None:
                await self.stage_runner.run(p, d.step, d.stage, devices, [traj[i] for i in sorted(traj)], grant=grant)
            else:
                await self.stage_runner.run(p, d.step, d.stage, devices, [traj[i] for i in sorted(traj)])
            held, end = devices, self.t
            if grant is not None:
                self._grants.pop(p.name, None)
                held = grant.devices
                self.busy_s += (self.t - grant.seg_start) * len(held)
                if grant.wanted != grant.devices:  # granted but never joined: back to the pool
                    self._release(tuple(x for x in grant.wanted if x not in grant.devices))
                if grant.first_end is not None:
                    end = grant.first_end
                    if held:
                        self.trace.append((f"{p.name} {d.stage} s{d.step}", d.stage, held, grant.seg_start, self.t))
            else:
                self.busy_s += (self.t - start) * len(devices)
            if at is not None:
                self.trace[at] = self.trace[at][:4] + (end,)
            if d.stage == p.stages[-1]:
                self.trajectories.pop((p.name, d.step), None)
            self._stage_done(p, d.step, d.stage, held)
            self.dirty = True

        self._spawn(run())

    def _resize_stage(self, d: ResizeStage) -> None:
        """Grow, shrink or pause a running stage from its next micro-batch boundary."""
        g = self._grants.get(d.pipeline)
        if g is None or g.step != d.step or g.stage != d.stage:
            raise PolicyViolation(f"{d.pipeline}: ResizeStage of {d.stage} step {d.step}, which is not running "
                                  f"micro-batch by micro-batch on this executor")
        new = tuple(d.devices)
        held = set(g.devices) | set(g.wanted)
        for dev in g.wanted:  # an earlier grant not yet joined: its extra devices go back
            if dev not in new and dev not in g.devices:
                self._release((dev,))
        self._claim(tuple(x for x in new if x not in held), DeviceTask("stage", d.pipeline, stage=d.stage))
        g.wanted = new

    def _stage_boundary(self, g: _StageGrant) -> None:
        """A micro-batch boundary of a resized stage: the new devices take over, the old
        ones no longer used go back to the pool."""
        self.busy_s += (self.t - g.seg_start) * len(g.devices)
        if g.first_end is None:
            g.first_end = self.t  # closes the stage's first trace span
        elif g.devices:
            self.trace.append((f"{g.p.name} {g.stage} s{g.step}", g.stage, g.devices, g.seg_start, self.t))
        self._release(tuple(x for x in g.devices if x not in g.wanted))
        g.devices, g.seg_start = g.wanted, self.t
        self.dirty = True

    # ---- preemption (runtime/preemption.py decides when) ----------------------------------
    def _release(self, devices: tuple) -> None:
        """A preempted device does not go back to the pool when its task ends: it comes
        back with ``bring_up`` (its replacement)."""
        super()._release(tuple(d for d in devices if d not in self.down))
        for d in devices:
            if d in self.down:
                self.task.pop(d, None)

    def take_down(self, device: int) -> None:
        """Preempted: the device leaves the pool (a stage on it keeps it until it ends)."""
        self.down.add(int(device))
        self.free.discard(int(device))
        self.resident[int(device)] = []
        self._devices_version += 1
        self.dirty = True

    def bring_up(self, device: int) -> None:
        """The preempted device's replacement joins the pool (empty)."""
        self.down.discard(int(device))
        if self.task.get(int(device)) is None:
            super()._release((int(device),))
        self.dirty = True

    def task_on(self, device: int) -> DeviceTask | None:
        """What runs on ``device`` (a replica, a stage), or None."""
        return self.task.get(int(device))

    async def preempt_replica(self, replica: int, keep_tokens: bool = True) -> int:
        """The replica's device is preempted: no new request goes to it, each of its
        in-flight requests leaves it through the migration path (abort; the router resumes
        it on another replica, or waits for one) with its generated prefix, or with
        ``keep_tokens=False`` (the restart baseline) from its first token together with
        every request of the same steps still running on the pipeline's other replicas.
        Returns once none runs there any more, with the replica closed (its devices stay
        down if ``take_down`` was called); the caller then stops the engine. Returns how
        many requests were in flight on it."""
        rep = self.replicas.get(replica)
        if rep is None:
            return 0
        router = self.routers[rep.pipeline]
        self._retire(rep)
        records = rep.records()
        targets = [(rec.request_id, rep) for rec in records]
        if not keep_tokens:
            steps = {RequestId.parse(rec.request_id).step for rec in records}
            for other in self.pipelines[rep.pipeline].replicas:
                if other is not rep:
                    targets += [(r.request_id, other) for r in other.records()
                                if RequestId.parse(r.request_id).step in steps]
        aborts = [a for a in (router.begin_evict(rid, keep_tokens) for rid, _ in targets) if a is not None]
        for engine, segment in aborts:
            await engine.abort(segment)
        while router.records_on(rep.id):  # the aborted segments unwind
            await asyncio.sleep(0.005)
        self._close(rep, force=True)
        self.dirty = True
        return len(records)

    # ---- the loop -----------------------------------------------------------------------
    async def run(self, max_rounds: int = 8) -> None:
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        self.announce_pipelines()
        self._error = None
        while not all(p.done for p in self.order):
            if self._error is not None:
                raise self._error
            if self._dirty:
                self.decide_and_apply(max_rounds)
            self._wake.clear()
            if not self._dirty:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=LIVE_RECHECK_S)
                except asyncio.TimeoutError:
                    self._dirty = True  # re-check (a drained replica, a timer)
        for rep in list(self.replicas.values()):
            self._close(rep, force=True)


async def run_executor(ex: LiveExecutor, backend: str = "emulated") -> dict:
    """Run ``ex`` on the running event loop; the result JSON of DESIGN.md 5."""
    await ex.run()
    result = ex.result(backend)
    result["time_scale"] = ex.time_scale
    return result


def run_live(workload, policy, engine_factory, seed: int = 0, time_scale: float = 1.0, backend: str = "emulated",
             stage_runner=None, sampling: dict | None = None, **core_kw) -> dict:
    """Run ``workload`` under ``policy`` on live engines; the result JSON of DESIGN.md 5."""
    ex = LiveExecutor(workload, policy, engine_factory, seed, time_scale=time_scale, stage_runner=stage_runner,
                      sampling=sampling, **core_kw)
    return asyncio.run(run_executor(ex, backend))
