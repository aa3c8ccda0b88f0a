"""The hook emitter of one OpenRLHF run, living in the trainer actor.

Builds a plugin manager (entry-point plugins included), registers the plugins this run
asked for: a JSONL event log (``--jigsaw.events``) and, with ``--jigsaw.coordinator``, a
forwarder to the shared coordinator. Also owns the device leases of the run's pipeline:
from the coordinator's shared pool, or a static local assignment when the run is alone.
Times ``t`` are wall seconds since the driver started the run (one clock for all actors).
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

from jigsaw_plugin.events import EventRecorder

__all__ = ["RunHooks", "stage"]


class _JsonlLog(EventRecorder):
    """A plugin appending every observation hook call to a JSONL file as it happens (the
    file survives a run that dies; several actors of one run may append)."""

    def __init__(self, path):
        super().__init__(include_progress=True)
        self.path = path
        self.lock = threading.Lock()

    def _record(self, hook_name, arguments):
        super()._record(hook_name, arguments)
        while self.events:
            line = json.dumps(self.events.pop(0))
            with self.lock, open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")


class RunHooks:
    """Fires jigsaw hooks for one pipeline; see the module docstring.

    :param settings: ``JigsawConfig.to_dict()`` plus ``t0`` (the run's start, epoch seconds).
    """

    def __init__(self, settings: dict):
        from jigsaw_plugin.manager import Emitter, get_plugin_manager, register

        self.settings = dict(settings)
        self.pipeline = self.settings["pipeline"]
        self.t0 = float(self.settings.get("t0") or time.time())
        self.pm = get_plugin_manager()
        self.emit = Emitter(self.pm)
        self.client = None
        self._planned: bool | None = None
        if self.settings.get("events"):
            register(self.pm, _JsonlLog(self.settings["events"]), name="jigsaw-openrlhf-events")
        if self.settings.get("coordinator"):
            from jigsaw_plugin.runtime.coordinator import CoordinatorForwarder, connect_coordinator

            self.client = connect_coordinator(name=self.settings["coordinator"],
                                              namespace=self.settings["namespace"],
                                              on_coordinator_loss=self.settings.get("on_coordinator_loss", "stop"))
            # The coordinator records register_pipeline and the lease events itself: the
            # forwarder's default leaves them out, so they are not recorded twice. Under a
            # policy the requests' progress goes too: the rows the policy chooses moves from
            # (the rollout controller reports it at most once a second per request).
            register(self.pm, CoordinatorForwarder(self.client, include_progress=self.planned),
                     name="jigsaw-coordinator-forwarder")
        self._static: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.time() - self.t0

    # ---- pipeline ---------------------------------------------------------------------
    @property
    def planned(self) -> bool:
        """The shared coordinator runs a policy (not ``fifo-lease``): it plans this run's
        stages from its ``HostPipeline`` and grants them (``host.py``)."""
        if self.client is None:
            return False
        if self._planned is None:
            from jigsaw_plugin.runtime.lease_schedulers import FIFO_LEASE

            self._planned = self.client.info().get("policy", FIFO_LEASE) != FIFO_LEASE
        return self._planned

    def register_pipeline(self, spec: dict, host=None) -> None:
        """Join the pipeline; ``host`` (a ``HostPipeline``) is what a coordinator policy plans with."""
        spec = {"name": self.pipeline, **spec}
        if self.client is not None:
            self.client.register_pipeline(self.pipeline, spec, host)
        self.emit.jigsaw_register_pipeline(pipeline=self.pipeline, spec=spec)

    def set_static_devices(self, **by_purpose: tuple[int, ...]) -> None:
        """Device ids used when no coordinator is shared (purpose -> ids)."""
        self._static.update({k: tuple(v) for k, v in by_purpose.items()})

    # ---- leases -----------------------------------------------------------------------
    def acquire(self, purpose: str, n_devices: int, step: int | None = None,
                stage: str | None = None) -> tuple[int, ...]:
        """Devices for ``purpose``: a lease from the shared pool (blocks until granted), or
        the run's static devices (the lease hooks fire either way). ``step``/``stage``
        (``gen`` or ``train``) name what a coordinator policy grants."""
        devices = self._static.get(purpose, tuple(range(int(n_devices))))[: int(n_devices)]
        if self.client is not None:
            timeout = self.settings.get("lease_timeout_s")
            # ``default``: the run's own devices, what a lost coordinator in fallback mode answers
            return tuple(self.client.acquire(self.pipeline, purpose, int(n_devices), timeout_s=timeout,
                                             default=devices, step=step, stage=stage))
        self.emit.jigsaw_lease_granted(pipeline=self.pipeline, devices=devices, purpose=purpose, t=self.now())
        return devices

    def rollout_servers(self, devices) -> tuple[int, ...]:
        """The engine (its index in OpenRLHF's list, its server id) to run on each device of
        a rollout grant, in the grant's order: the servers the coordinator bound to those
        devices when it can say (``CoordinatorClient.rollout_servers``), else the first
        ``len(devices)`` engines in order (the coordinator then binds servers in that order)."""
        devices = tuple(devices)
        ask = getattr(self.client, "rollout_servers", None) if self.planned else None
        if ask is not None:
            bound = ask(self.pipeline)
            if bound and all(d in bound for d in devices):
                return tuple(int(bound[d]) for d in devices)
        return tuple(range(len(devices)))

    def take_migrations(self, wait_s: float = 0.0) -> list:
        """The migration commands the coordinator's policy chose for this run's requests
        (``HostMigration``; empty without a coordinator policy)."""
        return self.client.take_migrations(self.pipeline, wait_s) if self.planned else []

    def migration_outcome(self, outcome) -> None:
        """Report what became of a command (``MigrationOutcome``)."""
        if self.planned:
            self.client.migration_outcome(outcome)

    def release(self, devices, step: int | None = None, stage: str | None = None,
                tokens: int | None = None) -> None:
        """Give devices back: a whole lease, or (a rollout under a policy) some of its
        engines' devices before the rollout's end, which the coordinator can grant at once."""
        devices = tuple(devices)
        if not devices:
            return
        if self.client is not None:
            self.client.release(self.pipeline, devices, step=step, stage=stage, tokens=tokens)
            return
        self.emit.jigsaw_lease_released(pipeline=self.pipeline, devices=devices, t=self.now())

    def close(self) -> None:
        """End of the run: deliver pending events; leave the shared pool (frees any lease)."""
        if self.client is not None:
            self.client.flush()
            self.client.unregister_pipeline(self.pipeline)


@contextmanager
def stage(hooks: RunHooks, step: int, name: str, devices=(), samples: int = 0, tokens: int = 0):
    """``jigsaw_stage_start`` now, ``jigsaw_stage_end`` when the block ends. The block may
    set ``sizes["tokens"]`` / ``sizes["samples"]`` to what it processed."""
    sizes = {"samples": int(samples), "tokens": int(tokens)}
    devices = tuple(devices)
    hooks.emit.jigsaw_stage_start(pipeline=hooks.pipeline, step=step, stage=name, devices=devices,
                                  samples=sizes["samples"], tokens=sizes["tokens"], t=hooks.now())
    yield sizes
    hooks.emit.jigsaw_stage_end(pipeline=hooks.pipeline, step=step, stage=name, devices=devices,
                                samples=int(sizes["samples"]), tokens=int(sizes["tokens"]), t=hooks.now())
