"""verl 0.9.x on the CPU platform: a device id for the platform's Ray custom resource.

Why: ``workers/rollout/vllm_rollout/vllm_async_server.py:1348`` reads
``ray.get_runtime_context().get_accelerator_ids()[get_resource_name()][0]`` in each rollout
worker. Ray keeps ids only for its accelerator resources (GPU, NPU, ...), not for a custom
resource such as ``cpu_device``, so the lookup is a ``KeyError``. verl only writes the id into
the platform's visible-devices variable, which nothing reads on CPU. verl has no extension
point there (the call is inside a lambda run on the worker).

What: Ray's ``RuntimeContext.get_accelerator_ids`` is wrapped; on the jigsaw CPU platform
only, when the answer has no entry for the platform's resource, it gets one: the worker's
``LOCAL_RANK`` (which verl sets in each worker), as a string like Ray's own ids. Every other
key, process and platform sees Ray's answer unchanged. Guarded: verl 0.9.x and the method's
signature ``(self)``.
"""

from __future__ import annotations

import functools
import inspect
import os

from jigsaw_plugin.adapters.verl.cpu_device import RAY_RESOURCE, cpu_platform_active
from jigsaw_plugin.adapters.verl.version import check_version

__all__ = ["TARGET", "REASON", "install", "with_platform_ids"]

TARGET = "ray.runtime_context"
REASON = "vllm_async_server.py:1348 indexes get_accelerator_ids() by the platform resource; Ray keeps none for a custom one"
_EXPECTED = ("self",)


def with_platform_ids(ids: dict, resource: str = RAY_RESOURCE, local_rank: str | None = None) -> dict:
    """``ids`` plus ``{resource: [local_rank]}`` if it has no entry for ``resource``."""
    if ids.get(resource):
        return ids
    rank = local_rank if local_rank is not None else os.environ.get("LOCAL_RANK", "0")
    return {**ids, resource: [str(rank)]}


def install(module, verl_version: str | None) -> bool:
    """Wrap ``module.RuntimeContext.get_accelerator_ids``; ``False`` if already done."""
    check_version(verl_version, what="jigsaw patch of ray RuntimeContext.get_accelerator_ids")
    cls = module.RuntimeContext
    original = cls.get_accelerator_ids
    if getattr(original, "_jigsaw", False):
        return False
    params = tuple(inspect.signature(original).parameters)
    if params != _EXPECTED:
        raise RuntimeError(f"jigsaw patch of {TARGET}.RuntimeContext.get_accelerator_ids: expected parameters "
                           f"{_EXPECTED}, found {params}; this Ray build differs from the one verl 0.9.1 uses")

    @functools.wraps(original)
    def get_accelerator_ids(self):
        ids = original(self)
        if not cpu_platform_active():
            return ids
        return with_platform_ids(ids)

    get_accelerator_ids._jigsaw = True
    cls.get_accelerator_ids = get_accelerator_ids
    return True
