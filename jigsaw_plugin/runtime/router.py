"""Request-level router for one pipeline's rollout replicas: dispatch, migration, resizing,
fault recovery. Engine-agnostic: works with any engine exposing
``generate(request_id, prompt_token_ids, max_tokens, on_progress=...)`` and
``abort(request_id)`` (the vLLM engine, the emulated one, or Ray actor handles wrapped so).

Every request has exactly one ``Router.generate`` call, which returns exactly once with the
request's full output. Under it, the request may run in several *segments*: a migration
aborts it on one replica and resubmits prompt + generated prefix with the remaining budget
on another (recompute, as verl's FullyAsyncLLMServerClient does); a replica that dies
leaves the request's prefix known from progress callbacks, and the request resumes on a
live replica the same way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from jigsaw_plugin.runtime.emulated import EngineDead, RequestAborted

__all__ = ["Router", "RouterError", "RequestRecord"]


class RouterError(RuntimeError):
    """A routing request that cannot be served (no live replica, unknown request)."""


@dataclass
class RequestRecord:
    request_id: str
    prompt: list[int]
    max_tokens: int
    sticky: str | None
    replica: int | None = None
    prefix: list[int] = field(default_factory=list)  # tokens of finished segments
    live: list[int] = field(default_factory=list)  # tokens of the running segment so far
    segments: int = 0
    migrations: int = 0
    move_to: int | None = None  # set by migrate(): where the next segment runs
    sampling: dict = field(default_factory=dict)  # engine sampling keywords (SAMPLING_KEYS)


#: Sampling keywords a request may carry to its engine (VLLMEngine.generate's).
SAMPLING_KEYS = ("greedy", "temperature", "sampling_seed")


def _segment_sampling(sampling: dict, segment: int) -> dict:
    """A resumed segment draws a fresh seeded stream: the same seed would replay the
    random numbers the first segment already used for its tokens."""
    if sampling.get("sampling_seed") is None or segment <= 1:
        return sampling
    return {**sampling, "sampling_seed": int(sampling["sampling_seed"]) + 7919 * (segment - 1)}


class Router:
    """Routes one pipeline's requests across its replicas (least in flight, sticky)."""

    def __init__(self, engines: dict | None = None, on_event=None):
        self.engines: dict[int, object] = dict(engines or {})
        self.retiring: set[int] = set()
        self.inflight: dict[int, int] = {i: 0 for i in self.engines}
        self.requests: dict[str, RequestRecord] = {}
        self.on_replica: dict[int, dict[str, RequestRecord]] = {}  # replica -> its running records
        self._sticky: dict[str, int] = {}
        self._on_event = on_event or (lambda name, **kw: None)
        self.finished = 0

    # ---- replicas -----------------------------------------------------------------------
    def add_replica(self, replica_id: int, engine) -> None:
        if replica_id in self.engines:
            raise RouterError(f"replica {replica_id} already exists")
        self.engines[replica_id] = engine
        self.inflight[replica_id] = 0

    async def remove_replica(self, replica_id: int, to: int | None = None) -> int:
        """Stop routing to a replica and migrate its requests away; returns how many moved."""
        self.retiring.add(replica_id)
        moved = 0
        for rec in [r for r in self.requests.values() if r.replica == replica_id]:
            dst = to if to is not None else self._choose(rec, exclude={replica_id})
            await self.migrate(rec.request_id, dst)
            moved += 1
        self.engines.pop(replica_id, None)
        self.inflight.pop(replica_id, None)
        self.retiring.discard(replica_id)
        return moved

    def live_replicas(self) -> list[int]:
        return [i for i in self.engines if i not in self.retiring]

    def load(self, replica_id: int) -> int:
        return self.inflight.get(replica_id, 0)

    # ---- requests -----------------------------------------------------------------------
    def _choose(self, rec: RequestRecord, exclude=frozenset()) -> int:
        live = [i for i in self.live_replicas() if i not in exclude]
        if not live:
            raise RouterError(f"no live replica for request {rec.request_id}")
        if rec.sticky is not None and self._sticky.get(rec.sticky) in live:
            return self._sticky[rec.sticky]
        return min(live, key=lambda i: (self.inflight[i], i))

    async def generate(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                       sticky: str | None = None, sampling: dict | None = None) -> list[int]:
        """Generate ``max_tokens`` tokens for the request; returns once with all of them.

        ``sampling``: keywords for the engine (``SAMPLING_KEYS``); default greedy."""
        if request_id in self.requests:
            raise RouterError(f"request {request_id} is already in flight")
        bad = sorted(set(sampling or {}) - set(SAMPLING_KEYS))
        if bad:
            raise RouterError(f"request {request_id}: sampling keys {bad} are not supported; "
                              f"allowed: {', '.join(SAMPLING_KEYS)}")
        rec = RequestRecord(request_id, list(prompt_token_ids), int(max_tokens), sticky, sampling=dict(sampling or {}))
        self.requests[request_id] = rec
        try:
            while True:
                target = rec.move_to if rec.move_to is not None else self._choose(rec)
                rec.move_to = None
                done = await self._segment(rec, target)
                if done:
                    out = rec.prefix
                    self.finished += 1
                    self._on_event("finished", request_id=request_id, replica=target,
                                   generated_tokens=len(out), segments=rec.segments)
                    return out
        finally:
            self.requests.pop(request_id, None)

    async def _segment(self, rec: RequestRecord, replica: int) -> bool:
        engine = self.engines[replica]
        rec.replica, rec.live = replica, []
        self.on_replica.setdefault(replica, {})[rec.request_id] = rec
        rec.segments += 1
        if rec.sticky is not None:
            self._sticky[rec.sticky] = replica
        self.inflight[replica] += 1
        remaining = rec.max_tokens - len(rec.prefix)

        def progress(n_tokens: int, token: int) -> None:
            rec.live.append(token)

        try:
            out = await engine.generate(f"{rec.request_id}#{rec.segments}", rec.prompt + rec.prefix, remaining,
                                        on_progress=progress, **_segment_sampling(rec.sampling, rec.segments))
            rec.prefix = rec.prefix + list(out)
            return True
        except RequestAborted as e:  # migrated: keep the prefix, go on where migrate() said
            rec.prefix = rec.prefix + list(e.tokens)
            return False
        except EngineDead:  # fault: the prefix seen through progress survives
            rec.prefix = rec.prefix + rec.live
            self.retiring.add(replica)
            self._on_event("replica_died", replica=replica, request_id=rec.request_id,
                           generated_tokens=len(rec.prefix))
            return False
        finally:
            if replica in self.inflight:
                self.inflight[replica] -= 1
            self.on_replica.get(replica, {}).pop(rec.request_id, None)
            rec.replica = None

    def end_trajectory(self, sticky: str) -> None:
        """Forget a finished trajectory's sticky replica (keeps memory flat per request)."""
        self._sticky.pop(sticky, None)

    def begin_migrate(self, request_id: str, dst: int):
        """Mark a request to move to ``dst``; returns ``(engine, segment_id)`` to abort on the
        source, or ``None`` if there is nothing to move. Synchronous, so an executor can
        release the source's devices at once and abort right after."""
        rec = self.requests.get(request_id)
        if rec is None:
            raise RouterError(f"request {request_id} is not in flight")
        if dst not in self.engines or dst in self.retiring:
            raise RouterError(f"replica {dst} is not live")
        src = rec.replica
        if src is None or src == dst:
            return None
        rec.move_to = dst
        rec.migrations += 1
        self._on_event("migrated", request_id=request_id, src_replica=src, dst_replica=dst,
                       generated_tokens=len(rec.prefix) + len(rec.live))
        return self.engines[src], f"{request_id}#{rec.segments}"

    async def migrate(self, request_id: str, dst: int) -> None:
        """Abort the request where it runs; its next segment runs on ``dst``."""
        pending = self.begin_migrate(request_id, dst)
        if pending is None:
            return
        engine, segment = pending
        await engine.abort(segment)
        await asyncio.sleep(0)  # let the aborted segment unwind
