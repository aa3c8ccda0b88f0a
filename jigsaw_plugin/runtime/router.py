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
    """One request across its segments (read-only outside the router)."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    sticky: str | None
    replica: int | None = None
    prefix: list[int] = field(default_factory=list)  # tokens of finished segments
    live: list[int] = field(default_factory=list)  # tokens of the running segment so far
    segments: int = 0
    migrations: int = 0  # moves that happened (counted when the aborted segment ended)
    move_to: int | None = None  # set by begin_migrate() while the abort is out: where the next segment runs
    sampling: dict = field(default_factory=dict)  # engine sampling keywords (SAMPLING_KEYS)
    evict: str | None = None  # set by begin_evict(): "keep" (resume with the prefix) or "drop" (from the first token)


#: Sampling keywords a request may carry to its engine (VLLMEngine.generate's).
SAMPLING_KEYS = ("greedy", "temperature", "sampling_seed")


def _segment_sampling(sampling: dict, segment: int) -> dict:
    """A resumed segment draws a fresh seeded stream: the same seed would replay the
    random numbers the first segment already used for its tokens."""
    if sampling.get("sampling_seed") is None or segment <= 1:
        return sampling
    return {**sampling, "sampling_seed": int(sampling["sampling_seed"]) + 7919 * (segment - 1)}


class Router:
    """Routes one pipeline's requests across its replicas (least in flight, sticky).

    Other modules use the public methods below; ``engines``, ``inflight``, ``retiring``,
    ``on_replica`` and ``_sticky`` are its implementation."""

    def __init__(self, engines: dict | None = None, on_event=None):
        self.engines: dict[int, object] = dict(engines or {})
        self.retiring: set[int] = set()
        self.inflight: dict[int, int] = {i: 0 for i in self.engines}
        self.requests: dict[str, RequestRecord] = {}
        self.on_replica: dict[int, dict[str, RequestRecord]] = {}  # replica -> its running records
        self._sticky: dict[str, int] = {}
        self._unwound: dict[int, list[asyncio.Future]] = {}  # replica -> drain_to calls waiting for it to empty
        self._on_event = on_event or (lambda name, **kw: None)
        self.finished = 0

    # ---- replicas -----------------------------------------------------------------------
    def add_replica(self, replica_id: int, engine) -> None:
        """Attach a replica: new requests may go to it at once."""
        if replica_id in self.engines:
            raise RouterError(f"replica {replica_id} already exists")
        self.engines[replica_id] = engine
        self.inflight[replica_id] = 0

    def replicas(self) -> list[int]:
        """Every attached replica, retiring ones included."""
        return list(self.engines)

    def live_replicas(self) -> list[int]:
        """Attached replicas that take new requests (not retiring)."""
        return [i for i in self.engines if i not in self.retiring]

    def engine(self, replica_id: int) -> object:
        """The engine handle of an attached replica."""
        self._require(replica_id)
        return self.engines[replica_id]

    def load(self, replica_id: int) -> int:
        """Requests in flight on a replica (0 for one not attached)."""
        return self.inflight.get(replica_id, 0)

    def records_on(self, replica_id: int) -> list[RequestRecord]:
        """The records of the requests whose current segment runs on the replica."""
        return list(self.on_replica.get(replica_id, {}).values())

    def mark_retiring(self, replica_id: int) -> None:
        """Stop routing new requests to the replica (those running there stay)."""
        self._require(replica_id)
        self.retiring.add(replica_id)

    def unmark_retiring(self, replica_id: int) -> None:
        """Route new requests to the replica again."""
        self._require(replica_id)
        self.retiring.discard(replica_id)

    def detach_replica(self, replica_id: int, force: bool = False) -> None:
        """Forget the replica (engine, counts, records, sticky entries); refuses while
        requests run there unless ``force`` (their segments then end without it)."""
        self._require(replica_id)
        running = max(self.load(replica_id), len(self.on_replica.get(replica_id, {})))
        if running and not force:
            raise RouterError(f"replica {replica_id} still has {running} request(s) in flight; "
                              f"drain_to() it first, or detach_replica(..., force=True)")
        self.engines.pop(replica_id)
        self.inflight.pop(replica_id, None)
        self.retiring.discard(replica_id)
        self.on_replica.pop(replica_id, None)
        for key in [k for k, r in self._sticky.items() if r == replica_id]:
            del self._sticky[key]

    async def drain_to(self, replica_id: int, target: int | None = None) -> int:
        """Stop routing to the replica, move each of its requests once (to ``target`` or the
        router's choice), wait until every one runs elsewhere, then detach it; returns how
        many moved (a request that finished before its abort landed is not counted)."""
        self._require(replica_id)
        others = [i for i in self.live_replicas() if i != replica_id]
        if target is not None and target not in others:
            raise RouterError(f"drain_to({replica_id}): target replica {target} is not live; "
                              f"live replicas besides it: {others}")
        if self.records_on(replica_id) and not others:
            raise RouterError(f"drain_to({replica_id}): no other live replica to move its requests to")
        self.retiring.add(replica_id)
        ours: list[tuple[RequestRecord, int]] = []  # (record, its migrations before) we aborted
        aborts = []
        for rec in self.records_on(replica_id):
            if rec.move_to is not None:
                continue  # already moving away (its abort is out): it must not move twice
            before = rec.migrations
            pending = self.begin_migrate(rec.request_id, target if target is not None
                                         else self.choose_replica(rec, exclude={replica_id}))
            if pending is not None:
                ours.append((rec, before))
                aborts.append(pending)
        results = await asyncio.gather(*(engine.abort(segment) for engine, segment in aborts),
                                       return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, EngineDead):
                raise res  # a dead engine's segments end with EngineDead and resume elsewhere
        while self.on_replica.get(replica_id):  # aborted segments unwind, then resume elsewhere
            waiter = asyncio.get_running_loop().create_future()
            self._unwound.setdefault(replica_id, []).append(waiter)
            await waiter
        if replica_id in self.engines:
            self.detach_replica(replica_id, force=True)  # only external acquire() counts can remain
        return sum(rec.migrations > before for rec, before in ours)

    async def remove_replica(self, replica_id: int, to: int | None = None) -> int:
        """``drain_to(replica_id, to)`` (the older name)."""
        return await self.drain_to(replica_id, to)

    # ---- requests -----------------------------------------------------------------------
    def choose_replica(self, rec: RequestRecord, exclude=frozenset()) -> int:
        """Where the request's next segment goes: its trajectory's replica if live, else
        the live replica with the fewest in flight (ties: lowest id)."""
        live = [i for i in self.live_replicas() if i not in exclude]
        if not live:
            raise RouterError(f"no live replica for request {rec.request_id}")
        if rec.sticky is not None and self._sticky.get(rec.sticky) in live:
            return self._sticky[rec.sticky]
        return min(live, key=lambda i: (self.inflight[i], i))

    def trajectory_replica(self, sticky: str) -> int | None:
        """The replica a trajectory (sticky key) last ran on, or ``None``."""
        return self._sticky.get(sticky)

    def clear_sticky(self) -> int:
        """Forget every trajectory's replica; returns how many were forgotten."""
        cleared = len(self._sticky)
        self._sticky.clear()
        return cleared

    def acquire(self, replica_id: int, sticky: str | None = None) -> None:
        """Count a request dispatched to the replica outside ``generate`` (verl's balancer)."""
        self._require(replica_id)
        if replica_id in self.retiring:
            raise RouterError(f"replica {replica_id} is retiring; live: {self.live_replicas()}")
        self.inflight[replica_id] += 1
        if sticky is not None:
            self._sticky[sticky] = replica_id

    def release_slot(self, replica_id: int) -> None:
        """Uncount one ``acquire``; a replica detached meanwhile is ignored."""
        if self.inflight.get(replica_id, 0) > 0:
            self.inflight[replica_id] -= 1

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
                if rec.move_to is None and rec.segments and not self.live_replicas():
                    # evicted, nowhere to go: its tokens wait for a replica (the executor is told, so
                    # that its policy sees a request that needs one)
                    self._on_event("waiting", request_id=request_id, generated_tokens=len(rec.prefix))
                    await self._wait_for_replica()
                    self._on_event("placed", request_id=request_id)
                target = rec.move_to if rec.move_to is not None else self.choose_replica(rec)
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
        except RequestAborted as e:  # keep the prefix (the abort's result), go on where migrate() said
            rec.prefix = rec.prefix + list(e.tokens)
            if rec.evict is not None:  # begin_evict(): the next segment goes where choose_replica() says
                kept, rec.evict = rec.evict == "keep", None
                if kept:
                    rec.migrations += 1
                    self._on_event("migrated", request_id=rec.request_id, src_replica=replica, dst_replica=None,
                                   generated_tokens=len(rec.prefix))
                else:
                    self._on_event("restarted", request_id=rec.request_id, replica=replica,
                                   dropped_tokens=len(rec.prefix))
                    rec.prefix = []
                return False
            if rec.move_to is not None:  # a migration (an interrupt leaves move_to unset)
                if rec.move_to not in self.live_replicas():  # its destination retired meanwhile
                    rec.move_to = self.choose_replica(rec)
                rec.migrations += 1
                # Counted here, from the segment's result: a remote engine's progress
                # never reaches rec.live, and a request that finished first did not move.
                self._on_event("migrated", request_id=rec.request_id, src_replica=replica, dst_replica=rec.move_to,
                               generated_tokens=len(rec.prefix))
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
            if not self.on_replica.get(replica):
                for waiter in self._unwound.pop(replica, []):
                    if not waiter.done():
                        waiter.set_result(None)

    def end_trajectory(self, sticky: str) -> None:
        """Forget a finished trajectory's sticky replica (keeps memory flat per request)."""
        self._sticky.pop(sticky, None)

    def begin_migrate(self, request_id: str, dst: int):
        """Mark a request to move to ``dst``; returns ``(engine, segment_id)`` to abort on the
        source, or ``None`` if there is nothing to abort: not running, already on ``dst``,
        or already moving (its abort is out; only its destination changes, so it never
        moves twice). Synchronous, so an executor can release the source's devices at once
        and abort right after. The ``migrated`` event follows when the aborted segment ends."""
        rec = self.requests.get(request_id)
        if rec is None:
            raise RouterError(f"request {request_id} is not in flight")
        if dst not in self.engines or dst in self.retiring:
            raise RouterError(f"replica {dst} is not live")
        src = rec.replica
        if src is None or src == dst:
            return None
        if rec.move_to is not None:
            rec.move_to = dst
            return None
        rec.move_to = dst
        return self.engines[src], f"{request_id}#{rec.segments}"

    def begin_evict(self, request_id: str, keep_tokens: bool = True):
        """Mark a running request to leave its replica (the replica is being preempted, or
        the step restarts); returns ``(engine, segment_id)`` to abort, or ``None`` if it is
        not running or already moving. Its next segment runs where ``choose_replica`` says
        (mark the replica retiring first to keep it off it), waiting for a live replica if
        there is none, with its generated prefix (``keep_tokens``: a ``migrated`` event) or
        from its first token (a ``restarted`` event)."""
        rec = self.requests.get(request_id)
        if rec is None:
            raise RouterError(f"request {request_id} is not in flight")
        if rec.replica is None or rec.move_to is not None or rec.evict is not None:
            return None
        rec.evict = "keep" if keep_tokens else "drop"
        return self.engines[rec.replica], f"{request_id}#{rec.segments}"

    async def migrate(self, request_id: str, dst: int) -> None:
        """Abort the request where it runs; its next segment runs on ``dst``."""
        pending = self.begin_migrate(request_id, dst)
        if pending is None:
            return
        engine, segment = pending
        await engine.abort(segment)
        await asyncio.sleep(0)  # let the aborted segment unwind

    # ---- internals ----------------------------------------------------------------------
    async def _wait_for_replica(self, poll_s: float = 0.005) -> None:
        while not self.live_replicas():
            await asyncio.sleep(poll_s)

    def _require(self, replica_id: int) -> None:
        if replica_id not in self.engines:
            raise RouterError(f"replica {replica_id} is not attached; attached: {self.replicas()}")
