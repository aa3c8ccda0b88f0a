"""Install the overrides into an imported OpenRLHF 0.11.2 (driver process).

What is replaced, and where OpenRLHF reads it (paths relative to ``openrlhf/``):

* ``trainer.ppo_trainer.PPOTrainer`` and ``trainer.ppo_trainer_async.PPOTrainerAsync``:
  imported inside ``train()`` (``cli/train_ppo_ray.py:145-148``) -> the jigsaw trainers
  (``trainer.py``);
* ``trainer.ray.vllm_engine.RolloutRayActor``: looked up by ``create_vllm_engines`` at call
  time (``trainer/ray/vllm_engine.py:301``) -> ``JigsawRolloutActor`` (``engines.py``).

Both are module attributes read after this runs, by ``runpy`` re-executing
``openrlhf.cli.train_ppo_ray`` or by a user's own call of ``train(args)``. Nothing else of
OpenRLHF is changed. ``uninstall`` restores the originals.
"""

from __future__ import annotations

import time

from jigsaw_plugin.adapters.openrlhf.config import JigsawConfig, JigsawUsageError

__all__ = ["install", "uninstall", "installed"]

_ORIGINALS: dict = {}


def installed() -> bool:
    return bool(_ORIGINALS)


def install(config: JigsawConfig | None = None, **overrides) -> dict:
    """Patch OpenRLHF for ``config`` (or ``JigsawConfig(enable=True, **overrides)``).

    Returns the settings shipped to the trainer actors. Call after ``ray.init`` when a
    coordinator is named (it is created here so that every run of the cluster finds it).
    """
    from jigsaw_plugin.adapters.openrlhf.version import check_openrlhf

    if config is None:
        config = JigsawConfig(enable=True, **overrides)
    elif overrides:
        raise JigsawUsageError("install(config, **overrides): give a JigsawConfig or keywords, not both")
    check_openrlhf()
    import openrlhf.trainer.ppo_trainer as sync_mod
    import openrlhf.trainer.ppo_trainer_async as async_mod
    import openrlhf.trainer.ray.vllm_engine as engine_mod

    from jigsaw_plugin.adapters.openrlhf.engines import JigsawRolloutActor
    from jigsaw_plugin.adapters.openrlhf.trainer import JigsawAsyncDriverMixin, JigsawTrainerMixin, make_remote

    if installed():
        uninstall()
    settings = {**config.to_dict(), "t0": time.time()}
    if config.coordinator:
        import ray

        from jigsaw_plugin.runtime.coordinator import connect_coordinator

        if not ray.is_initialized():
            raise JigsawUsageError("--jigsaw.coordinator needs Ray running before install() (ray.init(...))")
        connect_coordinator(name=config.coordinator, namespace=config.namespace)
    _ORIGINALS.update({
        (sync_mod, "PPOTrainer"): sync_mod.PPOTrainer,
        (async_mod, "PPOTrainerAsync"): async_mod.PPOTrainerAsync,
        (engine_mod, "RolloutRayActor"): engine_mod.RolloutRayActor,
    })
    sync_mod.PPOTrainer = make_remote(JigsawTrainerMixin, _ORIGINALS[(sync_mod, "PPOTrainer")], settings)
    async_mod.PPOTrainerAsync = make_remote(JigsawAsyncDriverMixin, _ORIGINALS[(async_mod, "PPOTrainerAsync")],
                                            settings)
    engine_mod.RolloutRayActor = JigsawRolloutActor
    return settings


def uninstall() -> None:
    for (module, name), value in _ORIGINALS.items():
        setattr(module, name, value)
    _ORIGINALS.clear()
