"""The jigsaw trainers of verl's v1 registry: ``trainer.v1.trainer_mode=jigsaw``.

``install(verl.trainer.ppo.v1)`` runs when verl imports its trainer package and registers,
through verl's own ``register_trainer`` (``trainer/ppo/v1/trainer_base.py:1999``):

- ``jigsaw``: a ``PPOTrainerSync`` subclass (on-policy, colocated);
- ``jigsaw_colocate_async``: a ``PPOTrainerColocateAsync`` subclass (partial rollout).

Both run verl's own ``fit``/``step``/``_step_once`` unchanged. The subclass only overrides
the methods that ``_step_once`` (``trainer_base.py:562-612``) calls at its stage boundaries,
and the lifecycle callbacks, to fire the jigsaw hooks around verl's own code:

=================  ==============================================================
jigsaw stage       verl boundary (0.9.1)
=================  ==============================================================
gen                ``on_sample_begin`` .. ``on_sample_end`` (timer ``gen``, 565)
reward             ``_compute_reward_colocate`` (timer ``reward``, 578)
old_log_prob       ``_compute_old_log_prob`` (585)
ref                ``_compute_ref_log_prob`` (590)
values             ``_compute_values`` (595)
adv                ``_compute_advantage`` (599)
update_critic      ``_update_critic`` (604)
update_actor       ``_update_actor`` (609)
weight_sync        ``on_step_end`` -> ``checkpoint_manager.update_weights`` (trainer_sync.py:36)
=================  ==============================================================

verl chooses its replay buffer and TransferQueue behaviour by comparing ``trainer_mode``
with ``"sync"``; the subclasses answer the mode they extend (``sync`` / ``colocate_async``)
through a property, so verl's own logic runs exactly as in that mode.
"""

from __future__ import annotations

from jigsaw_plugin.adapters.verl.options import (TRAINER_MODES, algorithm_of, parse_options, resolve_staleness,
                                                  train_offload_of)
from jigsaw_plugin.adapters.verl.reporter import batch_sizes
from jigsaw_plugin.adapters.verl.session import JigsawSession

__all__ = ["JigsawTrainerMixin", "install", "TRAINER_MODES"]


def _world(wg) -> int:
    try:
        return int(wg.world_size)
    except Exception:
        return 0


class JigsawTrainerMixin:
    """Fires the jigsaw hooks at verl's stage boundaries; put before the verl trainer class."""

    _jigsaw_trainer = True
    _jigsaw_base_mode = "sync"

    # verl's PPOTrainer.__init__ assigns self.trainer_mode = config.trainer.v1.trainer_mode
    # ("jigsaw"); every later check compares it with "sync", so answer the extended mode.
    @property
    def trainer_mode(self) -> str:
        return self._jigsaw_base_mode

    @trainer_mode.setter
    def trainer_mode(self, value) -> None:
        self._jigsaw_requested_mode = value

    def __init__(self, config, *args, **kwargs):
        from jigsaw_plugin.adapters.verl import plugin
        from jigsaw_plugin.adapters.verl.version import check_version

        mode = str(config.trainer.v1.trainer_mode)
        check_version(plugin.verl_version(), what=f"trainer.v1.trainer_mode={mode}")
        plugin.raise_if_broken(what=f"trainer.v1.trainer_mode={mode}")
        section = config.get("jigsaw", None)
        if section is not None and not hasattr(section, "items"):
            from jigsaw_plugin.errors import SpecError

            raise SpecError("+jigsaw", section, "a group of options: +jigsaw.policy=..., +jigsaw.pipeline=...")
        raw = dict(section.items()) if section is not None else {}
        self.jigsaw_options = parse_options(raw, default_pipeline=str(config.trainer.experiment_name))
        # before verl builds its replay buffer: an async trainer's bound is verl's sampler threshold
        self.jigsaw_staleness = resolve_staleness(self.jigsaw_options, self._jigsaw_base_mode,
                                                  config.trainer.v1.get("sampler", None))
        super().__init__(config, *args, **kwargs)
        trainer = config.trainer
        n_devices = int(trainer.get("n_gpus_per_node", 1)) * int(trainer.get("nnodes", 1))
        self.jigsaw = JigsawSession(self.jigsaw_options, n_devices)
        self._jigsaw_batch = None
        import sys

        print(f"jigsaw-plugin (verl): trainer_mode={mode} -> {type(self).__name__} (verl "
              f"{plugin.verl_version()}), pipeline {self.jigsaw_options.pipeline!r}, policy "
              f"{self.jigsaw_options.policy!r}", file=sys.stderr, flush=True)
        self._jigsaw_wrap_replay_buffer()

    def _jigsaw_wrap_replay_buffer(self) -> None:
        """Keep the batch ``ReplayBuffer.sample`` returns: the gen stage's sizes."""
        buffer = self.replay_buffer
        sample = buffer.sample

        def jigsaw_sample(*args, **kwargs):
            out = sample(*args, **kwargs)
            self._jigsaw_batch = out[0] if isinstance(out, tuple) else out
            return out

        buffer.sample = jigsaw_sample

    # ---- devices --------------------------------------------------------------------------
    def _jigsaw_devices(self, stage: str) -> tuple[int, ...]:
        if stage == "adv":
            default = ()
        elif stage in ("values", "update_critic"):
            default = tuple(range(_world(getattr(self, "critic_wg", None))))
        elif stage == "ref":
            default = tuple(range(_world(getattr(self, "ref_policy_wg", None))))
        else:
            default = tuple(range(_world(getattr(self, "actor_rollout_wg", None))))
        return self.jigsaw.devices_for(stage, default)

    def _jigsaw_stage(self, stage: str, method, batch, *args, **kwargs):
        rep = self.jigsaw.reporter
        samples, tokens = batch_sizes(batch)
        devices = self._jigsaw_devices(stage) if stage != "adv" else ()
        rep.stage_start(stage, devices, samples, tokens)
        try:
            return method(batch, *args, **kwargs)
        finally:
            rep.stage_end(stage, samples, tokens)
            self.jigsaw.stage_done(stage)

    # ---- lifecycle ------------------------------------------------------------------------
    def init(self):
        """verl's ``init`` (worker groups, rollout replicas), after checking that Ray has the
        devices verl's platform will ask for: a clear error instead of base.py:240's."""
        import ray
        from verl.plugin.platform import get_platform

        from jigsaw_plugin.adapters.verl.cpu_device import check_devices_exist

        if ray.is_initialized():
            trainer = self.config.trainer
            required = int(trainer.get("n_gpus_per_node", 1)) * int(trainer.get("nnodes", 1))
            check_devices_exist(get_platform().ray_resource_name(), ray.cluster_resources(), required)
        return super().init()

    def _jigsaw_spec(self) -> dict:
        cfg = self.config
        return {
            "algorithm": algorithm_of(cfg.algorithm.adv_estimator, self.use_critic, self.use_reference_policy),
            "adv_estimator": str(cfg.algorithm.adv_estimator),
            "mode": "sync" if self._jigsaw_base_mode == "sync" else "async",
            "staleness": self.jigsaw_staleness,
            "trainer_mode": self._jigsaw_requested_mode if hasattr(self, "_jigsaw_requested_mode") else None,
            "model": str(cfg.actor_rollout_ref.model.path),
            "prompts_per_step": int(cfg.data.train_batch_size),
            "samples_per_prompt": int(cfg.actor_rollout_ref.rollout.n),
            "rollout_tp": int(cfg.actor_rollout_ref.rollout.get("tensor_model_parallel_size", 1)),
            "train_offload": train_offload_of(cfg.actor_rollout_ref.get("actor") or {}),
            "steps": int(getattr(self, "total_training_steps", 0) or 0),
            # verl's data config always has them; a policy scheduler needs them (host_pipeline)
            **{ours: int(cfg.data[theirs]) for ours, theirs in (("max_response_len", "max_response_length"),
                                                               ("max_prompt_len", "max_prompt_length"))
               if theirs in cfg.data},
        }

    def on_train_begin(self):
        self.jigsaw.start(self._jigsaw_start_spec())
        return super().on_train_begin()

    def _jigsaw_start_spec(self) -> dict:
        """The spec registered once; with a jigsaw balancer, its servers and the coordinator
        it takes migrations from (what ``session.host_pipeline`` declares ``migration`` by)."""
        spec = self._jigsaw_spec()
        balancer = self._jigsaw_balancer()
        if balancer is not None and not self.jigsaw.started and self.jigsaw.client is not None:
            import ray

            spec["rollout_binding"] = ray.get(balancer.binding.remote(), timeout=60)
        return spec

    def on_train_end(self):
        out = super().on_train_end()
        self.jigsaw.finish()
        return out

    def on_step_begin(self):
        if not self.jigsaw.started:  # fit() may skip on_train_begin's caller paths
            self.jigsaw.start(self._jigsaw_start_spec())
        step = self.jigsaw.reporter.step_start()
        balancer = self._jigsaw_balancer()
        if balancer is not None:  # request events of this step carry its index and clock
            balancer.set_step.remote(step, self.jigsaw.reporter.t0_wall)
        return super().on_step_begin()

    def _jigsaw_balancer(self):
        """verl's global balancer actor if it is a ``JigsawLoadBalancer``, else ``None``."""
        manager = getattr(self, "llm_server_manager", None)
        handle = getattr(manager, "global_load_balancer", None)
        if handle is None or not hasattr(handle, "set_step"):
            return None
        return handle

    def on_step_end(self):
        rep = self.jigsaw.reporter
        devices = self._jigsaw_devices("weight_sync")
        with rep.weight_sync(version=int(self.global_steps), devices=devices):
            out = super().on_step_end()
        self.jigsaw.stage_done("weight_sync")
        rep.step_end()
        # fit() returns after the last step without calling on_train_end (trainer_base.py:524-529)
        total = getattr(self, "total_training_steps", None)
        if total is not None and self.global_steps >= total:
            self.jigsaw.finish()
        return out

    def on_sample_begin(self):
        cfg = self.config
        expected = int(cfg.data.train_batch_size) * int(cfg.actor_rollout_ref.rollout.n)
        self._jigsaw_batch = None
        self.jigsaw.reporter.stage_start("gen", self._jigsaw_devices("gen"), expected, 0)
        return super().on_sample_begin()

    def on_sample_end(self):
        try:
            return super().on_sample_end()
        finally:
            samples, tokens = batch_sizes(self._jigsaw_batch, "response_len")
            self.jigsaw.rollout_tokens = tokens
            self.jigsaw.reporter.stage_end("gen", samples, tokens)

    # ---- stages of _step_once -------------------------------------------------------------
    def _compute_reward_colocate(self, batch, *args, **kwargs):
        return self._jigsaw_stage("reward", super()._compute_reward_colocate, batch, *args, **kwargs)

    def _compute_old_log_prob(self, batch, *args, **kwargs):
        return self._jigsaw_stage("old_log_prob", super()._compute_old_log_prob, batch, *args, **kwargs)

    def _compute_ref_log_prob(self, batch, *args, **kwargs):
        return self._jigsaw_stage("ref", super()._compute_ref_log_prob, batch, *args, **kwargs)

    def _compute_values(self, batch, *args, **kwargs):
        return self._jigsaw_stage("values", super()._compute_values, batch, *args, **kwargs)

    def _compute_advantage(self, batch, *args, **kwargs):
        return self._jigsaw_stage("adv", super()._compute_advantage, batch, *args, **kwargs)

    def _update_critic(self, batch, *args, **kwargs):
        return self._jigsaw_stage("update_critic", super()._update_critic, batch, *args, **kwargs)

    def _update_actor(self, batch, *args, **kwargs):
        return self._jigsaw_stage("update_actor", super()._update_actor, batch, *args, **kwargs)

    # ---- rollout --------------------------------------------------------------------------
    def get_llm_client(self):
        """verl's client with stable vLLM request ids (so one request can be aborted/moved)."""
        from jigsaw_plugin.adapters.verl.client import JigsawLLMServerClient

        return self.llm_server_manager.get_client(client_cls=JigsawLLMServerClient)


def install(v1) -> dict:
    """Define the jigsaw trainers on verl's classes and register them; returns name -> class."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer

    bases = {"jigsaw": v1.PPOTrainerSync, "jigsaw_colocate_async": v1.PPOTrainerColocateAsync}
    made = {}
    for name, base in bases.items():
        if name in TRAINER_REGISTRY:
            made[name] = TRAINER_REGISTRY[name]
            continue
        cls_name = "JigsawTrainer" + base.__name__.removeprefix("PPOTrainer")
        cls = type(cls_name, (JigsawTrainerMixin, base), {
            "_jigsaw_base_mode": TRAINER_MODES[name],
            "__module__": __name__,
            "__doc__": f"``trainer.v1.trainer_mode={name}``: verl's {base.__name__} with the jigsaw hooks.",
        })
        made[name] = register_trainer(name)(cls)
        globals()[cls_name] = cls  # importable by name (pickling, repr)
    return made
