"""verl 0.9.x on the CPU platform: a process-group backend string torch accepts.

Why: ``utils/distributed.py:89`` builds ``f"cpu:gloo,{device}:{backend}"``; on the CPU platform
that is ``cpu:gloo,cpu:gloo`` and torch refuses it ("Duplicate device type cpu"). The backend
comes from the platform, but the ``cpu:gloo,`` prefix is hard-coded: no extension point.

What: on the jigsaw CPU platform only, ``initialize_global_process_group_ray`` called
without a backend gets ``cpu:gloo`` (what the string means once de-duplicated); otherwise
verl's function runs unchanged. Applied right after verl imports ``verl.utils.distributed``,
before its importers bind the name. Guarded: verl 0.9.x and the signature
``(timeout_second=None, backend=None)``.
"""

from __future__ import annotations

import functools
import inspect

from jigsaw_plugin.adapters.verl.cpu_device import cpu_platform_active
from jigsaw_plugin.adapters.verl.version import check_version

__all__ = ["TARGET", "REASON", "CPU_BACKEND", "install"]

TARGET = "verl.utils.distributed"
REASON = "distributed.py:89 prefixes cpu:gloo to the platform's backend: 'cpu:gloo,cpu:gloo' is refused by torch"
CPU_BACKEND = "cpu:gloo"
_EXPECTED = ("timeout_second", "backend")


def install(module, verl_version: str | None) -> bool:
    """Wrap ``module.initialize_global_process_group_ray``; ``False`` if already done."""
    check_version(verl_version, what="jigsaw patch of initialize_global_process_group_ray")
    original = module.initialize_global_process_group_ray
    if getattr(original, "_jigsaw", False):
        return False
    params = tuple(inspect.signature(original).parameters)
    if params != _EXPECTED:
        raise RuntimeError(f"jigsaw patch of {TARGET}.initialize_global_process_group_ray: expected parameters "
                           f"{_EXPECTED}, found {params}; this verl build differs from 0.9.1")

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and cpu_platform_active():
            backend = CPU_BACKEND
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray._jigsaw = True
    module.initialize_global_process_group_ray = initialize_global_process_group_ray
    return True
