"""LiveWorld: the same pure policies, executed on live rollout engines in real time.

``LiveWorld`` presents the state shape the simulator's ``World`` presents (it subclasses it
and reuses its bookkeeping: steps, versions, stage order, staleness checks, device
claims, hooks) but its rollouts are real requests sent through a ``Router`` to engines
made by ``engine_factory`` (vLLM engines, or EMULATED ones for control-plane tests), and
time is the wall clock (``t`` in model seconds: wall seconds / ``time_scale``). Training
stages run through ``stage_runner`` (default: the cost model's duration, slept), which is
handed each sample's ``(prompt ids, response ids, prompt index, response mask)``
(runtime/reference/stage_runner.py).

What the policy reads of a replica (load, queue, KV, the requests it runs and their
remaining tokens) comes from the router's live records.
"""

from __future__ import annotations

import asyncio
import time
import zlib

from jigsaw_plugin.runtime.router import Router, RouterError
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, StartGen
from jigsaw_plugin.sim.world import PolicyViolation, World

__all__ = ["LiveWorld", "LiveReplica"]


class _RequestView:
    """What a policy reads of one running request (the simulator's Request fields)."""

    __slots__ = ("rid", "context", "done", "admit_p", "finish_p", "target")

    def __init__(self, rec):
        self.rid = rec.request_id
        self.context = len(rec.prompt)
        self.done = len(rec.prefix) + len(rec.live)
        self.admit_p = 0.0
        self.target = rec.max_tokens
        self.finish_p = float(rec.max_tokens - self.done)


class LiveReplica:
    """A live engine as the policies see a replica."""

    def __init__(self, rid: int, pipeline: str, devices: tuple, router: Router, model, cost, time_scale: float,
                 spawn=None):
        self.id, self.pipeline, self.devices, self.tp = rid, pipeline, devices, len(devices)
        self.spawn = spawn  # runs a coroutine on the world's loop (interrupt's aborts)
        self.router, self.model, self.cost, self.time_scale = router, model, cost, time_scale
        self.cap = cost.kv_capacity_tokens(model, self.tp)
        self.max_seqs = cost.f.max_num_seqs
        self.retiring = False
        self.p = 0.0  # live requests report remaining tokens directly (finish_p - p)
        self.busy_until = self.t_sync = 0.0

    def _records(self) -> list:
        return list(self.router.on_replica.get(self.id, {}).values())

    @property
    def load(self) -> int:
        return self.router.load(self.id)

    inflight = load

    @property
    def n(self) -> int:
        return min(self.load, self.max_seqs)

    @property
    def queue(self) -> list:
        return [None] * max(0, self.load - self.max_seqs)

    @property
    def kv_tokens(self) -> float:
        return float(sum(len(r.prompt) + len(r.prefix) + len(r.live) for r in self._records()))

    @property
    def work(self) -> int:
        return sum(r.max_tokens - len(r.prefix) - len(r.live) for r in self._records())

    @property
    def max_finish_p(self) -> float:
        return float(max((r.max_tokens - len(r.prefix) - len(r.live) for r in self._records()), default=0))

    def running(self) -> list:
        return [_RequestView(r) for r in self._records()]

    def remaining_s(self) -> float:
        if self.load == 0:
            return 0.0
        return self.max_finish_p * self.cost.decode_step_s(self.model, self.tp, max(1, self.n), self.kv_tokens)

    # ---- what World calls on a weight sync with interrupt_on_sync (AReaL) -----------------
    def sync(self, t: float) -> None:
        """The simulator's replicas advance a clock here; a live engine runs by itself."""

    def interrupt(self, t: float) -> None:
        """New weights arrived mid-generation: abort every running segment; the router
        resumes each with its tokens so far (sticky: on this replica), and the engine
        recomputes their KV under the new weights (AReaL's interruptible rollout)."""
        segments = [(self.router.engines[self.id], f"{r.request_id}#{r.segments}") for r in self._records()]
        if segments and self.spawn is not None:
            async def abort_all():
                for engine, segment in segments:
                    await engine.abort(segment)

            self.spawn(abort_all())


def _tokens(seed: str, n: int) -> list[int]:
    base = zlib.crc32(seed.encode())
    return [(base + 7919 * j) % 2048 for j in range(int(n))]


class LiveWorld(World):
    """Executes decisions on live engines; see the module docstring."""

    def __init__(self, sim_like, engine_factory, time_scale: float = 1.0, stage_runner=None,
                 sampling: dict | None = None):
        # ``sim_like`` is a Simulation whose World we take over (pipelines, cost, policy hooks)
        w = sim_like.world
        self.__dict__.update(w.__dict__)
        self._policy = sim_like.policy
        self._push = self._schedule_event
        self.engine_factory = engine_factory
        self.time_scale = time_scale
        self.stage_runner = stage_runner
        self.sampling = dict(sampling or {})  # Router SAMPLING_KEYS; a seed is made per request
        self.faults: list[dict] = []  # replicas whose engine died, in order
        self.trajectories: dict = {}  # with a stage_runner: (pipeline, step) -> {sample: trajectory}
        self.routers = {p.name: Router(on_event=self._router_event(p.name)) for p in self.order}
        self._wake: asyncio.Event | None = None
        self._t0 = 0.0
        self._tasks: set = set()
        self._dirty = True

    # ---- clock and wake-ups -------------------------------------------------------------
    @property
    def t(self) -> float:
        if not self._t0:
            return 0.0
        return (time.monotonic() - self._t0) / self.time_scale

    @t.setter
    def t(self, value) -> None:  # World assigns t in the simulator; live time is the clock
        pass

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

    def _schedule(self, rep) -> None:
        """The simulator's replica clock ticks; live engines advance by themselves."""

    def _schedule_event(self, ev) -> None:
        delay = max(0.0, ev.t - self.t) * self.time_scale
        asyncio.get_running_loop().call_later(delay, self._fire, ev)

    def _fire(self, ev) -> None:
        ev.handle(self)
        self.dirty = True

    def _router_event(self, pipeline):
        def on_event(name, **kw):
            if name == "migrated":
                p = self.pipelines[pipeline]
                self.migrations += 1
                step = int(kw["request_id"].split("/")[1])
                p.steps[step].migrations += 1
            elif name == "replica_died":
                self._replica_died(pipeline, kw["replica"], kw["request_id"], kw["generated_tokens"])
        return on_event

    def _replica_died(self, pipeline: str, replica: int, request_id: str, generated: int) -> None:
        """A fault: the router already resumes the replica's requests elsewhere; here the
        replica is closed (its devices go back to the policy, which may launch another)
        and the engine is reported dead to whoever lent it (``mark_dead``)."""
        rep = self.replicas.get(replica)
        if rep is None:
            return
        engine = self.routers[pipeline].engines.get(replica)
        if hasattr(engine, "mark_dead"):
            engine.mark_dead()
        self.faults.append({"pipeline": pipeline, "replica": replica, "devices": rep.devices,
                            "request_id": request_id, "t": self.t})
        sample, turn = request_id.rsplit("/", 1)  # router ids are "<pipeline>/<step>/<i>/<turn>"
        self._emit("jigsaw_request_aborted", pipeline=pipeline, step=int(sample.split("/")[1]), request_id=sample,
                   turn=int(turn), replica=replica, generated_tokens=generated, reason="fault", t=self.t)
        self._close(rep)
        self.dirty = True

    # ---- decisions ----------------------------------------------------------------------
    def _start_gen(self, d: StartGen) -> None:
        p, s = self._open_step(d)
        for i in range(s.n):
            self._spawn(self._trajectory(p, s, i, p.rollout_version))

    async def _trajectory(self, p, s, i: int, version: int) -> None:
        smp, router = s.samples, self.routers[p.name]
        off, turns = int(smp.turn_offset[i]), int(smp.turns[i])
        rid = f"{p.name}/{s.step}/{i}"
        group = i // p.spec.samples_per_prompt  # the samples of one prompt share it (a GRPO group)
        context = _tokens(f"{p.name}/{s.step}/prompt{group}", smp.prompt_len[i])
        prompt, mask = list(context), []  # mask: 1 on generated tokens, 0 on observations
        for turn in range(turns):
            while True:
                if self.record_requests:  # the router picks the replica: None here
                    self._emit("jigsaw_request_submitted", pipeline=p.name, step=s.step, request_id=rid, turn=turn,
                               replica=None, prompt_tokens=len(context), max_tokens=int(smp.gen_tokens[off + turn]),
                               t=self.t)
                try:
                    out = await router.generate(f"{rid}/{turn}", context, int(smp.gen_tokens[off + turn]), sticky=rid,
                                                sampling=self._sampling(f"{rid}/{turn}"))
                    break
                except RouterError:  # no live replica: wait for the policy to launch one
                    p.pending.append(rid)
                    self.dirty = True
                    await self._replica_added(p)
                    p.pending.remove(rid)
            self._emit("jigsaw_request_finished", pipeline=p.name, step=s.step, request_id=rid, turn=turn,
                       replica=router._sticky.get(rid), generated_tokens=len(out), t=self.t)
            self._after_finish(p)
            context = context + out
            mask += [1] * len(out)
            if turn + 1 < turns:
                await asyncio.sleep(float(smp.tool_latency_s[off + turn]) * self.time_scale)
                obs = _tokens(f"{rid}/obs{turn}", smp.observation_len[off + turn])
                context, mask = context + obs, mask + [0] * len(obs)
        if self.stage_runner is not None:  # what the training stages read
            self.trajectories.setdefault((p.name, s.step), {})[i] = (prompt, context[len(prompt):], group, mask)
        router.end_trajectory(rid)
        s.n_gen_done += 1
        if s.n_gen_done == s.n:
            s.gen_end_t = self.t
            self._emit("jigsaw_stage_end", pipeline=p.name, step=s.step, stage="gen", devices=(), samples=s.n,
                       tokens=s.generated, t=self.t)
            self.dirty = True
        await asyncio.sleep(float(smp.reward_latency_s[i]) * self.time_scale)
        s.n_rewarded += 1
        if s.n_rewarded == s.n:
            s.reward_end_t = self.t
            self.dirty = True

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
            elif rep.load <= self.tail_threshold:
                self.dirty = True

    def _launch(self, d: LaunchReplica) -> None:
        p = self.pipelines[d.pipeline]
        devices = tuple(d.devices)
        rid = self._next_replica
        self._next_replica += 1
        self._claim(devices, ("replica", p.name, rid))
        self._switch_s(p, devices, "rollout")
        rep = LiveReplica(rid, p.name, devices, self.routers[p.name], p.model, self.cost, self.time_scale,
                          spawn=self._spawn)
        rep.start_t = self.t
        self.routers[p.name].add_replica(rid, self.engine_factory(p, devices))
        self.replicas[rid] = rep
        p.replicas.append(rep)
        self._emit("jigsaw_lease_granted", pipeline=p.name, devices=devices, purpose="rollout", t=self.t)
        for src in d.absorb:
            self._retire(self.replicas[src])
            self._migrate(Migrate(src, rid))

    def _retire(self, rep) -> None:
        rep.retiring = True
        self.routers[rep.pipeline].retiring.add(rep.id)
        self.dirty = True
        if rep.load == 0:
            self._close(rep)

    def _close(self, rep) -> None:
        if rep.id not in self.replicas:
            return
        p = self.pipelines[rep.pipeline]
        p.replicas.remove(rep)
        del self.replicas[rep.id]
        router = self.routers[rep.pipeline]
        router.engines.pop(rep.id, None)
        router.inflight.pop(rep.id, None)
        router.on_replica.pop(rep.id, None)
        self.trace.append((f"{rep.pipeline} rollout r{rep.id}", "rollout", rep.devices, rep.start_t, self.t))
        self.busy_s += (self.t - rep.start_t) * rep.tp
        self._release(rep.devices)
        self._emit("jigsaw_lease_released", pipeline=rep.pipeline, devices=rep.devices, t=self.t)

    def _migrate(self, d: Migrate) -> None:
        """Mark the requests to move and release a retiring source at once (as the
        simulator does, so the policy's plan holds); the aborts follow asynchronously."""
        src, dst = self.replicas[d.src], self.replicas[d.dst]
        if src.pipeline != dst.pipeline:
            raise PolicyViolation(f"migrate between pipelines {src.pipeline} and {dst.pipeline}")
        router = self.routers[src.pipeline]
        wanted = set(d.requests) if d.requests else None
        aborts = []
        for rec in src._records():
            if wanted is None or rec.request_id.rsplit("/", 1)[0] in wanted:
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

    def _run_stage(self, d) -> None:
        if self.stage_runner is None:
            return super()._run_stage(d)  # the cost model's duration, slept (emulated)
        # World's checks, device claim and hooks; its modelled StageDone is held back and fires
        # when ``await stage_runner.run(pipeline, step, stage, devices, samples)`` returns.
        held, push = [], self._push
        self._push = held.append
        try:
            super()._run_stage(d)
        finally:
            self._push = push
        (done,) = held
        p, start = self.pipelines[d.pipeline], self.t
        modelled, at = done.t - start, len(self.trace) - 1 if done.devices else None
        traj = self.trajectories.get((p.name, d.step), {})

        async def run():
            await self.stage_runner.run(p, d.step, d.stage, done.devices, [traj[i] for i in sorted(traj)])
            p.steps[d.step].stage_t[d.stage] = (start, self.t)  # measured, not modelled
            self.busy_s += (self.t - start - modelled) * len(done.devices)
            if at is not None:
                self.trace[at] = self.trace[at][:4] + (self.t,)
            if d.stage == p.stages[-1]:
                self.trajectories.pop((p.name, d.step), None)
            self._fire(done)

        self._spawn(run())

    # ---- the loop -----------------------------------------------------------------------
    async def run(self, max_rounds: int = 8) -> None:
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        for p in self.order:  # as Simulation.run does
            self._emit("jigsaw_register_pipeline", pipeline=p.name, spec=p.spec.to_dict())
            self._emit("jigsaw_pipeline_start", pipeline=p.name, t=0.0)
        self._error = None
        self.decision_us = []
        while not all(p.done for p in self.order):
            if self._error is not None:
                raise self._error
            if self._dirty:
                for _ in range(max_rounds):
                    self._dirty = False
                    t0 = time.perf_counter()
                    decisions = self._policy.decide(self)
                    self.decision_us.append((time.perf_counter() - t0) * 1e6)
                    if not decisions:
                        break
                    for dec in decisions:
                        self.apply(dec)
            self._wake.clear()
            if not self._dirty:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)
                except asyncio.TimeoutError:
                    self._dirty = True  # re-check (a drained replica, a timer)
        for rep in list(self.replicas.values()):
            self._close(rep)


async def run_simulation_live(sim, engine_factory, time_scale: float = 1.0, stage_runner=None,
                              sampling: dict | None = None) -> dict:
    """Take over ``sim`` (a ``Simulation``, not run) and run it on live engines, on the
    running event loop; the result JSON of DESIGN.md 5."""
    from jigsaw_plugin.sim.result import build_result

    live = LiveWorld(sim, engine_factory, time_scale=time_scale, stage_runner=stage_runner, sampling=sampling)
    await live.run()
    sim.world = live
    sim.decision_us = live.decision_us
    return build_result(sim)


def run_live(workload, policy, engine_factory, seed: int = 0, time_scale: float = 1.0, backend: str = "emulated",
             stage_runner=None, sampling: dict | None = None, **sim_kw) -> dict:
    """Run ``workload`` under ``policy`` on live engines; the result JSON of DESIGN.md 5."""
    from jigsaw_plugin.sim.engine import Simulation

    sim = Simulation(workload, policy, seed, **sim_kw)
    result = asyncio.run(run_simulation_live(sim, engine_factory, time_scale, stage_runner, sampling))
    result["backend"] = backend
    result["time_scale"] = time_scale
    return result
