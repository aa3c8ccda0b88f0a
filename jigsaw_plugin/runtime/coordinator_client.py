"""The client side of the jigsaw coordinator: ``CoordinatorClient`` and ``connect_coordinator``.

A host driver (verl, OpenRLHF) or the reference runtime holds a ``CoordinatorClient``:
registration, hook events, device leases (stage grants under a policy scheduler), and the
heartbeats by which the coordinator tells a dead driver from a slow one
(``runtime/coordinator.py`` has the actor's side and the fault semantics).
"""

from __future__ import annotations

import sys
import threading
import time

from jigsaw_plugin.hookspecs import HOOK_NAMES
from jigsaw_plugin.runtime.host_executor import HostPipeline
from jigsaw_plugin.runtime.host_requests import HostMigration, MigrationOutcome
from jigsaw_plugin.runtime.lease_schedulers import FIFO_LEASE, CoordinatorConfig, LeaseError
from jigsaw_plugin.runtime.liveness import HeartbeatBook, LivenessSettings

__all__ = ["CoordinatorClient", "CoordinatorDied", "connect_coordinator"]


class CoordinatorDied(RuntimeError):
    """The coordinator actor is gone (killed, its node lost, or shut down)."""


class CoordinatorClient:
    """A handle on the coordinator; every call raises ``CoordinatorDied`` if it is gone.

    Each pipeline this client registers gets heartbeats from a daemon thread (one per
    client) until it is unregistered: that is how the coordinator tells a dead driver from
    a slow one. The same thread notices a lost coordinator (``liveness``); what follows is
    ``liveness.on_coordinator_loss`` (module docstring).
    """

    def __init__(self, handle, name: str, liveness: LivenessSettings | None = None):
        import uuid

        self.handle, self.name = handle, name
        self.liveness = liveness or LivenessSettings()
        self._unsent: list = []  # refs of emits not yet known to have run
        self._id, self._seq = uuid.uuid4().hex, 0  # emits are numbered: recorded in order
        self._registered: set[str] = set()
        self._lock = threading.Lock()
        self._beating: threading.Thread | None = None
        self._stop_beating = threading.Event()
        self.lost: str | None = None  # why the coordinator counts as lost, once it does
        self.evicted: set[str] = set()  # pipelines the coordinator reaped (a long silence)
        self._warned = False

    def __reduce__(self):
        # a copy in another process numbers its own emits and beats for what it registers
        return (CoordinatorClient, (self.handle, self.name, self.liveness))

    # ---- loss -------------------------------------------------------------------------
    @property
    def fallback(self) -> bool:
        """True once the coordinator is lost and the client was told to fall back."""
        return self.lost is not None and self.liveness.on_coordinator_loss == "fallback"

    def _mark_lost(self, why: str) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = why
        self._stop_beating.set()
        if self.liveness.on_coordinator_loss == "fallback":
            self._warn_fallback()
        else:
            print(f"jigsaw-plugin: ERROR: {why}; stopping (on_coordinator_loss=stop)", file=sys.stderr, flush=True)

    def _warn_fallback(self) -> None:
        if not self._warned:
            self._warned = True
            print(f"jigsaw-plugin: WARNING: {self.lost}; on_coordinator_loss=fallback: this driver goes on "
                  f"with the host's own scheduling on its own devices (no shared pool, no event log)",
                  file=sys.stderr, flush=True)

    def _died(self, detail: str) -> CoordinatorDied:
        return CoordinatorDied(f"the jigsaw coordinator {self.name!r} died: {detail}")

    def _check_lost(self) -> None:
        """Fail fast (stop mode) once the coordinator is lost; fallback callers check
        ``self.fallback`` first."""
        if self.lost is not None:
            raise CoordinatorDied(self.lost)

    # ---- heartbeats -------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        if self._beating is None or not self._beating.is_alive():
            self._stop_beating.clear()
            self._beating = threading.Thread(target=self._beat_loop, name=f"jigsaw-heartbeat-{self.name}",
                                             daemon=True)
            self._beating.start()

    def _beat_loop(self) -> None:
        import ray

        while not self._stop_beating.wait(self.liveness.heartbeat_s):
            with self._lock:
                pipelines = sorted(self._registered)
            if not pipelines or not ray.is_initialized():  # never let ray.get start a new Ray
                return
            try:
                unknown = ray.get(self.handle.heartbeat.remote(pipelines), timeout=self.liveness.loss_timeout_s)
            except ray.exceptions.GetTimeoutError:
                self._mark_lost(f"the jigsaw coordinator {self.name!r} did not answer a heartbeat within "
                                f"{self.liveness.loss_timeout_s:g} s (hung or unreachable)")
                return
            except ray.exceptions.RayActorError as e:
                self._mark_lost(str(self._died(str(e).splitlines()[0] if str(e) else type(e).__name__)))
                return
            except (Exception, SystemExit) as e:  # SystemExit: Ray shut down under this thread
                if not ray.is_initialized() or isinstance(e, SystemExit):
                    return
                self._mark_lost(f"the jigsaw coordinator {self.name!r} is unreachable: {e!r}")
                return
            if unknown:
                with self._lock:
                    self.evicted.update(unknown)
                    self._registered.difference_update(unknown)
                print(f"jigsaw-plugin: ERROR: the coordinator {self.name!r} no longer knows pipeline(s) "
                      f"{unknown} (no heartbeat reached it for its timeout); their leases are gone",
                      file=sys.stderr, flush=True)

    # ---- calls ------------------------------------------------------------------------
    def _get(self, ref, timeout=None):
        """``ray.get`` that waits in short slices, so a coordinator the heartbeat thread
        found lost (hung, not dead) ends the wait too."""
        import ray

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_s = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            try:
                return ray.get(ref, timeout=slice_s)
            except ray.exceptions.GetTimeoutError:
                if self.lost is not None:
                    raise CoordinatorDied(self.lost) from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            except ray.exceptions.RayActorError as e:
                err = self._died(str(e))
                self._mark_lost(str(err))
                raise err from None
            except ray.exceptions.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, (LeaseError, TimeoutError, ValueError, NotImplementedError)):
                    raise cause from None
                raise

    def _call(self, method: str, *args, fallback=None):
        """One coordinator call: ``fallback`` once lost in fallback mode, else the answer
        (``CoordinatorDied`` in stop mode)."""
        if self.fallback:
            return fallback
        self._check_lost()
        try:
            return self._get(getattr(self.handle, method).remote(*args))
        except CoordinatorDied:
            if self.fallback:
                return fallback
            raise

    def flush(self) -> None:
        """Wait until every event this client emitted is recorded (an async actor does not
        keep submission order, so ``events()`` flushes first)."""
        refs, self._unsent = self._unsent, []
        if refs and not self.fallback:
            try:
                self._get(refs)
            except CoordinatorDied:
                if not self.fallback:
                    raise

    def info(self) -> dict:
        self._check_lost()
        return self._get(self.handle.info.remote())

    def register_pipeline(self, pipeline: str, spec: dict | None = None, host: HostPipeline | None = None) -> None:
        """Join the pool; ``host`` (the frozen declaration of the pipeline's settings and
        capabilities) is what a policy scheduler plans with."""
        with self._lock:
            self._registered.add(pipeline)
            self.evicted.discard(pipeline)
        self._call("register_pipeline", pipeline, dict(spec or {}), self._id, host)
        self._start_heartbeat()

    def unregister_pipeline(self, pipeline: str) -> None:
        with self._lock:
            self._registered.discard(pipeline)
        self._call("unregister_pipeline", pipeline)

    def emit(self, hook_name: str, **kwargs) -> None:
        """Fire-and-forget; the hook name is checked here, where a typo can be reported."""
        if hook_name not in HOOK_NAMES:
            raise ValueError(f"unknown hook {hook_name!r}; valid hooks: {', '.join(HOOK_NAMES)}")
        if self.fallback:
            return
        self._check_lost()
        self._unsent.append(self.handle.emit.remote(hook_name, kwargs, self._id, self._seq))
        self._seq += 1
        if len(self._unsent) >= 256:  # keep the list short: drop the refs that have run
            import ray

            done, self._unsent = ray.wait(self._unsent, num_returns=len(self._unsent), timeout=0)
            try:
                self._get(done)  # surfaces a coordinator that died
            except CoordinatorDied:
                if not self.fallback:
                    raise

    def events(self) -> list[dict]:
        self.flush()
        self._check_lost()
        return self._get(self.handle.events.remote())

    def acquire(self, pipeline: str, purpose: str, n_devices: int, timeout_s: float | None = None,
                default: tuple | None = None, step: int | None = None, stage: str | None = None) -> tuple:
        """A lease of ``n_devices`` from the pool (blocks until granted or ``timeout_s``);
        ``step``/``stage`` name the stage it is for (a policy scheduler grants stages).
        After a coordinator loss in fallback mode: ``default`` (the host's own devices for
        this purpose), else devices ``0..n_devices-1``."""
        own = tuple(default) if default is not None else tuple(range(int(n_devices)))
        got = self._call("acquire", pipeline, purpose, int(n_devices), timeout_s, step, stage, fallback=own)
        return tuple(got)

    def release(self, pipeline: str, devices, step: int | None = None, stage: str | None = None,
                tokens: int | None = None) -> None:
        """The lease's end (with ``step``/``stage``: that stage ended; ``tokens`` it read)."""
        self._call("release", pipeline, tuple(devices), step, stage, tokens)

    def take_migrations(self, pipeline: str, wait_s: float = 1.0) -> list[HostMigration]:
        """The migration commands the coordinator's policy chose for ``pipeline``'s requests,
        oldest first, each handed out once; waits up to ``wait_s`` for one (a long poll:
        call it in a loop from one thread). Empty under ``fifo-lease`` and after a
        coordinator loss in fallback mode."""
        if self.fallback:  # no coordinator: nothing to take, but keep the caller's poll paced
            time.sleep(max(0.0, float(wait_s)))
            return []
        got = self._call("take_migrations", pipeline, float(wait_s), fallback=None)
        if got is None:  # lost during the call, in fallback mode
            time.sleep(max(0.0, float(wait_s)))
            return []
        return [HostMigration.from_dict(c) for c in got]

    def rollout_servers(self, pipeline: str) -> dict[int, str]:
        """{device: server id} the coordinator's policy bound for ``pipeline``'s open rollout
        (read right after the rollout's grant); empty under ``fifo-lease`` or once lost."""
        got = self._call("rollout_servers", pipeline, fallback={})
        return {int(d): str(s) for d, s in (got or {}).items()}

    def migration_outcome(self, outcome: MigrationOutcome) -> None:
        """Report a command the host did not carry out (``status="dropped"``) or whose abort
        it sent (``"aborted"``; the request events follow)."""
        if not isinstance(outcome, MigrationOutcome):
            raise TypeError(f"migration_outcome takes a MigrationOutcome, got {type(outcome).__name__}")
        self._call("migration_outcome", outcome.to_dict())

    def scheduler_report(self) -> dict:
        """The coordinator's scheduler: its policy, refusals, adapted decisions, trace."""
        self._check_lost()
        return self._get(self.handle.scheduler_report.remote())

    def run_workload(self, workload: dict, policy: str, policy_options: dict | None = None, **options) -> dict:
        self._check_lost()
        return self._get(self.handle.run_workload.remote(workload, policy, policy_options, options))

    def shutdown_pool(self) -> None:
        self._check_lost()
        self._get(self.handle.shutdown_pool.remote())

    def close(self) -> None:
        """Stop this client's heartbeats (the pipelines stay registered until reaped)."""
        self._stop_beating.set()

    def shutdown(self) -> None:
        import ray

        self.close()
        ray.kill(self.handle)


def connect_coordinator(name: str = "jigsaw", namespace: str = "jigsaw", devices: int | None = None,
                        detached: bool = False, num_cpus: float = 0, *, heartbeat_s: float = 1.0,
                        loss_timeout_s: float = 10.0, on_coordinator_loss: str = "stop",
                        heartbeat_timeout_s: float = 10.0, max_events_in_memory: int = 100_000,
                        event_spill_path: str | None = None, policy: str = FIFO_LEASE,
                        policy_options: dict | None = None, policy_modules: tuple = ()) -> CoordinatorClient:
    """Get the named coordinator, creating it (with ``devices`` in its pool) if absent.

    ``ray.init`` must have been called (a local cluster, or ``address=...`` of a real one).
    ``devices`` defaults to the cluster's ``jigsaw_device`` resources, else its GPUs, else 1.
    Client side: ``heartbeat_s``, ``loss_timeout_s``, ``on_coordinator_loss``
    (:class:`~jigsaw_plugin.runtime.liveness.LivenessSettings`). Coordinator side, used only
    when this call creates it (:class:`~jigsaw_plugin.runtime.lease_schedulers.CoordinatorConfig`):
    ``policy`` (``fifo-lease``, or a registered policy that decides every grant) and its
    ``policy_options`` (``policy_modules``: modules to import first, for a policy registered
    outside jigsaw-plugin), ``heartbeat_timeout_s`` (a pipeline silent this long is released),
    ``max_events_in_memory`` and ``event_spill_path`` (``SpillingEventLog``).
    """
    import ray

    from jigsaw_plugin.runtime.coordinator import coordinator_actor_class

    liveness = LivenessSettings(heartbeat_s, loss_timeout_s, on_coordinator_loss)  # checks before Ray
    HeartbeatBook(heartbeat_timeout_s)
    if not ray.is_initialized():
        raise RuntimeError("connect_coordinator needs Ray: call ray.init(...) first "
                           "(address='auto' joins a running cluster)")
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        if devices is None:
            res = ray.cluster_resources()
            devices = int(res.get("jigsaw_device", 0) or res.get("GPU", 0) or 1)
        config = CoordinatorConfig(int(devices), policy, tuple(sorted((policy_options or {}).items())),
                                   heartbeat_timeout_s, max_events_in_memory, event_spill_path,
                                   tuple(policy_modules))
        opts = dict(name=name, namespace=namespace, get_if_exists=True, num_cpus=num_cpus, max_concurrency=1000)
        if detached:
            opts["lifetime"] = "detached"
        handle = coordinator_actor_class().options(**opts).remote(config)
    client = CoordinatorClient(handle, name, liveness)
    client.info()  # fail here, naming the coordinator, if it cannot start
    return client
