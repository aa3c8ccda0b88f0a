"""One verl trainer's jigsaw session: hook reporter, coordinator membership, device leases.

No verl import: the trainer subclasses (``trainer.py``, ``v0.py``) hand it plain values.
With ``+jigsaw.coordinator=NAME`` the session joins that coordinator (a named Ray actor,
created by the first trainer that asks, with ``+jigsaw.scheduler``'s policy), forwards every
hook event to it, declares what verl can do on the policy's say (``host_pipeline``:
``runtime.capabilities``), and asks a grant before each stage of a step: one for the
rollout (gen and reward), one per training stage (log-probs, updates, the weight sync),
each given back at the stage's end. The coordinator's policy decides every grant; trainers
in separate driver processes that name the same coordinator therefore share the pool as it
plans.
"""

from __future__ import annotations

import sys

from jigsaw_plugin.adapters.verl.options import JigsawOptions
from jigsaw_plugin.adapters.verl.reporter import StageReporter
from jigsaw_plugin.manager import register

__all__ = ["JigsawSession", "PHASE_OF_STAGE"]


#: Which lease a stage runs under.
PHASE_OF_STAGE = {
    "gen": "rollout", "reward": "rollout",
    "old_log_prob": "train", "ref": "train", "values": "train", "adv": "train",
    "update_critic": "train", "update_actor": "train", "weight_sync": "train",
}


#: Stages that run under the rollout's grant (verl computes rewards on the rollout's output).
ROLLOUT_STAGES = ("gen", "reward")


class JigsawSession:
    """Reporter + optional coordinator client for one pipeline.

    :param options: Validated ``+jigsaw.*`` options (``options.pipeline`` must be set).
    :param n_devices: Devices the trainer's worker groups span (verl's resource pool).
    :param pm: Plugin manager for the hooks (default: a fresh one).
    """

    def __init__(self, options: JigsawOptions, n_devices: int, pm=None):
        if not options.pipeline:
            raise ValueError("JigsawSession needs options.pipeline (set +jigsaw.pipeline=NAME)")
        self.options = options
        self.n_devices = max(1, int(n_devices))
        self.reporter = StageReporter(options.pipeline, pm)
        self.client = None
        self._lease: tuple[str, int, str, tuple[int, ...]] | None = None  # (phase, step, stage, devices)
        self.rollout_tokens: int | None = None  # what the step's rollout generated (on_sample_end)
        self._registered = False
        if options.coordinator and options.policy == "jigsaw":
            self._connect()

    @property
    def pipeline(self) -> str:
        return self.options.pipeline

    @property
    def started(self) -> bool:
        """The pipeline is registered (``start`` ran)."""
        return self._registered

    def _connect(self) -> None:
        import ray

        from jigsaw_plugin.runtime.coordinator import CoordinatorForwarder, connect_coordinator

        if not ray.is_initialized():
            ray.init(address=self.options.address or "auto", namespace=self.options.namespace)
        # used only if this trainer creates the coordinator: its policy, the look-ahead horizon
        scheduler = self.options.scheduler
        policy_options = {"horizon_s": self.options.lookahead_s} if scheduler == "jigsaw" else None
        self.client = connect_coordinator(name=self.options.coordinator, namespace=self.options.namespace,
                                          devices=self.options.pool_devices or self.n_devices,
                                          on_coordinator_loss=self.options.on_coordinator_loss,
                                          policy=scheduler, policy_options=policy_options)
        # its default leaves out what the coordinator records itself (register_pipeline,
        # the lease events), so they are not recorded twice
        register(self.reporter.pm, CoordinatorForwarder(self.client))

    def host_pipeline(self, spec: dict):
        """What a policy scheduler plans with: this pipeline's settings and what verl can do
        on its say (``runtime.capabilities``). verl's FSDP gangs are placed when its worker
        groups are built: training width fixed (the policy time-shares it); its rollout
        servers are a fixed set. Migration of chosen requests (``migration_binding``): only
        with two or more servers behind the jigsaw balancer taking this coordinator's
        commands for this pipeline (``spec["rollout_binding"]``, the balancer's ``binding()``)."""
        from jigsaw_plugin.errors import SpecError
        from jigsaw_plugin.runtime.capabilities import HostCapabilities
        from jigsaw_plugin.runtime.host_executor import HostPipeline

        needed = ("algorithm", "prompts_per_step", "samples_per_prompt", "max_response_len", "max_prompt_len", "steps")
        missing = [k for k in needed if k not in spec]
        if missing:
            raise SpecError(f"{self.pipeline}: pipeline spec.{missing[0]}", "<missing>",
                            "declared by the trainer (verl's v0 trainer does not: give its coordinator "
                            "+jigsaw.scheduler=fifo-lease)")
        servers = self.migration_servers(spec.get("rollout_binding"))
        caps = HostCapabilities("verl", stage_grants="stage",
                                rollout_replicas=max(1, self.n_devices // max(1, int(spec.get("rollout_tp", 1)))),
                                replicas_elastic=False, migration=bool(servers), training_resizable=False,
                                training_width=self.n_devices)
        return HostPipeline(self.pipeline, model_profile_of(self.options, spec.get("model")),
                            str(spec["algorithm"]), int(spec["prompts_per_step"]), int(spec["samples_per_prompt"]),
                            int(spec["max_response_len"]), int(spec["max_prompt_len"]), int(spec["steps"]),
                            self.n_devices, caps, staleness=int(spec.get("staleness") or 0), servers=servers,
                            train_offload=str(spec.get("train_offload") or "none"))

    def migration_servers(self, binding) -> tuple:
        """The rollout servers the coordinator may move this job's requests between (``()``:
        it declares ``migration=false``): two or more, behind a jigsaw balancer that takes
        this coordinator's commands for this pipeline (``JigsawLoadBalancer.binding()``)."""
        if not binding or binding.get("coordinator") != self.options.coordinator \
                or binding.get("pipeline") != self.pipeline:
            return ()
        servers = tuple(str(x) for x in binding.get("servers") or ())
        return servers if len(servers) >= 2 else ()

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, spec: dict) -> None:
        """Register the pipeline (locally and with the coordinator) and start it; once."""
        if self._registered:
            return
        self._registered = True
        spec = {"framework": "verl", "devices": self.n_devices, "policy": self.options.policy,
                "lookahead_s": self.options.lookahead_s, **spec}
        if self.client is not None:
            from jigsaw_plugin.runtime.lease_schedulers import FIFO_LEASE

            # a policy scheduler plans with the declared settings; the lease queue needs none
            planned = self.client.info().get("policy", FIFO_LEASE) != FIFO_LEASE
            self.client.register_pipeline(self.pipeline, spec, self.host_pipeline(spec) if planned else None)
        self.reporter.register_pipeline(spec)
        self.reporter.pipeline_start()

    def finish(self) -> None:
        """End the pipeline: release any lease, write events, leave the coordinator."""
        if not self._registered:
            return
        self._registered = False
        self.release()
        self.reporter.pipeline_end()
        if self.options.events_path:
            self.reporter.recorder.to_jsonl(self.options.events_path)
        if self.client is not None:
            try:
                self.client.flush()
                self.client.unregister_pipeline(self.pipeline)
            except Exception as e:  # the run is over; say so, do not mask its result
                print(f"jigsaw-plugin: leaving coordinator {self.options.coordinator!r}: {e!r}", file=sys.stderr)

    # ---- grants ---------------------------------------------------------------------------
    def devices_for(self, stage: str, default: tuple[int, ...]) -> tuple[int, ...]:
        """The device ids a stage runs on: granted by the coordinator (blocks until then),
        else ``default`` (no coordinator; or it was lost and ``on_coordinator_loss=fallback``:
        the host's own devices). The rollout's grant covers gen and reward; each training
        stage has its own, ended by ``stage_done``."""
        if self.client is None:
            return tuple(default)
        step = self.reporter.step
        phase = PHASE_OF_STAGE.get(stage, "train")
        if stage in ROLLOUT_STAGES:
            if self._lease is not None and self._lease[0] == "rollout" and self._lease[1] == step:
                return self._lease[3]
            if stage != "gen":  # a reward outside a step's rollout (validation): driver-side
                return tuple(default)
        self.release()  # never hold one stage's devices while waiting for the next's
        devices = self.client.acquire(self.pipeline, phase, self.n_devices, default=tuple(default),
                                      step=step, stage=stage)
        self._lease = (phase, step, stage, tuple(devices))
        self.reporter.emit("jigsaw_lease_granted", pipeline=self.pipeline, devices=tuple(devices),
                           purpose=phase, t=self.reporter.now())
        return self._lease[3]

    def stage_done(self, stage: str) -> None:
        """A training stage ended: its grant goes back (the rollout's ends at the first
        training stage, which is when verl has rewarded its samples)."""
        if self._lease is not None and self._lease[2] == stage and stage not in ROLLOUT_STAGES:
            self.release()

    def release(self) -> None:
        if self._lease is None or self.client is None:
            self._lease = None
            return
        phase, step, stage, devices = self._lease
        self._lease = None
        tokens = self.rollout_tokens if phase == "rollout" else None
        self.client.release(self.pipeline, devices, step=step, stage=stage, tokens=tokens)
        self.reporter.emit("jigsaw_lease_released", pipeline=self.pipeline, devices=devices,
                           t=self.reporter.now())


def model_profile_of(options: JigsawOptions, model_path) -> str:
    """The cost-model profile of the trainer's model: ``+jigsaw.model_profile``, else the
    known profile whose name the model path's last part starts with (``Qwen2.5-0.5B-Instruct``
    -> ``qwen2.5-0.5b``)."""
    from jigsaw_plugin.errors import SpecError
    from jigsaw_plugin.workload.spec import KNOWN_MODELS

    if options.model_profile:
        return options.model_profile
    base = str(model_path or "").rstrip("/").rsplit("/", 1)[-1].lower()
    matches = [m for m in KNOWN_MODELS if base.startswith(m)]
    if not matches:
        raise SpecError("+jigsaw.model_profile", None,
                        f"one of {', '.join(KNOWN_MODELS)} (the model {model_path!r} matches none; the coordinator's "
                        f"policy prices its stages with this profile)")
    return max(matches, key=len)
