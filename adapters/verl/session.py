"""One verl trainer's jigsaw session: hook reporter, coordinator membership, device leases.

No verl import: the trainer subclasses (``trainer.py``, ``v0.py``) hand it plain values.
With ``+jigsaw.coordinator=NAME`` the session joins that coordinator (a named Ray actor,
created by the first trainer that asks), forwards every hook event to it, and takes a lease
from its shared device pool for each phase of a step (``rollout``: gen and reward;
``train``: log-probs, advantages, updates and the weight sync). Trainers in separate driver
processes that name the same coordinator therefore take turns on the pool.
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
        self._lease: tuple[str, tuple[int, ...]] | None = None
        self._registered = False
        if options.coordinator and options.policy == "jigsaw":
            self._connect()

    @property
    def pipeline(self) -> str:
        return self.options.pipeline

    def _connect(self) -> None:
        import ray

        from jigsaw_plugin.runtime.coordinator import CoordinatorForwarder, connect_coordinator

        if not ray.is_initialized():
            ray.init(address=self.options.address or "auto", namespace=self.options.namespace)
        self.client = connect_coordinator(name=self.options.coordinator, namespace=self.options.namespace,
                                          devices=self.n_devices, on_coordinator_loss=self.options.on_coordinator_loss)
        # its default leaves out what the coordinator records itself (register_pipeline,
        # the lease events), so they are not recorded twice
        register(self.reporter.pm, CoordinatorForwarder(self.client))

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, spec: dict) -> None:
        """Register the pipeline (locally and with the coordinator) and start it; once."""
        if self._registered:
            return
        self._registered = True
        spec = {"framework": "verl", "devices": self.n_devices, "policy": self.options.policy,
                "lookahead_s": self.options.lookahead_s, **spec}
        if self.client is not None:
            self.client.register_pipeline(self.pipeline, spec)
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

    # ---- leases ---------------------------------------------------------------------------
    def devices_for(self, stage: str, default: tuple[int, ...]) -> tuple[int, ...]:
        """The device ids a stage runs on: the phase's lease with a coordinator, else ``default``."""
        if self.client is None:
            return tuple(default)
        phase = PHASE_OF_STAGE.get(stage, "train")
        if self._lease is not None and self._lease[0] == phase:
            return self._lease[1]
        self.release()  # never hold one phase's devices while waiting for the next's
        devices = self.client.acquire(self.pipeline, phase, self.n_devices)
        self._lease = (phase, tuple(devices))
        self.reporter.emit("jigsaw_lease_granted", pipeline=self.pipeline, devices=tuple(devices),
                           purpose=phase, t=self.reporter.now())
        return self._lease[1]

    def release(self) -> None:
        if self._lease is None or self.client is None:
            self._lease = None
            return
        _, devices = self._lease
        self._lease = None
        self.client.release(self.pipeline, devices)
        self.reporter.emit("jigsaw_lease_released", pipeline=self.pipeline, devices=devices,
                           t=self.reporter.now())
