"""A CPU platform for verl 0.9.x, registered through verl's own ``PlatformRegistry``.

verl 0.9.1 resolves its platform once per process (``plugin/platform/platform_manager.py``):
``VERL_PLATFORM`` names it, otherwise it probes the registered ones and falls back to
``nvidia``. This module adds the platform ``cpu`` (selected only by ``VERL_PLATFORM=cpu``; its
probe answers no, so no machine picks it by accident):

- device ``cpu``, collective backend ``gloo``;
- one Ray custom resource per device (:data:`~jigsaw_plugin.adapters.verl.cpu_device.RAY_RESOURCE`):
  verl's placement groups already ask for ``ray_resource_name()`` (``single_controller/ray/base.py:144-148``);
- no cross-process device memory (``is_ipc_supported() -> False``): verl then moves weights to
  its vLLM servers through its shared-memory fallback;
- ``torch.cpu`` as the device module, completed with the memory calls verl makes on a GPU
  (``empty_cache``, ``mem_get_info``, ...) as no-ops or host-memory answers.

Imports verl and torch at module import: it is imported only when verl itself imports its
platform manager (``adapters/verl/plugin.py``).
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from jigsaw_plugin.adapters.verl.cpu_device import PLATFORM_NAME, RAY_RESOURCE, VISIBLE_DEVICES_ENV

__all__ = ["PlatformCPU", "CPU_DEVICE_MODULE", "CpuDeviceIndex", "register"]


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory: what ``mem_get_info`` means on CPU."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:  # psutil comes with Ray; sysconf is the fallback
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_AVPHYS_PAGES"), page * os.sysconf("SC_PHYS_PAGES")


class CpuDeviceIndex(str):
    """The current device "index" on CPU: ``"cpu"`` to torch, ``0`` in a format string.

    verl uses ``get_device_id()`` both as a torch device (``model.to(device=get_device_id())``,
    ``fsdp_utils.py:507``) and as an index (``f"{get_device_name()}:{get_device_id()}"``,
    ``bucketed_weight_transfer.py:183``). An int is an accelerator index to torch ("Cannot access
    accelerator device when none is available"); ``"cpu"`` would make ``"cpu:cpu"``. This
    answers both: torch reads the string ``cpu``, formatting gives ``cpu:0``.
    """

    def __new__(cls):
        return super().__new__(cls, PLATFORM_NAME)

    def __format__(self, spec: str) -> str:
        return format(0, spec)

    def __reduce__(self):
        return (CpuDeviceIndex, ())


CURRENT_DEVICE = CpuDeviceIndex()


def _none(*args, **kwargs) -> None:
    return None


def _zero(*args, **kwargs) -> int:
    return 0


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes (grep of verl 0.9.1:
    ``get_torch_device().<name>``), each a no-op or a host-memory answer."""
    module = types.ModuleType("jigsaw_cpu_device", "torch.cpu completed for verl's device calls")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    extra = {
        "current_device": lambda: CURRENT_DEVICE,
        "device_count": lambda: 1,
        "is_available": lambda: True,
        "get_device_name": lambda *a: "cpu",
        "set_device": _none,
        "empty_cache": _none,
        "ipc_collect": _none,
        "reset_peak_memory_stats": _none,
        "set_per_process_memory_fraction": _none,
        "memory_allocated": _zero,
        "max_memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_reserved": _zero,
        "mem_get_info": lambda *a: _host_memory(),
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_rng_state": lambda *a: torch.get_rng_state(),
        "set_rng_state": lambda state, *a: torch.set_rng_state(state),
    }
    for name, fn in extra.items():
        setattr(module, name, fn)
    return module


CPU_DEVICE_MODULE = _device_module()


class PlatformCPU(PlatformBase):
    """verl's platform interface on host CPUs: gloo, ``cpu`` tensors, a Ray custom resource."""

    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return PLATFORM_NAME

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return False  # never auto-detected: only VERL_PLATFORM=cpu selects it

    def current_device(self) -> CpuDeviceIndex:
        return CURRENT_DEVICE

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # expandable segments are a CUDA caching-allocator setting

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return VISIBLE_DEVICES_ENV

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return RAY_RESOURCE

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register(platform_manager=None) -> type[PlatformCPU]:
    """Register :class:`PlatformCPU` as ``cpu`` in verl's registry (idempotent)."""
    registry = getattr(platform_manager, "PlatformRegistry", PlatformRegistry)
    if registry.get(PLATFORM_NAME) is not PlatformCPU:
        registry.register(platform=PLATFORM_NAME)(PlatformCPU)
    return PlatformCPU
