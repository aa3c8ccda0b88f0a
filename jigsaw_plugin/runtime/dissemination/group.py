"""Driver side: a trainer and N replica actors, and one call per dissemination run.

``ray.init`` must have been called (a local cluster is enough). Actors are created once
per group and reused across runs, so a benchmark's repeats time the transfer, not actor
start-up. Every run ends with each replica's checksum beside the trainer's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.dissemination.spec import DisseminationSpec, LinkSpec, check_replicas

__all__ = ["DisseminationGroup", "DisseminationResult", "ReplicaDelivery"]


@dataclass(frozen=True, slots=True)
class ReplicaDelivery:
    """What one replica ended up holding."""

    replica: int
    checksum: str
    version: int | None  # the pulled version (``pull`` only)


@dataclass(frozen=True, slots=True)
class DisseminationResult:
    """One run: every replica has the weights after ``seconds``; the trainer was busy
    (could not go on training) for ``trainer_seconds`` of it."""

    strategy: str
    replicas: int
    total_bytes: int
    chunks: int
    link: LinkSpec | None
    seconds: float
    trainer_seconds: float
    source_checksum: str
    deliveries: tuple[ReplicaDelivery, ...]

    @property
    def bit_identical(self) -> bool:
        return all(d.checksum == self.source_checksum for d in self.deliveries)


class DisseminationGroup:
    """A trainer actor, ``replicas`` replica actors and (for ``pull``) a version registry."""

    def __init__(self, replicas: int, timeout_s: float = 600.0) -> None:
        import ray  # lazily: only a run on Ray needs it

        from jigsaw_plugin.runtime.dissemination import actors

        if not ray.is_initialized():
            raise RuntimeError("DisseminationGroup needs Ray: call ray.init(...) first")
        self._ray, self._actors = ray, actors
        self._timeout_s = timeout_s
        self.trainer = actors.TrainerActor.remote()
        self.replicas = [actors.ReplicaActor.remote(i) for i in range(check_replicas(replicas))]
        self._registry = None
        self._registry_link: object = ()
        self._pushes = 0  # pull: every push publishes a new version number
        self._source = (0, "")

    def set_state(self, source) -> tuple[int, str]:
        """Give the trainer a new version: a ``SyntheticSource`` or a name -> tensor dict.
        Replicas drop the copies they hold and the registry its published version first
        (they are stale now; it bounds memory)."""
        self.drop_replicas()
        self.free_published()
        self._source = self._ray.get(self.trainer.set_state.remote(source), timeout=self._timeout_s)
        return self._source

    def registry(self, link: LinkSpec | None):
        """The version registry for ``pull`` (a new one if the link changed)."""
        if self._registry is None or self._registry_link != link:
            if self._registry is not None:
                self._ray.kill(self._registry)  # it holds the last version: free it
            self._registry = self._actors.VersionRegistryActor.remote(link)
            self._registry_link = link
        return self._registry

    def drop_replicas(self) -> None:
        """Every replica forgets the weights it holds (each run fills them again): a
        benchmark frees them before a row so its memory check sees what the row needs."""
        self._ray.get([r.drop.remote() for r in self.replicas], timeout=self._timeout_s)

    def free_published(self) -> None:
        """The registry forgets its latest version (``pull``): Ray frees it once no replica
        reads it. A benchmark calls it after each pull run so the object store holds one
        version at a time, not the last one beside the next."""
        if self._registry is not None:
            self._ray.get(self._registry.retire.remote(), timeout=self._timeout_s)

    def run(self, spec: DisseminationSpec, replicas: int | None = None) -> DisseminationResult:
        """Disseminate the trainer's current state to the first ``replicas`` replicas."""
        ray = self._ray
        n = len(self.replicas) if replicas is None else check_replicas(replicas)
        if n > len(self.replicas):
            raise SpecError("replicas", n, f"at most {len(self.replicas)} (the group's size)")
        total, checksum = self._source
        if not checksum:
            raise RuntimeError("set_state(...) before run(...)")
        targets = self.replicas[:n]
        chunks = spec.chunks(total) if spec.strategy == "chain" else 1
        t0 = time.perf_counter()
        if spec.strategy == "naive":
            trainer_s = ray.get(self.trainer.naive.remote(targets, spec.link), timeout=self._timeout_s)
        elif spec.strategy == "chain":
            layout_ref = self.trainer_layout()
            ray.get([r.begin_chain.remote(layout_ref, chunks, nxt, spec.link)
                     for r, nxt in zip(targets, targets[1:] + [None])], timeout=self._timeout_s)
            t0 = time.perf_counter()  # the chain set-up (buffers, neighbours) is not the transfer
            trainer_s = ray.get(self.trainer.chain.remote(targets[0], spec.chunk_bytes, spec.link),
                                timeout=self._timeout_s)
        else:
            registry = self.registry(spec.link)
            self._pushes += 1
            trainer_s = ray.get(self.trainer.push.remote(registry, self._pushes), timeout=self._timeout_s)
            ray.get([r.pull.remote(registry) for r in targets], timeout=self._timeout_s)
        ray.get([r.wait_complete.remote() for r in targets], timeout=self._timeout_s)
        seconds = time.perf_counter() - t0
        sums = ray.get([r.checksum.remote() for r in targets], timeout=self._timeout_s)
        versions = ray.get([r.version.remote() for r in targets], timeout=self._timeout_s)
        return DisseminationResult(
            strategy=spec.strategy, replicas=n, total_bytes=total, chunks=chunks, link=spec.link,
            seconds=seconds, trainer_seconds=trainer_s, source_checksum=checksum,
            deliveries=tuple(ReplicaDelivery(i, s, v) for i, (s, v) in enumerate(zip(sums, versions))),
        )

    def trainer_layout(self):
        return self.trainer.layout.remote()

    def close(self) -> None:
        for a in [self.trainer, *self.replicas, *([self._registry] if self._registry else [])]:
            self._ray.kill(a)

    def __enter__(self) -> "DisseminationGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
