"""verl 0.9.x with vLLM >= 0.32: abort one request by the id verl gave it.

Why: ``vLLMHttpServer.abort_request(request_id)`` (``workers/rollout/vllm_rollout/
vllm_async_server.py:1046-1087``) looks the request up in
``engine.output_processor.request_states`` by the id verl passed to ``engine.generate`` and
calls ``output_processor.abort_requests([request_id])``. vLLM 0.32 keys ``request_states`` by
an *internal* id (the caller's id plus a random suffix, ``external_req_ids`` maps one to the
other) and its ``abort_requests`` takes an ``internal`` flag: verl's method answers "Request
... not found" for a running request (seen in a real run: every migration the coordinator's
policy chose was lost that way). The jigsaw balancer's ``migrate`` needs exactly this call.

What: where vLLM's ``OutputProcessor.abort_requests`` takes the ``internal`` flag, the method
answers "not found" as verl's does when no running request has that id, else aborts it by
the caller's id through ``AsyncLLM.abort`` (vLLM maps it to its internal ids and gives the
generator a final ABORT output holding the tokens so far, which verl's resume loop keeps),
resets the prefix cache if asked (verl's default), and answers verl's dict. Any platform (the mismatch is vLLM's, not the
CPU's); verl 0.9.x and the signature ``abort_request(self, request_id,
reset_prefix_cache=True)`` guarded; an older vLLM without the id split keeps verl's method.
"""

from __future__ import annotations

import functools
import inspect

from jigsaw_plugin.adapters.verl.version import check_version

__all__ = ["TARGET", "REASON", "install"]

TARGET = "verl.workers.rollout.vllm_rollout.vllm_async_server"
REASON = "vLLM 0.32 keys its requests by internal ids: verl's abort_request finds no running request"
_EXPECTED = ("self", "request_id", "reset_prefix_cache")
_FLAG = "_jigsaw_internal_id_abort"


def install(module, version: str | None) -> bool:
    """Patch ``module.vLLMHttpServer.abort_request``; returns whether it was patched."""
    check_version(version, f"patch {__name__}")
    cls = module.vLLMHttpServer
    original = cls.abort_request
    if getattr(original, _FLAG, False):
        return True
    params = tuple(inspect.signature(original).parameters)
    if params != _EXPECTED:
        raise RuntimeError(f"{__name__}: vLLMHttpServer.abort_request{params} is not the verl 0.9.1 signature "
                           f"{_EXPECTED}; not patched ({REASON})")
    from vllm.v1.engine.output_processor import OutputProcessor

    if "internal" not in inspect.signature(OutputProcessor.abort_requests).parameters:
        return False  # this vLLM keys requests by the caller's id: verl's method works

    @functools.wraps(original)
    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True):
        if self.node_rank != 0:
            return {"aborted": False, "request_id": request_id}
        try:
            processor = self.engine.output_processor
            if not any(i in processor.request_states for i in processor.external_req_ids.get(request_id, ())):
                return {"aborted": False, "error": f"Request {request_id} not found"}
            # by the caller's id: vLLM aborts its internal requests and gives each generator a
            # final ABORT output holding the tokens so far (output_processor.abort_requests)
            await self.engine.abort(request_id)
            if reset_prefix_cache:
                await self.clear_kv_cache()
            return {"aborted": True, "request_id": request_id}
        except Exception as e:  # verl's own contract: an answer, not a raise
            return {"aborted": False, "request_id": request_id, "error": str(e)}

    setattr(abort_request, _FLAG, True)
    cls.abort_request = abort_request
    return True
