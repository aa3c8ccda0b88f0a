"""Rollout engines that can be routed per request and migrated.

OpenRLHF's ``RolloutRayActor`` (``trainer/ray/vllm_engine.py:33-206``) serves whole
prompts (``generate_responses``: all n samples of a prompt on one engine) and generates
each request under a random id (``generate``, 159-177), so a request can neither be
aborted nor resumed elsewhere. ``JigsawRolloutActor`` subclasses it (through
``__ray_actor_class__``: Ray actor classes cannot be subclassed directly) and adds, on the
same vLLM engine:

* ``generate_segment(segment_id, prompt_token_ids, sampling_params)``: one request under a
  caller-chosen id; returns its tokens, log-probs and finish reason, ``aborted=True`` if it
  was aborted (its tokens so far are then the prefix to resume with);
* ``abort_segment(segment_id)``: abort it, return the tokens it generated;
* ``progress()``: tokens generated so far by every segment in flight;
* ``jigsaw_load_weights(payload)``: weights as bytes into the running engine (no NCCL).

``install`` makes ``create_vllm_engines`` build this class: it reads the module global
``RolloutRayActor`` at call time (``vllm_engine.py:301``). ``RolloutEngine`` puts an actor
handle behind the interface of jigsaw's request router (``runtime/router.py``).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field

import ray
from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

from jigsaw_plugin.adapters.openrlhf.worker_ext import EXTENSION
from jigsaw_plugin.runtime.emulated import RequestAborted

__all__ = ["JigsawRolloutActorImpl", "JigsawRolloutActor", "RolloutEngine", "RequestTable", "RequestState"]

_Base = RolloutRayActor.__ray_actor_class__


@dataclass
class _Segment:
    tokens: list = field(default_factory=list)
    aborted: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


class JigsawRolloutActorImpl(_Base):
    """OpenRLHF's rollout actor plus per-request control (see the module docstring)."""

    async def __init__(self, *args, **kwargs):
        if kwargs.get("worker_extension_cls") == "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap":
            kwargs["worker_extension_cls"] = EXTENSION
        self._segments: dict[str, _Segment] = {}
        await super().__init__(*args, **kwargs)

    async def generate_segment(self, segment_id: str, prompt_token_ids, sampling_params) -> dict:
        from vllm.inputs import TokensPrompt

        seg = self._segments.setdefault(segment_id, _Segment())
        last = None
        try:
            if not seg.aborted:  # an abort may arrive before the request starts
                stream = self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_token_ids)),
                                           copy.deepcopy(sampling_params), request_id=segment_id)
                try:
                    async for out in stream:
                        last = out
                        seg.tokens = list(out.outputs[0].token_ids) if out.outputs else []
                        if out.finished or seg.aborted:
                            break
                finally:
                    await stream.aclose()  # closing an unfinished stream aborts it in vLLM
            finish = last.outputs[0].finish_reason if last is not None and last.finished and last.outputs else None
            completion = last.outputs[0] if last is not None and last.outputs else None
            return {
                "token_ids": list(seg.tokens),
                "logprobs": list(completion.logprobs) if completion is not None and completion.logprobs else None,
                "finish_reason": finish,
                "aborted": finish in (None, "abort"),
            }
        finally:
            self._segments.pop(segment_id, None)
            seg.done.set()

    async def abort_segment(self, segment_id: str) -> list:
        seg = self._segments.get(segment_id)
        if seg is None:
            self._segments[segment_id] = seg = _Segment()
            seg.aborted = True  # not started yet: generate_segment will return at once
            return []
        seg.aborted = True
        await self.llm.abort(segment_id)
        await seg.done.wait()
        return list(seg.tokens)

    def progress(self) -> dict:
        return {sid: len(seg.tokens) for sid, seg in self._segments.items() if not seg.done.is_set()}

    async def jigsaw_load_weights(self, payload) -> int:
        """``payload``: ``[name, dtype, shape, bytes]`` items (``vllm_engine._tensor_to_wire``)."""
        n = await self.llm.collective_rpc("jigsaw_load_weights", args=(payload,))
        await self.llm.reset_prefix_cache()
        return n[0] if isinstance(n, list) and n else n


JigsawRolloutActor = ray.remote(JigsawRolloutActorImpl)


@dataclass
class RequestState:
    """One request (one turn of one sample) across its segments."""

    sampling_params: object
    turn: int = 0
    tokens: list = field(default_factory=list)
    logprobs: list | None = None
    finish_reason: str | None = None
    replica: int | None = None
    segments: int = 0


class RequestTable(dict):
    """request id -> RequestState, shared by the rollout controller and the engines."""


class RolloutEngine:
    """A ``JigsawRolloutActor`` handle behind the router's engine interface.

    ``generate(segment_id, prompt_token_ids, max_tokens)`` runs one segment with the
    request's own sampling parameters (its ``max_tokens`` replaced by the remaining budget)
    and raises ``RequestAborted`` with the prefix when the segment was aborted.
    ``on_submit(request_id, replica, prompt_tokens, max_tokens)`` and
    ``on_abort(request_id, replica, generated_tokens)`` report to the caller's hooks.
    """

    def __init__(self, replica: int, handle, table: RequestTable, eos_token_id=None, on_submit=None, on_abort=None):
        self.replica, self.handle, self.table = replica, handle, table
        self.eos_token_id = eos_token_id
        self.on_submit = on_submit or (lambda *a: None)
        self.on_abort = on_abort or (lambda *a: None)

    async def generate(self, segment_id: str, prompt_token_ids, max_tokens: int, *, on_progress=None, **_):
        request_id = segment_id.rsplit("#", 1)[0]
        state = self.table[request_id]
        if max_tokens <= 0 or (state.tokens and state.finish_reason == "stop"):
            return []  # the previous segment had already finished it
        params = copy.deepcopy(state.sampling_params)
        params.max_tokens = int(max_tokens)
        if getattr(params, "min_tokens", 0):
            params.min_tokens = max(0, min(params.min_tokens - len(state.tokens), int(max_tokens)))
        state.replica = self.replica
        state.segments += 1
        self.on_submit(request_id, self.replica, len(prompt_token_ids), int(max_tokens))
        res = await self.handle.generate_segment.remote(segment_id, list(prompt_token_ids), params)
        state.tokens += res["token_ids"]
        if res["logprobs"] is not None:
            state.logprobs = (state.logprobs or []) + list(res["logprobs"])
        if res["aborted"]:
            self.on_abort(request_id, self.replica, len(res["token_ids"]))
            raise RequestAborted(segment_id, res["token_ids"])
        state.finish_reason = res["finish_reason"]
        return res["token_ids"]

    async def abort(self, segment_id: str):
        return await self.handle.abort_segment.remote(segment_id)

    async def progress(self) -> dict:
        return await self.handle.progress.remote()
