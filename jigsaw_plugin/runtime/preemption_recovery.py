"""Recovering from preemptions on Ray, real: the parameter server, restorable trainers, and
the target ``PreemptionDriver`` (runtime/preemption.py) acts on.

- ``WeightServer``: RLAX's parameter server made of Ray's object store. After every weight
  sync the trainer's bf16 weights are put in the store and published to one
  ``VersionRegistryActor`` per pipeline (dissemination/actors.py: it holds the latest
  version's ObjectRef only). A replacement engine *pulls* the latest: the ref goes to its
  actor as a call argument, so the actor reads it from the store itself.
- ``TrainerKeeper``: the pipelines' trainer actors. After every ``update_actor`` it writes
  a ``StepCheckpoint`` (reference/resume.py: weights, AdamW state, version, the ledger of
  the update); a preempted trainer's actor is killed and a new one is restored from that
  checkpoint (its version is checked against the checkpoint's).
- ``PreemptibleStageRunner``: the ``LedgerStageRunner`` of the run, around which a stage
  whose trainer died with its device waits for the restored trainer and runs again (the
  update trains from the checkpointed version; the ledger keeps one copy of it), and every
  weight sync is published to the parameter server.
- ``StalenessLog``: the weight version every rollout segment was generated with (the
  engine pool's ``on_generate``), and each trained sample's staleness (the trainer's
  version before the update minus the oldest version any segment of the sample used).
- ``RayPreemptionTarget``: a preemption takes the device out of the executor's pool; a
  rollout replica there is drained through the migration path (``LiveExecutor.
  preempt_replica``: its requests resume elsewhere with their prefix, or, for the
  ``restart`` baseline, from their first token), a trainer running a stage there is
  killed, and every pooled engine on the device is stopped. The replacement starts a fresh
  engine per pipeline on the device, which pulls the latest weights from the parameter
  server; the version and the digest of what its worker loaded are checked
  (``PullCheck``); preempted trainers are restored; the device rejoins the pool.

Ray and torch are imported inside functions (``run_case`` in runtime/preemption_run.py
wires a whole run).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.runtime.preemption_weights import read_digests
from jigsaw_plugin.runtime.reference.resume import load_checkpoint, restore_trainer, save_checkpoint, trainer_state

__all__ = ["PreemptibleStageRunner", "PullCheck", "RayPreemptionTarget", "StageRerun", "StalenessLog",
           "TrainerKeeper", "WeightServer"]


@dataclass(frozen=True, slots=True)
class PullCheck:
    """What a replacement engine pulled: the version it holds against the latest
    published, and the digest of the tensors its worker loaded against the published
    version's checksum (``params``: the worker's model parameters after the load)."""

    pipeline: str
    device: int
    version: int
    latest_version: int  # the newest published when the pull started
    loaded_checksum: str
    published_checksum: str
    params_digest: str

    @property
    def ok(self) -> bool:
        return self.version >= self.latest_version and self.loaded_checksum == self.published_checksum


@dataclass(frozen=True, slots=True)
class StageRerun:
    """A training stage whose trainer was preempted, run again on the restored trainer."""

    pipeline: str
    step: int
    stage: str
    restored_version: int


class WeightServer:
    """RLAX's parameter server on Ray's object store (module docstring)."""

    def __init__(self, pipelines) -> None:
        from jigsaw_plugin.runtime.dissemination.actors import VersionRegistryActor

        self._registry = {name: VersionRegistryActor.remote(None) for name in pipelines}
        self.published: dict[str, int] = {}  # pipeline -> latest published version
        self.checksums: dict[tuple, str] = {}  # (pipeline, version) -> state_checksum of its weights

    async def publish(self, pipeline: str, version: int, weights: dict) -> None:
        """Put ``weights`` in the object store as ``version`` (a version already published
        again, e.g. a sync re-run on a restored trainer, is not published twice)."""
        import ray

        from jigsaw_plugin.runtime.dissemination.codec import state_checksum

        if self.published.get(pipeline, -1) >= int(version):
            return
        checksum = state_checksum(weights)
        await self._registry[pipeline].publish.remote(int(version), [ray.put(weights)], None, checksum)
        self.published[pipeline] = int(version)
        self.checksums[(pipeline, int(version))] = checksum

    async def pull(self, pipeline: str, engine) -> int:
        """Load the latest published version into ``engine`` (an ``ActorEngine``: the ref
        is resolved in its actor, which reads the store); returns that version."""
        latest = await self._registry[pipeline].latest.remote()
        if latest is None:
            raise RuntimeError(f"pipeline {pipeline!r}: nothing published to the parameter server yet")
        version, (ref,), _layout, _checksum = latest
        await engine.load_weights(ref, int(version))
        return int(version)

    def close(self) -> None:
        import ray

        for actor in self._registry.values():
            ray.kill(actor)


class TrainerKeeper:
    """The trainer actor of each pipeline, restorable from its last checkpoint (module
    docstring). ``make(name)`` starts a trainer actor; ``keeper(name)`` is the current one
    (the stage runner's ``trainers``)."""

    def __init__(self, make, names, folder) -> None:
        self._make, self.folder = make, Path(folder)
        self._actors = {n: make(n) for n in names}
        self._ready = {n: asyncio.Event() for n in names}
        for ev in self._ready.values():
            ev.set()
        self.versions = {n: 0 for n in names}  # the last checkpointed version
        self.preempted: set[str] = set()
        self.restores: list[tuple[str, int]] = []

    def __call__(self, name: str):
        return self._actors[name]

    def actors(self) -> list:
        return list(self._actors.values())

    async def checkpoint(self, name: str, ledger_rows) -> int:
        """A ``StepCheckpoint`` of the trainer after an update; returns its version."""
        blob = await trainer_state(self._actors[name])
        version = int(await self._actors[name].get_version.remote())
        save_checkpoint(self.folder / name, version, {name: blob}, ledger_rows)
        self.versions[name] = version
        return version

    def preempt(self, name: str) -> None:
        """The trainer's device is preempted: its actor dies (work since the checkpoint lost)."""
        import ray

        self._ready[name].clear()
        self.preempted.add(name)
        ray.kill(self._actors[name])

    async def restore(self, name: str) -> int:
        """A new trainer actor from the last checkpoint (version 0: the model folder, as at
        the start); returns its version, checked against the checkpoint's."""
        actor = self._make(name)
        ck = load_checkpoint(self.folder / name)
        version = 0 if ck is None else await restore_trainer(actor, Path(ck.trainers[name]).read_bytes())
        if version != self.versions[name]:
            raise RuntimeError(f"trainer {name!r} restored at version {version}, but its last checkpoint "
                               f"holds version {self.versions[name]}")
        self._actors[name] = actor
        self.preempted.discard(name)
        self.restores.append((name, version))
        self._ready[name].set()
        return version

    async def wait_ready(self, name: str) -> None:
        await self._ready[name].wait()

    def close(self) -> None:
        import ray

        for actor in self._actors.values():
            ray.kill(actor)


class StalenessLog:
    """Weight versions per rollout segment and the staleness of every trained sample."""

    def __init__(self) -> None:
        self._oldest: dict[tuple, int] = {}  # (pipeline, step, sample) -> oldest version used
        self.segments = 0
        self.trained: list[tuple[str, int, int, int]] = []  # (pipeline, step, sample, staleness)

    def on_generate(self, segment_id: str, version: int) -> None:
        """The engine pool's ``on_generate``: segment ids are ``<request id>#<segment>``."""
        rid = RequestId.parse(str(segment_id).split("#", 1)[0])
        key = (rid.pipeline, rid.step, rid.sample)
        self._oldest[key] = min(self._oldest.get(key, int(version)), int(version))
        self.segments += 1

    def on_update(self, pipeline: str, step: int, trainer_version: int) -> None:
        """``update_actor`` of (pipeline, step) trains from ``trainer_version``."""
        for (p, s, i), v in sorted(self._oldest.items()):
            if p == pipeline and s == step:
                self.trained.append((p, s, i, int(trainer_version) - v))

    def max_staleness(self) -> int:
        return max((row[3] for row in self.trained), default=0)


class PreemptibleStageRunner:
    """A ``LedgerStageRunner`` whose stages survive their trainer's preemption, and whose
    weight syncs are published to the parameter server (module docstring)."""

    def __init__(self, inner, keeper: TrainerKeeper, weights: WeightServer, staleness: StalenessLog) -> None:
        self.inner, self.keeper, self.weights, self.staleness = inner, keeper, weights, staleness
        self.reruns: list[StageRerun] = []

    def latest_weights(self, pipeline):
        return self.inner.latest_weights(pipeline)

    async def run(self, pipeline, step: int, stage: str, devices=(), samples=None, grant=None) -> dict:
        import ray

        name = getattr(pipeline, "name", pipeline)
        while True:
            await self.keeper.wait_ready(name)
            before, version = len(self.inner.trained), self.keeper.versions[name]
            try:
                metrics = await self.inner.run(pipeline, step, stage, devices, samples, grant=grant)
                if stage == "update_actor":  # kept only once checkpointed
                    await self.keeper.checkpoint(name, self.inner.trained[before:])
                    self.staleness.on_update(name, int(step), version)
                break
            except ray.exceptions.RayActorError:
                if name not in self.keeper.preempted:
                    raise
                del self.inner.trained[before:]  # that update died with the trainer: not kept
                await self.keeper.wait_ready(name)
                self.reruns.append(StageRerun(name, int(step), stage, self.keeper.versions[name]))
        if stage == "weight_sync":
            version, weights = self.inner.latest_weights(name)
            await self.weights.publish(name, version, weights)
        return metrics


class RayPreemptionTarget:
    """What a preemption does to a live run on Ray, and how the replacement joins
    (module docstring). ``executor``: the ``LiveExecutor``; ``pool``: its ``EnginePool``."""

    def __init__(self, executor, pool, keeper: TrainerKeeper, weights: WeightServer, pipelines) -> None:
        self.ex, self.pool, self.keeper, self.weights = executor, pool, keeper, weights
        self.pipelines = tuple(pipelines)
        self.pulls: list[PullCheck] = []

    async def preempt(self, device: int, recovery: str) -> dict:
        task = self.ex.task_on(device)
        self.ex.take_down(device)
        hit, requests, pipeline = "idle", 0, None
        if task is not None and task.kind == "replica":
            hit, pipeline = "replica", task.pipeline
            requests = await self.ex.preempt_replica(task.replica, keep_tokens=recovery == "migrate")
        elif task is not None:  # a training stage runs there: its trainer goes with the device
            hit, pipeline = "stage", task.pipeline
            self.keeper.preempt(task.pipeline)
        for name in self.pipelines:  # every pooled engine on the device stops
            if (name, int(device)) in self.pool.engines:
                await self.pool.preempt(name, device)
        return {"hit": hit, "requests": requests, "pipeline": pipeline}

    async def replace(self, device: int) -> tuple[list, list]:
        # the trainer first: a sync pipeline's stage waits for it, while its rollouts have
        # the other replicas until the fresh engine has started
        trainers = [(name, await self.keeper.restore(name)) for name in sorted(self.keeper.preempted)]
        weights = []
        for name in self.pipelines:
            key = (name, int(device))
            if key in self.pool.state and key not in self.pool.engines:
                latest: dict = {}

                async def pull(engine, n=name):
                    latest[n] = self.weights.published.get(n, -1)  # the newest when the pull starts
                    return await self.weights.pull(n, engine)

                version = await self.pool.replace(name, device, pull)
                await self._check(name, int(device), version, latest[name])
                weights.append((name, version))
        self.ex.bring_up(device)
        return weights, trainers

    async def _check(self, name: str, device: int, version: int, latest: int) -> None:
        pids = await self.pool.engines[(name, device)].handle.pids.remote()
        rows = read_digests(pids)
        last = rows[-1] if rows else {"loaded": "", "params": ""}
        self.pulls.append(PullCheck(name, device, version, latest, last["loaded"],
                                    self.weights.checksums.get((name, version), "?"), last["params"]))
