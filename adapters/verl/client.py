"""verl's LLM server client with stable request ids (abort one request, resume it elsewhere).

verl 0.9.1 gives every vLLM request a fresh uuid (``LLMServerClient._vllm_request_id``,
``workers/rollout/llm_server.py:90-96``), so nobody outside the client can name a running
request to abort it. ``JigsawLLMServerClient`` names attempt ``k`` of request ``r``
``"{r}#{k}"`` and tells the balancer that id at acquire time; a ``JigsawLoadBalancer`` can
then abort exactly that request on its server, and the resume loop inherited from verl's
``FullyAsyncLLMServerClient`` (prompt + generated tokens, ``llm_server.py:225-351``) sends
the rest to the server the balancer picks: migration by recompute.

With verl's default balancer the extra fields are not asked for and the client behaves
exactly like ``FullyAsyncLLMServerClient`` (ids stay stable, which vLLM accepts).
"""

from __future__ import annotations

import itertools

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

__all__ = ["JigsawLLMServerClient"]


class _AttemptReporter(LLMServerClient):
    """One attempt = one vLLM request; tells a jigsaw balancer how it ended."""

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        output = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
        if self._jigsaw_balancer():
            server_id = self._jigsaw_last_server.pop(request_id, None)
            self._load_balancer.attempt_done.remote(request_id, server_id, len(output.token_ids), output.stop_reason)
        return output


class JigsawLLMServerClient(FullyAsyncLLMServerClient, _AttemptReporter):
    """``FullyAsyncLLMServerClient`` with stable vLLM ids ``"{request_id}#{attempt}"``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._jigsaw_attempts: dict[str, itertools.count] = {}
        self._jigsaw_current: dict[str, str] = {}
        self._jigsaw_last_server: dict[str, str] = {}

    def __getstate__(self):  # shipped to AgentLoopWorker actors: counters start fresh there
        state = dict(self.__dict__)
        state.update(_jigsaw_attempts={}, _jigsaw_current={}, _jigsaw_last_server={})
        return state

    def _jigsaw_balancer(self) -> bool:
        return bool(self._lb_require_acquire_fields) and "jigsaw_vllm_id" in self._lb_require_acquire_fields

    def stable_id(self, request_id: str) -> str | None:
        """The vLLM id of ``request_id``'s latest attempt (``None`` before its first)."""
        return self._jigsaw_current.get(request_id)

    async def _acquire_server(self, request_id: str, **extra):
        counter = self._jigsaw_attempts.setdefault(request_id, itertools.count())
        vllm_id = f"{request_id}#{next(counter)}"
        self._jigsaw_current[request_id] = vllm_id
        params = extra.get("sampling_params") or {}
        extra.update(jigsaw_vllm_id=vllm_id, jigsaw_prompt_tokens=len(extra.get("prompt_ids") or ()),
                     jigsaw_max_tokens=int(params.get("max_tokens", params.get("max_new_tokens", 0)) or 0))
        server_id, handle = await super()._acquire_server(request_id, **extra)
        self._jigsaw_last_server[request_id] = server_id
        return server_id, handle

    def _vllm_request_id(self, request_id: str) -> str:
        return self._jigsaw_current.get(request_id) or super()._vllm_request_id(request_id)
