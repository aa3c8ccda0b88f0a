"""The Ray actors that move the weights: a trainer, replicas and a version registry.

Imported only by ``group.py`` when a run starts (this module imports ray at the top; the
package's ``__init__`` does not import it). All three are async actors: a modelled link is
an ``asyncio.sleep`` under the sender's uplink lock (``_Uplink``), so a node keeps
receiving (and copying for real) while its uplink is busy, which is what makes the chain
a pipeline.

Every byte still moves for real through Ray's object store (a put by the sender, a read
and a copy into the replica's own buffer); the link only adds the wide-area time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import ray

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.dissemination.codec import (
    StateLayout,
    pack_state,
    pack_synthetic,
    state_checksum,
    unpack_state,
)
from jigsaw_plugin.runtime.dissemination.spec import LinkSpec

__all__ = ["ChunkArrival", "ReplicaActor", "SyntheticSource", "TrainerActor", "VersionRegistryActor"]

# Chunk calls a sender keeps in flight per receiver before it waits (bounds the object
# store to a few chunks per hop instead of the whole state).
_WINDOW = 4


@dataclass(frozen=True, slots=True)
class SyntheticSource:
    """A state the trainer builds itself (no driver-to-trainer copy): ``synthetic_state``."""

    total_bytes: int
    seed: int = 0
    tensor_bytes: int = 64 * 1024 * 1024
    backend: str = "numpy"


@dataclass(frozen=True, slots=True)
class ChunkArrival:
    """One chunk reaching one replica: which chunk, from whom (-1: the trainer), when."""

    chunk: int
    sender: int
    at_s: float  # time.time() on this machine; every actor shares its clock


class _Uplink:
    """A sender's modelled uplink. A transfer holds it for bytes / bandwidth (transfers
    leaving one sender serialise); it arrives ``latency_s`` later (propagation, which does
    not hold the uplink, so a stream of chunks pays the latency once). Deliveries keep
    their order. Without a link, ``send`` submits at once."""

    def __init__(self, link: LinkSpec | None) -> None:
        self.link = link
        self._lock = asyncio.Lock()
        self._last_arrival = 0.0

    async def send(self, nbytes: int, submit):
        """Hold the uplink, then call ``submit`` at arrival (it returns an awaitable: a Ray
        call's ObjectRef or a coroutine); returns an awaitable of its result."""
        if self.link is None:
            return submit()
        async with self._lock:
            await asyncio.sleep(nbytes / self.link.bandwidth_bytes_s)
        loop = asyncio.get_running_loop()
        # strictly increasing arrivals: the timers fire, and the calls go out, in order
        arrival = max(loop.time() + self.link.latency_s, self._last_arrival + 1e-6)
        self._last_arrival = arrival
        return loop.create_task(self._deliver(arrival, submit))

    @staticmethod
    async def _deliver(arrival: float, submit):
        await asyncio.sleep(max(0.0, arrival - asyncio.get_running_loop().time()))
        return await submit()


@ray.remote(num_cpus=0)
class TrainerActor:
    """Holds the current weights as one packed buffer and sends them out."""

    def __init__(self) -> None:
        self._layout: StateLayout | None = None
        self._buffer: np.ndarray | None = None
        self._checksum = ""

    def set_state(self, source) -> tuple[int, str]:
        """Load a new version: a ``SyntheticSource`` or a name -> tensor dict. Returns
        (bytes, checksum). The old version is freed first and a synthetic state is drawn
        straight into the packed buffer: at 1-2 GB a second copy is what runs the shared
        machine out of memory."""
        self._layout, self._buffer, self._checksum = None, None, ""
        if isinstance(source, SyntheticSource):
            self._layout, self._buffer = pack_synthetic(source.total_bytes, source.seed, source.tensor_bytes,
                                                        source.backend)
        else:
            self._layout, self._buffer = pack_state(source)
        self._checksum = state_checksum(unpack_state(self._layout, self._buffer))
        return self._layout.total_bytes, self._checksum

    def layout(self) -> StateLayout:
        return self._layout

    async def naive(self, replicas: list, link: LinkSpec | None) -> float:
        """The whole state to each replica in turn; returns the seconds the trainer was busy.
        The uplink's time for the next replica overlaps the previous delivery, but a
        delivery waits for the previous one: one whole copy in the object store at a time."""
        t0 = time.perf_counter()
        uplink, previous = _Uplink(link), None
        for r in replicas:
            async def deliver(r=r, before=previous):
                if before is not None:
                    await before
                return await r.receive_full.remote(self._layout, self._buffer)

            previous = asyncio.ensure_future(await uplink.send(self._layout.total_bytes, deliver))
        await previous
        return time.perf_counter() - t0

    async def chain(self, first, chunk_bytes: int, link: LinkSpec | None) -> float:
        """Chunk k to the first replica of the chain while it relays chunk k-1; returns
        the seconds until the first replica holds the trainer's last chunk."""
        t0 = time.perf_counter()
        uplink, inflight = _Uplink(link), deque()
        for k, off in enumerate(range(0, self._layout.total_bytes, chunk_bytes)):
            piece = self._buffer[off : off + chunk_bytes]
            if len(inflight) >= _WINDOW:
                await inflight.popleft()
            inflight.append(await uplink.send(piece.nbytes,
                                              lambda k=k, off=off, piece=piece: first.receive_chunk.remote(k, off, piece, -1)))
        await asyncio.gather(*inflight)
        return time.perf_counter() - t0

    async def push(self, registry, version: int) -> float:
        """Put this version into the object store and publish it (the registry drops the
        older one); returns the seconds the trainer was busy."""
        t0 = time.perf_counter()
        ref = ray.put(self._buffer)
        await registry.publish.remote(version, [ref], self._layout, self._checksum)
        return time.perf_counter() - t0


@ray.remote(num_cpus=0)
class ReplicaActor:
    """An inference worker's copy of the weights, in its own buffer."""

    def __init__(self, index: int) -> None:
        self._index = index
        self._reset(None)

    def _reset(self, layout: StateLayout | None) -> None:
        self._layout = layout
        self._buffer = None if layout is None else np.empty(layout.total_bytes, dtype=np.uint8)
        self._state: dict | None = None
        self._version: int | None = None
        self._arrivals: list[ChunkArrival] = []
        self._expected = 0
        self._next = None
        self._uplink = _Uplink(None)
        self._slots: list = []
        self._relayed: list[int] = []
        self._relay_task: asyncio.Task | None = None
        self._complete = asyncio.Event()

    def _finish(self) -> None:
        self._state = unpack_state(self._layout, self._buffer)
        self._complete.set()

    def drop(self) -> None:
        """Forget the held weights (a new version is coming; frees the memory now)."""
        self._reset(None)

    # --- naive ---
    async def receive_full(self, layout: StateLayout, buffer: np.ndarray) -> None:
        self._reset(layout)
        self._buffer[:] = buffer  # the object store's read-only view, copied into our own memory
        self._finish()

    # --- chain ---
    async def begin_chain(self, layout: StateLayout, chunks: int, next_replica, link: LinkSpec | None) -> None:
        self._reset(layout)
        self._expected, self._next, self._uplink = chunks, next_replica, _Uplink(link)
        loop = asyncio.get_running_loop()
        self._slots = [loop.create_future() for _ in range(chunks)]
        if next_replica is not None:
            self._relay_task = loop.create_task(self._relay_chunks())

    async def receive_chunk(self, k: int, offset: int, piece: np.ndarray, sender: int) -> None:
        """Copy chunk k out of the object store into our buffer; the relay task sends it
        on, so this returns as soon as the chunk is ours (receiving and sending overlap)."""
        end = offset + piece.nbytes
        self._buffer[offset:end] = piece
        self._arrivals.append(ChunkArrival(k, sender, time.time()))
        self._slots[k].set_result((offset, end))
        if self._next is None and len(self._arrivals) == self._expected:
            self._finish()

    async def _relay_chunks(self) -> None:
        """One sender per replica, relaying in chunk order: Ray may run an async actor's
        calls out of submission order, so a chunk that arrives early waits for its turn
        (a sequence number, as any pipelined broadcast has)."""
        inflight: deque = deque()
        for k in range(self._expected):
            offset, end = await self._slots[k]
            if len(inflight) >= _WINDOW:
                await inflight.popleft()
            inflight.append(await self._uplink.send(
                end - offset,
                lambda k=k, offset=offset, end=end: self._next.receive_chunk.remote(
                    k, offset, self._buffer[offset:end], self._index)))
            self._relayed.append(k)
        await asyncio.gather(*inflight)
        self._finish()

    async def wait_complete(self) -> int:
        if self._relay_task is not None:
            await self._relay_task  # a failed relay raises here instead of hanging
        await self._complete.wait()
        return self._index

    def arrivals(self) -> list[ChunkArrival]:
        """Chunks as they arrived (not necessarily in chunk order)."""
        return list(self._arrivals)

    def relayed(self) -> list[int]:
        """Chunks in the order this replica sent them on (empty for the chain's last)."""
        return list(self._relayed)

    # --- pull ---
    async def pull(self, registry) -> int | None:
        """Fetch the registry's latest version if it is newer than ours; returns the
        version now held (None: nothing published yet)."""
        latest = await registry.latest.remote()
        if latest is None:
            return self._version
        version, (ref,), layout, _ = latest
        if version == self._version:
            return version
        await registry.serve.remote(layout.total_bytes)  # the store's modelled egress
        view = await ref
        self._reset(layout)
        self._buffer[:] = view
        del view, ref  # our reference to the version ends here: the store may release it
        self._finish()
        self._version = version
        return version

    # --- what a replica holds ---
    def checksum(self) -> str:
        if self._state is None:
            raise RuntimeError(f"replica {self._index} holds no complete state")
        return state_checksum(self._state)

    def version(self) -> int | None:
        return self._version

    def state(self) -> dict:
        """The delivered tensors (for tests: compared tensor by tensor)."""
        if self._state is None:
            raise RuntimeError(f"replica {self._index} holds no complete state")
        return self._state


@ray.remote(num_cpus=0)
class VersionRegistryActor:
    """RLAX's parameter server, made of Ray's object store: holds the ObjectRef of the
    latest published version only, so older versions are released once no replica still
    reads them. ``serve`` is the store's modelled egress link (one uplink, serialised)."""

    def __init__(self, link: LinkSpec | None) -> None:
        self._link = link
        self._egress = asyncio.Lock()
        self._latest: tuple | None = None

    def publish(self, version: int, refs: list, layout: StateLayout, checksum: str) -> None:
        if self._latest is not None and version <= self._latest[0]:
            # SpecError's four-argument constructor does not survive Ray's pickling of a
            # task error: its one-paragraph message travels as a ValueError
            raise ValueError(str(SpecError("version", version, f"an integer > {self._latest[0]} (the latest published)")))
        self._latest = (version, tuple(refs), layout, checksum)

    def latest(self) -> tuple | None:
        return self._latest

    def retire(self) -> None:
        """Forget the latest version: nothing is published until the next push, and Ray
        frees the version once no replica still reads it (bounds the store between runs)."""
        self._latest = None

    def held_versions(self) -> list[int]:
        return [] if self._latest is None else [self._latest[0]]

    async def serve(self, nbytes: int) -> None:
        """The store's one egress uplink: pulls serialise for bytes / bandwidth, then the
        latency (which does not hold the uplink)."""
        if self._link is not None:
            async with self._egress:
                await asyncio.sleep(nbytes / self._link.bandwidth_bytes_s)
            await asyncio.sleep(self._link.latency_s)
