"""verl 0.9.x on the CPU platform: load new weights into vLLM through vLLM's in-place reload.

Why: verl's ``vLLMColocateWorkerExtension.update_weights_from_ipc``
(``workers/rollout/vllm_rollout/utils.py:248-355``) calls ``model.load_weights`` on the live
model, then ``process_weights_after_loading``. On a GPU the layers keep their parameters, so
that works. vLLM's CPU build packs each linear layer's weight into a oneDNN/SGL kernel at load
time and replaces the parameter by an empty one without a ``weight_loader``
(``vllm/model_executor/layers/utils.py:470-600``, ``remove_weight=True``): the next
``load_weights`` fails with "'Parameter' object has no attribute 'weight_loader'". verl has no
extension point for its weight loading.

What: on the jigsaw CPU platform only, and only for plain dense weights (no LoRA, QAT or
quantization), the same method runs inside vLLM's own in-place reload lifecycle
(``vllm/model_executor/model_loader/reload``): ``initialize_layerwise_reload(model)`` first
(layers back on their recorded shapes, loads buffered per layer and re-packed when complete),
and verl's closing ``process_weights_after_loading(model, model_config, device)`` answered by
``finalize_layerwise_reload(model, model_config)``, which processes what is left. The reload
keeps each tensor until its layer is complete, past verl's bucket callback, so
``_update_weights`` gets copies of the bucket's tensors (what verl itself does for LoRA,
``utils.py:374-376``: the bucket buffer is reused, and the shared-memory one is closed at the
end). verl's receiving, bucketing and loading code runs unchanged. Guarded: verl 0.9.x and the
signatures ``update_weights_from_ipc(self, peft_config=None, base_sync_done=False, use_shm=False)``
and ``_update_weights(self, weights, peft_config, base_sync_done)``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

from jigsaw_plugin.adapters.verl.cpu_device import cpu_platform_active
from jigsaw_plugin.adapters.verl.version import check_version

__all__ = ["TARGET", "REASON", "install"]

TARGET = "verl.workers.rollout.vllm_rollout.utils"
REASON = "vLLM's CPU build packs linear weights and drops their loaders; a live load_weights then fails"
_EXPECTED = ("self", "peft_config", "base_sync_done", "use_shm")
_EXPECTED_UPDATE = ("self", "weights", "peft_config", "base_sync_done")
_CLONE_FLAG = "_jigsaw_layerwise_reload"


def _plain_dense(ext, peft_config, is_quantized_model) -> bool:
    if peft_config or getattr(ext, "_is_qat_model", False) or getattr(ext, "_is_modelopt_qat", False):
        return False
    return not is_quantized_model(ext.model_runner.vllm_config)


@contextlib.contextmanager
def _layerwise_reload(ext):
    from vllm.model_executor.model_loader import utils as loader_utils
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    for model in ext._iter_all_models():
        initialize_layerwise_reload(model)
    verl_post_process = loader_utils.process_weights_after_loading

    def process_weights_after_loading(model, model_config, target_device):
        finalize_layerwise_reload(model, model_config)

    loader_utils.process_weights_after_loading = process_weights_after_loading  # verl imports it at call time
    setattr(ext, _CLONE_FLAG, True)
    try:
        yield
    finally:
        setattr(ext, _CLONE_FLAG, False)
        loader_utils.process_weights_after_loading = verl_post_process


def _check_params(fn, expected: tuple, what: str) -> None:
    params = tuple(inspect.signature(fn).parameters)
    if params != expected:
        raise RuntimeError(f"jigsaw patch of {TARGET}.vLLMColocateWorkerExtension.{what}: expected parameters "
                           f"{expected}, found {params}; this verl build differs from 0.9.1")


def install(module, verl_version: str | None) -> bool:
    """Wrap ``module.vLLMColocateWorkerExtension.update_weights_from_ipc``; ``False`` if already done."""
    check_version(verl_version, what="jigsaw patch of vLLMColocateWorkerExtension.update_weights_from_ipc")
    cls = module.vLLMColocateWorkerExtension
    original = cls.update_weights_from_ipc
    if getattr(original, "_jigsaw", False):
        return False
    original_update = cls._update_weights
    _check_params(original, _EXPECTED, "update_weights_from_ipc")
    _check_params(original_update, _EXPECTED_UPDATE, "_update_weights")

    @functools.wraps(original_update)
    def _update_weights(self, weights, peft_config, base_sync_done):
        if getattr(self, _CLONE_FLAG, False):
            weights = [(name, tensor.clone()) for name, tensor in weights]
        return original_update(self, weights, peft_config, base_sync_done)

    is_quantized_model = module.is_quantized_model  # the check verl's method itself makes

    @functools.wraps(original)
    def update_weights_from_ipc(self, peft_config=None, base_sync_done=False, use_shm=False):
        if not (cpu_platform_active() and _plain_dense(self, peft_config, is_quantized_model)):
            return original(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)
        with _layerwise_reload(self):
            return original(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)

    update_weights_from_ipc._jigsaw = True
    cls._update_weights = _update_weights
    cls.update_weights_from_ipc = update_weights_from_ipc
    return True
