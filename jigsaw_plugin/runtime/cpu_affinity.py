"""One device = one core on CPU machines: pin a process tree (every thread) to cores.

A rollout engine on device k and a trainer stage granted device k must compete for core
k, and only for it, or a CPU A/B measures the OS scheduler instead of the policy. Linux
only (``sched_setaffinity``); elsewhere pinning is skipped and says so.
"""

from __future__ import annotations

import os

__all__ = ["cores_of", "pin_process_tree", "pin_this_process"]


def cores_of(devices) -> list[int]:
    """Device index -> core id (device k is core k modulo this node's cores)."""
    n = os.cpu_count() or 1
    return sorted({int(d) % n for d in devices})


def _pin_threads(pid: int, cores: list[int]) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that just ended


def pin_this_process(devices) -> list[int]:
    """Pin every thread of this process to the devices' cores; returns the cores."""
    return pin_process_tree(os.getpid(), devices, children=False)


def pin_process_tree(pid: int, devices, children: bool = True) -> list[int]:
    """Pin every thread of ``pid`` (and of its descendants) to the devices' cores."""
    cores = cores_of(devices)
    if not hasattr(os, "sched_setaffinity"):
        return []
    pids = [int(pid)]
    if children:
        import psutil

        pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
    for p in pids:
        try:
            _pin_threads(p, cores)
        except FileNotFoundError:
            pass
    return cores
