"""The trainer override: OpenRLHF's trainer actors with the jigsaw hooks and rollout control.

``train()`` picks its trainer inside the function (``cli/train_ppo_ray.py:145-148``) from
the module attributes ``openrlhf.trainer.ppo_trainer.PPOTrainer`` and
``openrlhf.trainer.ppo_trainer_async.PPOTrainerAsync``; ``install`` replaces those with the
classes built here. Ray actor classes cannot be subclassed directly, so the subclass is of
``__ray_actor_class__`` and is made remote again. It is created at run time with the run's
settings as a class attribute, so Ray ships it to the trainer's worker *by value*, settings
included (a patch made in the driver would not reach the worker).

Hooks fired (``hookspecs.py``), per step, in this order for the synchronous trainer:
``step_start``; ``stage gen`` (with request hooks, and ``stage reward`` inside it when the
reward is computed per sample during generation); ``stage reward`` (reward model),
``old_log_prob``, ``values``, ``ref`` (started together, as OpenRLHF dispatches them);
``adv``; ``update_critic`` / ``update_actor``; ``weight_sync`` (with
``weight_sync_start``/``end``); ``step_end``. Around the run: ``register_pipeline``,
``pipeline_start``, ``pipeline_end``; device leases around ``gen`` and the training stages.
"""

from __future__ import annotations

from pathlib import Path

import ray

from jigsaw_plugin.adapters.openrlhf.experience import HookedExperienceMaker
from jigsaw_plugin.adapters.openrlhf.hooks import RunHooks, stage
from jigsaw_plugin.adapters.openrlhf.rollout import JigsawSamplesGenerator, StepClock

__all__ = ["JigsawTrainerMixin", "JigsawGeneratorMixin", "JigsawAsyncDriverMixin", "make_remote"]


def make_remote(mixin, remote_base, settings: dict, **options):
    """``ray.remote`` of a fresh ``mixin`` + ``remote_base.__ray_actor_class__`` subclass
    carrying ``settings`` (shipped by value: its name is not importable from this module)."""
    base = remote_base.__ray_actor_class__
    name = f"Jigsaw{base.__name__}"
    cls = type(name, (mixin, base), {"jigsaw_settings": dict(settings), "__module__": __name__,
                                      "__qualname__": f"make_remote.<locals>.{name}"})
    return ray.remote(**options)(cls) if options else ray.remote(cls)


def _weight_bytes(pretrain: str) -> int:
    """Bytes moved by one weight sync: the checkpoint's safetensors files (0 if not local)."""
    path = Path(pretrain)
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else 0


def _replace_generator(obj, hooks, clock, settings) -> None:
    old = obj.samples_generator
    obj.samples_generator = JigsawSamplesGenerator(
        old.strategy, old.prompts_dataloader, old.eval_dataloader, old.tokenizer, old.vllm_engines,
        hooks=hooks, clock=clock, settings=settings)


class JigsawTrainerMixin:
    """Mixed in front of ``PPOTrainer`` (sync) or ``TrainingActor`` (async)."""

    jigsaw_settings: dict = {}

    def __init__(self, pretrain, strategy, *args, **kwargs):
        super().__init__(pretrain, strategy, *args, **kwargs)
        args_ = strategy.args
        settings = dict(self.jigsaw_settings)
        self.jigsaw = hooks = RunHooks(settings)
        self.jigsaw_clock = clock = StepClock(hooks)
        n_engines = len(self.vllm_engines or [])
        n_train = args_.actor.num_nodes * args_.actor.num_gpus_per_node
        first_train = 0 if args_.train.colocate_all else n_engines
        hooks.set_static_devices(rollout=range(n_engines), train=range(first_train, first_train + n_train))
        if hooks.client is not None and args_.train.async_enable:
            # Async mode: the generator holds OpenRLHF's VLLMLock while it waits for its rollout
            # lease, and the trainer holds its train lease while it waits for that lock in
            # broadcast_to_vllm (ppo_trainer_async.py:255-265): both leases must fit at once.
            active = min(n_engines, int(settings.get("active_engines") or n_engines))
            pool = hooks.client.info()["devices"]
            if pool < active + n_train:
                raise ValueError(f"--train.async_enable with --jigsaw.coordinator {settings['coordinator']!r}: the "
                                 f"shared pool has {pool} device(s), async mode needs {active} (rollout) + {n_train} "
                                 f"(train) = {active + n_train} at once")
        self._jigsaw_n_train = n_train
        self._jigsaw_train_devices: tuple = ()
        self._jigsaw_sizes = (0, 0)
        self._jigsaw_weight_bytes = _weight_bytes(pretrain)
        if hasattr(self, "samples_generator"):  # sync trainer: it generates too
            _replace_generator(self, hooks, clock, settings)
        self.experience_maker = HookedExperienceMaker(
            self.actor_model_group, self.critic_model_group, self.reward_model_group, self.reference_model_group,
            self.kl_ctl, self.strategy, self.tokenizer, hooks=hooks, clock=clock,
            devices_for=lambda _stage: self._jigsaw_train_devices)
        from importlib.metadata import version

        host = None
        if hooks.planned:  # the coordinator runs a policy: declare what it plans with (host.py)
            from jigsaw_plugin.adapters.openrlhf.host import moves_requests, openrlhf_host_pipeline

            # the loader yields one prompt at a time (ppo_trainer.py:42-49); a step takes
            # rollout.batch_size of them (the last, shorter batch is a step too)
            loader = getattr(self, "prompts_dataloader", None)
            per_step = max(1, int(args_.rollout.batch_size))
            steps = -(-len(loader) // per_step) * int(args_.train.num_episodes) if loader is not None else 0
            host = openrlhf_host_pipeline(hooks.pipeline, args_, n_engines=n_engines, n_train=n_train,
                                          active_engines=settings.get("active_engines"), steps=steps,
                                          request_migration=moves_requests(settings.get("policy"), n_engines))
        hooks.register_pipeline({
            "framework": "openrlhf", "framework_version": version("openrlhf"), "model": pretrain,
            "algorithm": args_.algo.advantage.estimator, "mode": "async" if args_.train.async_enable else "sync",
            "prompts_per_step": args_.rollout.batch_size, "samples_per_prompt": args_.rollout.n_samples_per_prompt,
            "max_response_len": args_.rollout.max_new_tokens, "rollout_engines": n_engines,
            "train_devices": n_train, "policy": settings.get("policy"),
            # the async queue bounds the lag; --jigsaw.staleness set it (config.resolve_staleness)
            "staleness": int(args_.train.async_queue_size) if args_.train.async_enable else 0,
        }, host)

    def fit(self, *args, **kwargs):
        hooks = self.jigsaw
        hooks.emit.jigsaw_pipeline_start(pipeline=hooks.pipeline, t=hooks.now())
        try:
            return super().fit(*args, **kwargs)
        finally:
            hooks.emit.jigsaw_pipeline_end(pipeline=hooks.pipeline, t=hooks.now())
            hooks.close()

    def train_step(self, rollout_samples, global_step):
        clock = self.jigsaw_clock
        clock.begin()
        # sizes of the update stages: the step's samples and their tokens (prompt + response)
        self._jigsaw_sizes = (len(rollout_samples),
                              int(sum(int(s.attention_mask.sum()) for s in rollout_samples)))
        step = clock.step
        # one grant for the whole training phase (a policy's ``phase`` grant: host.py)
        self._jigsaw_train_devices = self.jigsaw.acquire("train", self._jigsaw_n_train, step=step, stage="train")
        try:
            status, next_step = super().train_step(rollout_samples, global_step)
        finally:
            self.jigsaw.release(self._jigsaw_train_devices, step=step, stage="train")
        gen = getattr(self, "samples_generator", None)
        if isinstance(gen, JigsawSamplesGenerator):
            status["jigsaw/migrations"] = gen.stats["migrations"]
            status["jigsaw/requests"] = gen.stats["requests"]
        clock.end()
        return status, next_step

    def ppo_train(self, global_steps):
        args = self.args
        names = []
        if self.critic_model_group is not None:
            names.append("update_critic")
        if global_steps > args.critic.freezing_steps and self.actor_model_group is not None:
            names.append("update_actor")
        hooks, step, devices = self.jigsaw, self.jigsaw_clock.step, self._jigsaw_train_devices
        samples, tokens = self._jigsaw_sizes
        for name in names:  # OpenRLHF runs both fits at once and gathers them together
            hooks.emit.jigsaw_stage_start(pipeline=hooks.pipeline, step=step, stage=name, devices=devices,
                                          samples=samples, tokens=tokens, t=hooks.now())
        status = super().ppo_train(global_steps)
        for name in names:
            hooks.emit.jigsaw_stage_end(pipeline=hooks.pipeline, step=step, stage=name, devices=devices,
                                        samples=samples, tokens=tokens, t=hooks.now())
        return status

    def broadcast_to_vllm(self):
        hooks, step = self.jigsaw, self.jigsaw_clock.step
        devices = self._jigsaw_train_devices
        hooks.emit.jigsaw_weight_sync_start(pipeline=hooks.pipeline, step=step, version=step + 1, devices=devices,
                                            bytes=self._jigsaw_weight_bytes, t=hooks.now())
        with stage(hooks, step, "weight_sync", devices, 0, 0):
            result = super().broadcast_to_vllm()
        hooks.emit.jigsaw_weight_sync_end(pipeline=hooks.pipeline, step=step, version=step + 1, devices=devices,
                                          t=hooks.now())
        return result

    def jigsaw_stats(self) -> dict:
        gen = getattr(self, "samples_generator", None)
        return {"steps": self.jigsaw_clock.step, **(gen.stats if isinstance(gen, JigsawSamplesGenerator) else {})}


class JigsawGeneratorMixin:
    """Mixed in front of the async mode's ``GenerateSamplesActor``: rollout control and the
    ``gen`` stage hooks (its step counter counts generated batches; the training actor
    fires the step hooks)."""

    jigsaw_settings: dict = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.jigsaw = RunHooks(dict(self.jigsaw_settings))
        self.jigsaw_clock = StepClock(self.jigsaw, emit_steps=False)
        n_engines = len(self.samples_generator.vllm_engines or [])
        self.jigsaw.set_static_devices(rollout=range(n_engines))
        _replace_generator(self, self.jigsaw, self.jigsaw_clock, self.jigsaw_settings)

    def jigsaw_stats(self) -> dict:
        return dict(self.samples_generator.stats)


class JigsawAsyncDriverMixin:
    """Mixed in front of ``PPOTrainerAsync``: it creates its two actors from module globals
    inside its own worker (``ppo_trainer_async.py:304,314``), so the globals are replaced
    there, before its ``__init__`` runs."""

    jigsaw_settings: dict = {}

    def __init__(self, *args, **kwargs):
        import openrlhf.trainer.ppo_trainer_async as m

        replace = {
            "GenerateSamplesActor": make_remote(JigsawGeneratorMixin, m.GenerateSamplesActor, self.jigsaw_settings),
            "TrainingActor": make_remote(JigsawTrainerMixin, m.TrainingActor, self.jigsaw_settings),
        }
        # The base class reached this worker by value (its module attribute is this class in
        # the driver), so its __init__ reads a copy of the module's globals: patch that too.
        for klass in type(self).__mro__:
            init = klass.__dict__.get("__init__")
            if init is not None and "GenerateSamplesActor" in getattr(init, "__globals__", {}):
                init.__globals__.update(replace)
        for name, value in replace.items():
            setattr(m, name, value)
        super().__init__(*args, **kwargs)

    def jigsaw_stats(self) -> dict:
        return {"generator": ray.get(self.generator_actor.jigsaw_stats.remote()),
                "trainer": ray.get(self.trainer_actor.jigsaw_stats.remote())}

