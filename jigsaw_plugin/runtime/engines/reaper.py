"""Kill a process's children when it dies (engine actors killed by Ray leave vLLM running).

Ray kills an actor with SIGKILL when its owner dies (fate sharing) or on ``ray.kill``;
vLLM's engine-core and worker processes, children of that actor, are not told and keep
spinning for a minute or more. ``start_reaper()`` called in the actor after its engine is
up starts a small watchdog process on the same node that polls the actor's pid and, once
it is gone, kills the children it was handed. It uses no Ray, so it works on any node.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["start_reaper"]

_WATCHDOG = r"""
import os, signal, sys, time
parent, children = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of a dead parent is re-parented and reaped; /proc tells a zombie
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
while alive(parent):
    time.sleep(0.5)
for pid in children:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


def start_reaper(pid: int | None = None) -> subprocess.Popen | None:
    """Watch ``pid`` (default: this process); kill its current descendants when it exits."""
    import psutil

    pid = os.getpid() if pid is None else int(pid)
    children = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    if not children:
        return None
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(pid), *map(str, children)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # not in the actor's process group: it outlives it
