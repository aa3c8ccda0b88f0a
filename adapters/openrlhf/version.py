"""Which OpenRLHF this adapter supports, and the guard that says so clearly.

The interception points (docs/openrlhf.md) are file:line facts of one release: the
trainer classes picked inside ``train()``, ``SamplesGenerator``'s dispatch, the module
global ``RolloutRayActor`` that ``create_vllm_engines`` looks up at call time. Another
release may move any of them, so other versions are refused rather than half-patched.
"""

from __future__ import annotations

from importlib import metadata

from jigsaw_plugin.adapters.openrlhf.config import JigsawUsageError

__all__ = ["SUPPORTED_VERSIONS", "check_openrlhf"]

SUPPORTED_VERSIONS = ("0.11.2",)
_INSTALL = "see docs/openrlhf.md (on CPU: `make venv-openrlhf`)"


def check_openrlhf(import_modules: bool = True) -> str:
    """Return the installed OpenRLHF version, or raise ``JigsawUsageError`` saying what is needed.

    ``import_modules`` also imports the modules the overrides patch, so that a broken
    environment (e.g. flash_attn or vLLM missing) is reported here, in one line.
    """
    need = " or ".join(f"openrlhf=={v}" for v in SUPPORTED_VERSIONS)
    try:
        found = metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        raise JigsawUsageError(f"OpenRLHF is not installed; this adapter needs {need} ({_INSTALL})") from None
    if found not in SUPPORTED_VERSIONS:
        raise JigsawUsageError(f"OpenRLHF {found} is installed; this adapter supports only {need} ({_INSTALL})")
    if import_modules:
        for module in ("openrlhf.trainer.ppo_trainer", "openrlhf.trainer.ppo_trainer_async",
                       "openrlhf.trainer.ray.vllm_engine", "openrlhf.trainer.ppo_utils.samples_generator"):
            try:
                __import__(module)
            except ImportError as e:
                raise JigsawUsageError(f"OpenRLHF {found} is installed but {module} does not import: {e} "
                                       f"({_INSTALL})") from None
    return found
