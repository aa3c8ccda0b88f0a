"""verl's FSDP training engines, registered for the ``cpu`` device through ``EngineRegistry``.

verl 0.9.1 registers ``FSDPEngineWithLMHead`` and ``FSDPEngineWithValueHead`` for
``device=["cuda", "npu"]`` (``workers/engine/fsdp/transformer_impl.py:1143, 1594``) and looks
the class up by the current platform's device (``workers/engine/base.py:405-432``). The same
classes run on CPU tensors with a gloo process group, so they are registered for ``cpu``
too, with verl's own decorator. Nothing else changes: the key ``cpu`` is only looked up when
verl's platform is the jigsaw CPU platform.
"""

from __future__ import annotations

from jigsaw_plugin.adapters.verl.cpu_device import PLATFORM_NAME

__all__ = ["TARGET", "register"]

TARGET = "verl.workers.engine.fsdp.transformer_impl"
_CLASSES = {"language_model": "FSDPEngineWithLMHead", "value_model": "FSDPEngineWithValueHead"}
_BACKENDS = ("fsdp", "fsdp2")


def register(module) -> dict[str, str]:
    """Register ``module``'s FSDP engines for ``cpu`` (idempotent); returns model_type -> class name."""
    from verl.workers.engine.base import EngineRegistry

    done = {}
    for model_type, cls_name in _CLASSES.items():
        cls = getattr(module, cls_name)  # AttributeError names the class a newer verl renamed
        for backend in _BACKENDS:
            try:
                EngineRegistry.register(model_type=model_type, backend=backend, device=PLATFORM_NAME)(cls)
            except AssertionError:  # verl's "already registed": a second load in this process
                pass
        done[model_type] = cls_name
    return done
