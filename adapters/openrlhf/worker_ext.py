"""The vLLM worker extension of the adapter's rollout engines.

OpenRLHF's engines load ``openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap`` into each
vLLM worker (NCCL / CUDA-IPC weight updates from the policy actors). This class keeps all
of it and adds jigsaw's ``jigsaw_load_weights`` (tensors shipped as bytes through vLLM's
utility RPC, ``runtime/engines/vllm_engine.py``), the weight path that needs neither NCCL
nor CUDA. Imported inside vLLM worker processes: keep its imports light.
"""

from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

from jigsaw_plugin.runtime.engines.vllm_engine import WorkerWeightsExtension

__all__ = ["JigsawWorkerWrap", "EXTENSION"]

EXTENSION = "jigsaw_plugin.adapters.openrlhf.worker_ext.JigsawWorkerWrap"


class JigsawWorkerWrap(WorkerWrap, WorkerWeightsExtension):
    """OpenRLHF's WorkerWrap plus ``jigsaw_load_weights``."""
