"""verl 0.9 adapter (docs/verl.md); imports verl lazily, never at ``import jigsaw_plugin`` time.

Modules, one purpose each:

- ``entrypoint`` / ``plugin``: the ``verl.plugins`` entry point; loud failures; installs the rest.
- ``import_hooks``: run code when verl imports a module (nothing heavy at plugin load).
- ``version`` / ``options``: the version guard; the ``+jigsaw.*`` options.
- ``trainer``: ``trainer.v1.trainer_mode=jigsaw`` (and ``jigsaw_colocate_async``) in verl's registry.
- ``v0``: the v0 trainer, observed through verl's stage timers.
- ``reporter`` / ``session``: hook emission; coordinator membership and device leases.
- ``router`` / ``client`` / ``resize``: rollout routing, stable request ids, migration, resizing.

Only ``client`` imports verl at module import (it subclasses verl's client); it is imported
by the jigsaw trainers, inside verl.
"""
