"""verl 0.9 adapter (docs/verl.md); imports verl lazily, never at ``import jigsaw_plugin`` time.

Modules, one purpose each:

- ``entrypoint`` / ``plugin``: the ``verl.plugins`` entry point; loud failures; installs the rest.
- ``import_hooks``: run code when verl imports a module (nothing heavy at plugin load).
- ``version`` / ``options``: the version guard; the ``+jigsaw.*`` options.
- ``trainer``: ``trainer.v1.trainer_mode=jigsaw`` (and ``jigsaw_colocate_async``) in verl's registry.
- ``v0``: the v0 trainer, observed through verl's stage timers.
- ``reporter`` / ``session``: hook emission; coordinator membership and device leases.
- ``router`` / ``client`` / ``resize``: rollout routing, stable request ids, migration, resizing.
- ``cpu_device`` / ``cpu_platform`` / ``cpu_engines``: verl's ``cpu`` platform (``VERL_PLATFORM=cpu``)
  and FSDP engines for it, through verl's own registries.
- ``cpu_e2e`` / ``cpu_two_jobs`` / ``cpu_dataset`` / ``cpu_reward``: verl's own ``main_ppo`` on CPU
  (``make verl-e2e``): the command line, two jobs on one coordinator, the dataset, the rule reward.

Only ``client`` and ``cpu_platform`` import verl at module import (they subclass verl's
classes); they are imported inside verl (the trainers; verl's platform manager).
"""
