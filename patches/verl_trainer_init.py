"""verl 0.9.x: check the jigsaw options where verl builds its trainer, and turn on the v0 path.

Why: ``+jigsaw.*`` options are inert unless the jigsaw trainer runs; a user who sets them
and forgets ``trainer.v1.trainer_mode=jigsaw`` would get a plain verl run with no sign of it.
The v0 trainer (``trainer.use_v1=false``, ``RayPPOTrainer``) never reads
``trainer.v1.trainer_mode`` at all.

What:
- v1 (``verl/trainer/ppo/v1/trainer_base.py:120``, ``PPOTrainer.__init__``): a non-jigsaw
  trainer given a ``jigsaw`` config section raises a clear error naming the missing option.
- v0 (``verl/trainer/ppo/ray_trainer.py``, ``RayPPOTrainer.__init__``): when the config asks
  for jigsaw (``trainer.v1.trainer_mode=jigsaw`` or a ``jigsaw`` section), the trainer is
  observed through verl's own stage timers and the worker-group choke point
  (``adapters/verl/v0.py``).
Guarded: verl 0.9.x.
"""

from __future__ import annotations

import functools

from jigsaw_plugin.adapters.verl.version import check_version

__all__ = ["TARGET_V1", "TARGET_V0", "install_v1", "install_v0", "jigsaw_requested", "check_not_forgotten"]

TARGET_V1 = "verl.trainer.ppo.v1.trainer_base"
TARGET_V0 = "verl.trainer.ppo.ray_trainer"


def _get(cfg, *path, default=None):
    for key in path:
        if cfg is None:
            return default
        getter = getattr(cfg, "get", None)
        cfg = getter(key, None) if getter is not None else None
    return default if cfg is None else cfg


def jigsaw_requested(config) -> bool:
    """The config asks for jigsaw: ``trainer.v1.trainer_mode`` starts with ``jigsaw``, or it
    has a ``jigsaw`` section."""
    mode = _get(config, "trainer", "v1", "trainer_mode", default="")
    return str(mode).startswith("jigsaw") or _get(config, "jigsaw") is not None


def check_not_forgotten(config, trainer_cls) -> None:
    """Raise if ``+jigsaw.*`` options are set but a non-jigsaw v1 trainer was selected."""
    if _get(config, "jigsaw") is None or getattr(trainer_cls, "_jigsaw_trainer", False):
        return
    mode = _get(config, "trainer", "v1", "trainer_mode", default=None)
    raise ValueError(
        f"+jigsaw.* options are set but trainer.v1.trainer_mode is {mode!r}, so jigsaw would not run; "
        f"add trainer.v1.trainer_mode=jigsaw (or jigsaw_colocate_async), or drop the +jigsaw.* options"
    )


def _wrap_init(cls, wrap) -> bool:
    """Replace ``cls.__init__`` by ``wrap(original)`` once; ``False`` if already done."""
    original = cls.__init__
    if getattr(original, "_jigsaw", False):
        return False
    __init__ = functools.wraps(original)(wrap(original))
    __init__._jigsaw = True
    cls.__init__ = __init__
    return True


def install_v1(module, verl_version: str | None) -> bool:
    check_version(verl_version, what="jigsaw patch of PPOTrainer.__init__")

    def wrap(original):
        def __init__(self, config, *args, **kwargs):
            check_not_forgotten(config, type(self))
            original(self, config, *args, **kwargs)
        return __init__

    return _wrap_init(module.PPOTrainer, wrap)


def install_v0(module, verl_version: str | None) -> bool:
    check_version(verl_version, what="jigsaw patch of RayPPOTrainer.__init__")

    def wrap(original):
        def __init__(self, config, *args, **kwargs):
            original(self, config, *args, **kwargs)
            if jigsaw_requested(config):
                from jigsaw_plugin.adapters.verl.v0 import attach

                attach(self, module)
        return __init__

    return _wrap_init(module.RayPPOTrainer, wrap)
