"""EMULATED rollout engine: for control-plane tests and scale runs only, never for results.

An ``EmulatedEngine`` has the interface of the real vLLM engine (``generate`` / ``abort`` /
``load``) but no model: running requests advance one token per decode step, a step takes
the cost model's ``decode_step_s`` for the current batch (times ``time_scale``, so a test
runs fast), and each next token is a deterministic function of the sequence so far, as
greedy decoding is. That makes routing, migration and fault handling testable without
vLLM, and lets the control plane be driven at 64+ devices on one machine. Every result it
produces is labelled ``backend="emulated"``.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field

__all__ = ["EmulatedEngine", "RequestAborted", "EngineDead", "next_token"]

VOCAB = 2048


def next_token(sequence: list[int]) -> int:
    """A deterministic 'greedy' next token of a sequence (crc32 of its last 8 tokens)."""
    tail = ",".join(map(str, sequence[-8:])).encode()
    return zlib.crc32(tail) % VOCAB


class RequestAborted(Exception):
    """``generate`` ended early by ``abort``; ``tokens`` holds what was generated."""

    def __init__(self, request_id: str, tokens: list[int]):
        super().__init__(f"request {request_id} aborted after {len(tokens)} tokens")
        self.request_id = request_id
        self.tokens = tokens


class EngineDead(Exception):
    """The engine is gone (crashed or shut down); in-flight requests must go elsewhere."""


@dataclass
class _Req:
    prompt: list[int]
    max_tokens: int
    out: list[int] = field(default_factory=list)
    done: asyncio.Future | None = None
    on_progress: object = None


class EmulatedEngine:
    """One emulated replica (see the module docstring). Not thread-safe: one event loop."""

    backend = "emulated"

    def __init__(self, cost=None, model=None, tp: int = 1, time_scale: float = 1.0, max_num_seqs: int = 256):
        self.cost, self.model, self.tp = cost, model, tp
        self.time_scale = time_scale
        self.max_num_seqs = max_num_seqs
        self._reqs: dict[str, _Req] = {}
        self._task: asyncio.Task | None = None
        self.dead = False
        self.steps = 0
        self.version = 0

    # ---- interface shared with the vLLM engine ------------------------------------------
    async def generate(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                       on_progress=None, greedy: bool = True, temperature: float = 1.0,
                       sampling_seed: int | None = None) -> list[int]:
        # Sampling keywords are accepted and ignored: EMULATED tokens are a fixed function
        # of the context (next_token), so a migrated request stays checkable.
        if self.dead:
            raise EngineDead(f"engine is dead; request {request_id} not accepted")
        if request_id in self._reqs:
            raise ValueError(f"request {request_id} is already running on this engine")
        req = _Req(list(prompt_token_ids), int(max_tokens), done=asyncio.get_running_loop().create_future(),
                   on_progress=on_progress)
        self._reqs[request_id] = req
        if max_tokens <= 0:
            self._finish(request_id)
        self._ensure_loop()
        return await req.done

    async def abort(self, request_id: str) -> list[int]:
        req = self._reqs.pop(request_id, None)
        if req is None:
            return []
        if not req.done.done():
            req.done.set_exception(RequestAborted(request_id, list(req.out)))
        return list(req.out)

    async def load(self) -> int:
        """Requests in flight (queued or running)."""
        return len(self._reqs)

    async def update_weights(self, version: int) -> None:
        self.version = version

    def kill(self) -> None:
        """Crash: every in-flight ``generate`` raises ``EngineDead`` (fault tests)."""
        self.dead = True
        for rid, req in list(self._reqs.items()):
            if not req.done.done():
                req.done.set_exception(EngineDead(f"engine died with {rid} in flight ({len(req.out)} tokens)"))
        self._reqs.clear()
        if self._task:
            self._task.cancel()

    # ---- decode loop --------------------------------------------------------------------
    def _ensure_loop(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def _step_s(self, batch: int, kv: float) -> float:
        if self.cost is None:
            return 0.001 * self.time_scale
        return self.cost.decode_step_s(self.model, self.tp, batch, kv) * self.time_scale

    async def _run(self) -> None:
        while self._reqs and not self.dead:
            running = list(self._reqs.items())[: self.max_num_seqs]
            kv = sum(len(r.prompt) + len(r.out) for _, r in running)
            await asyncio.sleep(self._step_s(len(running), kv))
            self.steps += 1
            for rid, req in running:
                if self._reqs.get(rid) is not req:
                    continue  # aborted during the step
                req.out.append(next_token(req.prompt + req.out))
                if req.on_progress is not None:
                    req.on_progress(len(req.out), req.out[-1])
                if len(req.out) >= req.max_tokens:
                    self._finish(rid)

    def _finish(self, rid: str) -> None:
        req = self._reqs.pop(rid)
        if not req.done.done():
            req.done.set_result(list(req.out))
