"""verl 0.9.x on the CPU platform: count the platform's Ray resource in the pool check.

Why: ``ResourcePoolManager._check_resource_available`` (``single_controller/ray/base.py:226-242``)
counts only ``GPU``/``NPU`` and raises "Total available GPUs 0 ..." (240), although the
placement groups it checks for already ask for ``current_platform.ray_resource_name()``
(``base.py:144-148``). verl has no extension point for the check.

What: on the jigsaw CPU platform only, the same check counts the platform's resource
(``cpu_device``) and raises verl's own message with it; on any other platform verl's
method runs unchanged. Guarded: verl 0.9.x and the method's signature ``(self)``.
"""

from __future__ import annotations

import functools
import inspect

from jigsaw_plugin.adapters.verl.cpu_device import cpu_platform_active
from jigsaw_plugin.adapters.verl.version import check_version

__all__ = ["TARGET", "REASON", "install", "check_platform_resource"]

TARGET = "verl.single_controller.ray.base"
REASON = "the pool check counts only GPU/NPU (base.py:226-242), not the platform's Ray resource"
_EXPECTED = ("self",)


def check_platform_resource(available_per_node: dict, required: int, resource: str) -> None:
    """verl's check with ``resource`` in place of GPU: raise if the nodes hold fewer than ``required``."""
    available = sum(float(node.get(resource, 0)) for node in available_per_node.values())
    if available < required:
        raise ValueError(f"Total available {resource} {available:g} is less than total desired {resource} "
                         f"{required} (jigsaw CPU platform: start Ray with "
                         f"+ray_kwargs.ray_init.resources.{resource}={required})")


def install(module, verl_version: str | None) -> bool:
    """Wrap ``module.ResourcePoolManager._check_resource_available``; ``False`` if already done."""
    check_version(verl_version, what="jigsaw patch of ResourcePoolManager._check_resource_available")
    cls = module.ResourcePoolManager
    original = cls._check_resource_available
    if getattr(original, "_jigsaw", False):
        return False
    params = tuple(inspect.signature(original).parameters)
    if params != _EXPECTED:
        raise RuntimeError(f"jigsaw patch of {TARGET}.ResourcePoolManager._check_resource_available: expected "
                           f"parameters {_EXPECTED}, found {params}; this verl build differs from 0.9.1")

    @functools.wraps(original)
    def _check_resource_available(self):
        if not cpu_platform_active():
            return original(self)
        import ray
        from verl.plugin.platform import get_platform

        required = sum(n for nodes in self.resource_pool_spec.values() for n in nodes)
        check_platform_resource(ray._private.state.available_resources_per_node(), required,
                                get_platform().ray_resource_name())

    _check_resource_available._jigsaw = True
    cls._check_resource_available = _check_resource_available
    return True
