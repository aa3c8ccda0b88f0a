"""What the ``verl.plugins`` entry point does, in every verl process.

verl imports each entry point of the group from ``verl/__init__.py:55-76`` and swallows any
exception at DEBUG level, so nothing here may fail silently: every failure is printed to
stderr at once and kept in :data:`ERRORS`, and a trainer selected with
``trainer.v1.trainer_mode=jigsaw`` refuses to start while :data:`ERRORS` is not empty
(:func:`raise_if_broken`), naming each failure.

Nothing heavy is imported here: the trainer classes are defined and registered when verl
imports ``verl.trainer.ppo.v1`` (its registry), the worker-group patch is applied when verl
imports ``verl.single_controller.ray.base``, and so on (``import_hooks``).

The CPU platform (``cpu_platform``) and the FSDP engines for ``cpu`` (``cpu_engines``) are
registered through verl's own registries in every process; the patches that only the CPU
platform needs are installed only where ``VERL_PLATFORM=cpu`` selects it, and each of them
acts only while verl's current platform is that one.
"""

from __future__ import annotations

import sys
import traceback

from jigsaw_plugin.adapters.verl.import_hooks import when_imported
from jigsaw_plugin.adapters.verl.version import is_supported

__all__ = ["ERRORS", "LOADED", "load", "verl_version", "raise_if_broken", "JigsawVerlPluginError"]

#: ``(what, message)`` of every failure of this plugin in this process.
ERRORS: list[tuple[str, str]] = []
#: What was installed in this process (``what`` -> detail), for tests and diagnostics.
LOADED: dict[str, object] = {}


class JigsawVerlPluginError(RuntimeError):
    """The jigsaw verl plugin could not install itself; the message lists why."""


def verl_version() -> str | None:
    """verl's version, without importing verl (the entry point runs inside its import)."""
    module = sys.modules.get("verl")
    found = getattr(module, "__version__", None)
    if found:
        return str(found)
    try:
        import importlib.metadata as md

        return md.version("verl")
    except Exception:
        return None


def report_failure(what: str, exc: BaseException) -> None:
    """A failure of ``what`` kept in ``ERRORS`` (the trainer then refuses to start) and printed."""
    message = f"{type(exc).__name__}: {exc}"
    ERRORS.append((what, message))
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3))
    print(f"jigsaw-plugin (verl): {what} failed: {message}\n{tail}", file=sys.stderr, flush=True)


def guarded(what: str, fn):
    """``fn`` wrapped so that a failure is reported loudly and never breaks verl's import."""

    def run(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
            LOADED[what] = result
            return result
        except Exception as e:
            report_failure(what, e)
            return None

    return run


def raise_if_broken(what: str = "trainer.v1.trainer_mode=jigsaw") -> None:
    if ERRORS:
        lines = "; ".join(f"{w}: {m}" for w, m in ERRORS)
        raise JigsawVerlPluginError(f"{what}: the jigsaw verl plugin did not install: {lines}")


def load() -> None:
    """Install the jigsaw trainer registration and the version-guarded patches (idempotent)."""
    if LOADED.get("entrypoint"):
        return
    LOADED["entrypoint"] = True
    version = verl_version()
    LOADED["verl_version"] = version
    if not is_supported(version):
        # Not an error yet: verl may run without jigsaw. Selecting jigsaw then fails clearly.
        print(f"jigsaw-plugin (verl): verl {version!r} is not a supported version (0.9.x); "
              f"trainer.v1.trainer_mode=jigsaw will refuse to start", file=sys.stderr, flush=True)

    from jigsaw_plugin.patches import verl_func_generator, verl_trainer_init, verl_vllm_version

    guarded("patch verl_vllm_version", verl_vllm_version.install)(version)
    when_imported(verl_func_generator.TARGET,
                  guarded("patch verl_func_generator", lambda m: verl_func_generator.install(m, version)))
    when_imported(verl_trainer_init.TARGET_V1,
                  guarded("patch verl_trainer_init (v1)", lambda m: verl_trainer_init.install_v1(m, version)))
    when_imported(verl_trainer_init.TARGET_V0,
                  guarded("patch verl_trainer_init (v0)", lambda m: verl_trainer_init.install_v0(m, version)))

    def register(module):
        from jigsaw_plugin.adapters.verl.trainer import install

        return install(module)

    when_imported("verl.trainer.ppo.v1", guarded("register jigsaw trainers", register))
    from jigsaw_plugin.adapters.verl import vllm_abort

    when_imported(vllm_abort.TARGET, guarded("patch vllm_abort", lambda m: vllm_abort.install(m, version)))
    _load_cpu_platform(version)


def _load_cpu_platform(version: str | None) -> None:
    """The CPU platform and engines (verl's registries), and the patches only it needs."""
    from jigsaw_plugin.adapters.verl import cpu_engines
    from jigsaw_plugin.adapters.verl.cpu_device import cpu_platform_requested

    def register_platform(module):
        from jigsaw_plugin.adapters.verl import cpu_platform

        return cpu_platform.register(module).__name__

    when_imported("verl.plugin.platform.platform_manager", guarded("register cpu platform", register_platform))
    when_imported(cpu_engines.TARGET, guarded("register cpu engines", cpu_engines.register))
    from jigsaw_plugin.patches import tq_job_namespace

    if tq_job_namespace.requested():  # several verl jobs on one Ray cluster
        when_imported(tq_job_namespace.TARGET, guarded("patch tq_job_namespace",
                                                       lambda m: tq_job_namespace.install(m, version)))
    if not cpu_platform_requested():
        return
    from jigsaw_plugin.patches import (verl_accelerator_ids, verl_gloo_backend, verl_resource_check,
                                       verl_vllm_cpu_reload)

    for patch in (verl_resource_check, verl_gloo_backend, verl_accelerator_ids, verl_vllm_cpu_reload):
        name = f"patch {patch.__name__.rsplit('.', 1)[-1]}"
        when_imported(patch.TARGET, guarded(name, lambda m, patch=patch: patch.install(m, version)))
