"""The v0 trainer (``trainer.use_v1=false``): observed through verl's own stage timers.

``RayPPOTrainer.fit`` (``verl/trainer/ppo/ray_trainer.py:1405``) has no per-stage methods
to override, but it wraps every stage in ``marked_timer(name, timing_raw)`` with the same
names jigsaw uses (``gen`` 1510, ``reward`` 1561, ``old_log_prob`` 1585, ``ref``, ``values``
1626, ``adv`` 1630, ``update_critic`` 1678, ``update_actor`` 1689, ``update_weights`` 1715,
inside ``step`` 1508), looked up as a module global at call time. :func:`attach` swaps that
global for a timer that fires the jigsaw hooks and then runs verl's own timer.

Sizes come from the worker-group choke point (``patches/verl_func_generator.py``): the
first data-carrying worker-group call inside a stage gives its sample count (and token
count from ``attention_mask``, where present). ``gen`` runs through the agent loop, not a
worker group, so its sizes stay 0 on the v0 path.
"""

from __future__ import annotations

from contextlib import contextmanager

from jigsaw_plugin.adapters.verl.options import algorithm_of, parse_options, resolve_staleness
from jigsaw_plugin.adapters.verl.session import JigsawSession
from jigsaw_plugin.hookspecs import STAGES
from jigsaw_plugin.patches import verl_func_generator

__all__ = ["attach", "V0Observer", "data_sizes"]

_TIMER_TO_STAGE = {name: name for name in STAGES if name != "weight_sync"}
_TIMER_TO_STAGE["update_weights"] = "weight_sync"


def data_sizes(data) -> tuple[int, int]:
    """``(samples, tokens)`` of a DataProto / TensorDict argument (``(0, 0)`` if unknown)."""
    batch = getattr(data, "batch", data)
    try:
        samples = len(data)
    except TypeError:
        return 0, 0
    tokens = 0
    try:
        mask = batch["attention_mask"]
        tokens = int(mask.sum())
    except Exception:
        pass
    return int(samples), tokens


class V0Observer:
    """Hooks for one ``RayPPOTrainer``: its timers and its worker-group calls."""

    def __init__(self, trainer, module, session: JigsawSession):
        self.trainer, self.module, self.session = trainer, module, session
        self.original_timer = module.marked_timer
        self._stage: str | None = None
        self._sizes: tuple[int, int] | None = None

    def install(self) -> None:
        self.module.marked_timer = self.timer
        verl_func_generator.add_observer(self.on_call)

    def uninstall(self) -> None:
        self.module.marked_timer = self.original_timer
        verl_func_generator.remove_observer(self.on_call)

    def on_call(self, wg, method_name, phase, args, kwargs, output) -> None:
        if phase == "start" and self._stage is not None and self._sizes is None and args:
            sizes = data_sizes(args[0])
            if sizes[0]:
                self._sizes = sizes

    @contextmanager
    def timer(self, name, timing_raw, *args, **kwargs):
        rep = self.session.reporter
        stage = _TIMER_TO_STAGE.get(name)
        with self.original_timer(name, timing_raw, *args, **kwargs):
            if name == "step":
                t = self.trainer
                self.session.start({"algorithm": algorithm_of(t.config.algorithm.adv_estimator, t.use_critic,
                                                              t.use_reference_policy),
                                    "adv_estimator": str(t.config.algorithm.adv_estimator), "mode": "sync",
                                    "trainer": "v0"})
                rep.step_start()
                try:
                    yield
                finally:
                    rep.step_end()
                return
            if stage is None or self._stage is not None:
                yield
                return
            self._stage, self._sizes = stage, None
            rep.stage_start(stage, self.session.devices_for(stage, ()) if stage != "adv" else ())
            try:
                yield
            finally:
                samples, tokens = self._sizes or (0, 0)
                rep.stage_end(stage, samples, tokens)
                self.session.stage_done(stage)
                self._stage = None


def attach(trainer, module) -> V0Observer:
    """Observe ``trainer`` (a ``RayPPOTrainer``) built by ``module`` (``ray_trainer``)."""
    from jigsaw_plugin.adapters.verl import plugin

    plugin.raise_if_broken(what="jigsaw on the v0 trainer")
    config = trainer.config
    section = config.get("jigsaw", None)
    options = parse_options(dict(section.items()) if section is not None else {},
                            default_pipeline=str(config.trainer.experiment_name))
    resolve_staleness(options, "sync")  # the v0 trainer (RayPPOTrainer) is on-policy: a bound > 0 is an error
    n_devices = int(config.trainer.get("n_gpus_per_node", 1)) * int(config.trainer.get("nnodes", 1))
    observer = V0Observer(trainer, module, JigsawSession(options, n_devices))
    observer.install()
    trainer.jigsaw_v0 = observer
    return observer
