"""What names the CPU platform of verl uses, and whether it is the current one (no verl import).

verl 0.9.1 selects its platform by ``VERL_PLATFORM`` (``plugin/platform/platform_manager.py:85-90``)
and otherwise falls back to ``nvidia``. The jigsaw plugin registers a platform named
:data:`PLATFORM_NAME` (``adapters/verl/cpu_platform.py``); every CPU-only patch asks
:func:`cpu_platform_active` so that it changes nothing on any other platform.
"""

from __future__ import annotations

import os
import sys

__all__ = ["PLATFORM_NAME", "PLATFORM_ENV", "RAY_RESOURCE", "VISIBLE_DEVICES_ENV", "cpu_platform_active",
           "cpu_platform_requested", "check_devices_exist"]

#: The value of ``VERL_PLATFORM`` that selects the CPU platform.
PLATFORM_NAME = "cpu"
PLATFORM_ENV = "VERL_PLATFORM"
#: The Ray custom resource that stands for one device (one per pretend device: bundle, actor).
RAY_RESOURCE = "cpu_device"
#: verl writes a replica's devices into the platform's visible-devices variable
#: (``vllm_async_server.py:135``); on CPU nothing reads it, so it gets a name of its own.
VISIBLE_DEVICES_ENV = "JIGSAW_CPU_VISIBLE_DEVICES"


def cpu_platform_requested() -> bool:
    """``VERL_PLATFORM=cpu`` is set (the platform is not resolved yet, or not by verl)."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME


def cpu_platform_active() -> bool:
    """verl's current platform is the jigsaw CPU platform.

    Asks verl's own ``get_platform()`` (resolving it if no one has yet) only where verl's
    platform manager is already imported; elsewhere the environment variable decides.
    """
    manager = sys.modules.get("verl.plugin.platform.platform_manager")
    if manager is None:
        return cpu_platform_requested()
    return getattr(manager.get_platform(), "device_name", None) == PLATFORM_NAME


def check_devices_exist(resource: str, cluster_resources: dict, required: int) -> None:
    """Refuse early, with the fix, when verl's platform asks Ray for devices it does not have.

    Without ``VERL_PLATFORM=cpu`` on a machine without GPUs verl falls back to its ``nvidia``
    platform and stops at its pool check ("Total available GPUs 0 is less than total desired
    GPUs 1", ``single_controller/ray/base.py:240``), which does not say what to do.
    """
    available = float(cluster_resources.get(resource, 0))
    if available >= required:
        return
    from jigsaw_plugin.errors import SpecError

    if resource == "GPU" and available == 0:
        raise SpecError(PLATFORM_ENV, os.environ.get(PLATFORM_ENV) or "(unset)",
                        f"{PLATFORM_NAME} to run verl on CPUs: this Ray cluster has no GPU, so verl's platform "
                        f"fell back to 'nvidia' (set {PLATFORM_ENV}={PLATFORM_NAME}, trainer.device=cpu and "
                        f"+ray_kwargs.ray_init.resources.{RAY_RESOURCE}=<devices>; docs/verl.md)",
                        where="trainer.v1.trainer_mode=jigsaw")
    raise SpecError(f"Ray resource {resource}", available,
                    f">= {required} (trainer.n_gpus_per_node x trainer.nnodes); on the CPU platform start Ray "
                    f"with +ray_kwargs.ray_init.resources.{resource}={required}",
                    where="trainer.v1.trainer_mode=jigsaw")
