"""The coordinator policy's chosen migrations, carried out in OpenRLHF's rollout.

Under a coordinator policy the rollout controller (``rollout.py``) does not consolidate
tails by its own rule: the policy sees the run's requests one by one (the request events
the adapter forwards) and chooses which to move; the coordinator queues each choice as a
command for this pipeline, and the controller fetches and carries them out here, on jigsaw's
``Router`` over the step's engines, with the same abort + resume-with-prefix path the tail
rule uses (``Router.begin_migrate``; the router's ``migrated`` event and the engine's
aborted segment become ``jigsaw_request_migrated`` and ``jigsaw_request_aborted(reason=
"migrate")`` in ``rollout.py``).

A server id is an engine's index in OpenRLHF's engine list (the pool is fixed for the run;
the i-th device of a rollout grant runs engine i), which is also the ``replica`` of every
request event the adapter emits.

An engine the policy empties (every request running there is moving away) stops taking new
requests at once and, once its aborted segments have unwound, is detached and its device
given back mid-rollout (``release``: part of the rollout's grant, ``replica_release``), as
after the tail rule's consolidation. A command that can no longer be carried out (the
request finished, or its destination engine is off) is dropped with its reason, never an
error: the policy decided on a view that was a poll interval old.

Pure: no OpenRLHF, vLLM or Ray import (unit-tested with emulated engines).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Iterable

from jigsaw_plugin.runtime.router import Router, RouterError

__all__ = ["MoveOutcome", "PolicyMoves", "MOVED", "DROPPED"]

MOVED, DROPPED = "moved", "dropped"


@dataclass(frozen=True)
class MoveOutcome:
    """What became of one command: ``moved`` (its abort is out; the request resumes on
    ``dst`` with its prefix) or ``dropped`` with the reason."""

    request_id: str
    src: int
    dst: int
    status: str
    reason: str = ""


class PolicyMoves:
    """Carries out one rollout's migration commands on its router (module docstring).

    :param router: the rollout's router (engine index -> engine).
    :param release: called with an engine index once that engine, emptied by the policy's
        moves, is detached (the caller gives its device back).
    """

    def __init__(self, router: Router, release: Callable[[int], None]):
        self.router, self.release = router, release
        self._leaving: set[int] = set()  # engines emptied by the policy, not yet detached
        self.outcomes: list[MoveOutcome] = []
        self.released: list[int] = []

    def _running_on(self, request_id: str) -> int | None:
        for i in self.router.replicas():
            if any(r.request_id == request_id for r in self.router.records_on(i)):
                return i
        return None

    async def carry_out(self, commands: Iterable) -> list[MoveOutcome]:
        """Start every command's move (the aborts run together), then stop routing to each
        engine all of whose running requests are now moving away. ``commands``: objects
        with ``request_id``, ``src_server`` and ``dst_server``."""
        outcomes, aborts, sources = [], [], set()
        for cmd in commands:
            rid, src, dst = str(cmd.request_id), int(cmd.src_server), int(cmd.dst_server)
            where = self._running_on(rid)
            if where is None:
                outcomes.append(MoveOutcome(rid, src, dst, DROPPED, "not running (finished, or between turns)"))
                continue
            if dst not in self.router.live_replicas():
                outcomes.append(MoveOutcome(rid, src, dst, DROPPED,
                                            f"engine {dst} is not on (live engines: {self.router.live_replicas()})"))
                continue
            if where == dst:
                outcomes.append(MoveOutcome(rid, src, dst, DROPPED, f"already on engine {dst}"))
                continue
            try:
                pending = self.router.begin_migrate(rid, dst)
            except RouterError as e:  # it finished between the check and here
                outcomes.append(MoveOutcome(rid, src, dst, DROPPED, str(e)))
                continue
            if pending is not None:
                aborts.append(pending)
            outcomes.append(MoveOutcome(rid, where, dst, MOVED))
            sources.add(where)
        destinations = {o.dst for o in outcomes if o.status == MOVED}
        for src in sources - destinations:  # an engine that receives requests stays on
            running = self.router.records_on(src)
            if src in self.router.live_replicas() and all(r.move_to is not None for r in running) \
                    and len(self.router.live_replicas()) > 1:
                self.router.mark_retiring(src)  # no new request goes there: it is being emptied
                self._leaving.add(src)
        await asyncio.gather(*(engine.abort(segment) for engine, segment in aborts), return_exceptions=True)
        self.outcomes += outcomes
        return outcomes

    def release_emptied(self) -> list[int]:
        """Detach every engine the policy emptied whose aborted segments have unwound, and
        hand it to ``release``; returns those engines."""
        done = []
        for src in sorted(self._leaving):
            if src not in self.router.replicas():
                self._leaving.discard(src)  # detached by someone else (the rollout ended)
                continue
            if not self.router.records_on(src) and self.router.load(src) == 0:
                self.router.detach_replica(src)
                self._leaving.discard(src)
                self.release(src)
                done.append(src)
        self.released += done
        return done
