"""The jigsaw coordinator: one Ray actor per shared device pool.

Host trainers (verl, OpenRLHF: separate driver processes, possibly on other nodes) and the
reference runtime talk to it through :class:`CoordinatorClient`:

- ``register_pipeline`` / ``unregister_pipeline``: who shares the pool;
- ``emit``: hook events (fire-and-forget), recorded in one ``EventRecorder`` so the
  sub-stage graph of every pipeline in the pool is built from one event log
  (``client.events()`` -> ``graph.build_from_events``);
- ``acquire`` / ``release``: device leases. A lease is granted when enough devices are
  free; waiters are served in order of arrival (a big request is not starved by later
  small ones), with rollout (``purpose="gen"``/``"rollout"``) first among the waiting,
  since generation is what a synchronous step waits on longest;
- ``run_workload``: the reference runtime's path, where the coordinator itself runs a
  scheduling policy from the registry on live engines (``runtime.live.LiveExecutor``). The
  engines it starts are its child actors, so they die with it (no orphans).

The actor is named (``name`` in ``namespace``) so that any driver connected to the same
Ray cluster finds it: ``connect_coordinator`` gets it or creates it. ``detached=True``
keeps it alive after its creator exits (several drivers taking turns); ``client.shutdown()``
ends it. A coordinator that died surfaces as :class:`CoordinatorDied` naming it.

Faults (docs/runtime.md, "What happens when..."):

- a driver that dies stops sending heartbeats (``runtime/liveness.py``): the coordinator's
  reaper unregisters its pipelines, gives their devices back (``jigsaw_lease_released``
  with ``reason="driver_lost"``) and serves the waiting drivers;
- a coordinator that dies or stops answering is noticed by every client within
  ``heartbeat_s + loss_timeout_s``; then ``on_coordinator_loss="stop"`` (default) makes
  every later call raise ``CoordinatorDied``, ``"fallback"`` warns once and lets the host
  run on its own devices (``acquire`` answers with them, other calls do nothing);
- the event log keeps at most ``max_events_in_memory`` events in memory and spills older
  ones to a JSONL file (:class:`SpillingEventLog`), so a long run's memory stays flat.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.events import EventRecorder
from jigsaw_plugin.hookspecs import HOOK_NAMES
from jigsaw_plugin.runtime.liveness import HeartbeatBook, LivenessSettings

__all__ = [
    "CoordinatorClient",
    "CoordinatorDied",
    "CoordinatorForwarder",
    "DevicePool",
    "LeaseError",
    "SpillingEventLog",
    "connect_coordinator",
]

ROLLOUT_PURPOSES = ("gen", "rollout")


class CoordinatorDied(RuntimeError):
    """The coordinator actor is gone (killed, its node lost, or shut down)."""


class LeaseError(ValueError):
    """A lease request that can never be granted, or a release of devices not held."""


@dataclass
class _Waiter:
    pipeline: str
    purpose: str
    n: int
    seq: int
    granted: tuple | None = None
    event: asyncio.Event = field(default_factory=asyncio.Event)


class DevicePool:
    """Lease book-keeping of the shared pool (pure: no Ray, no clock)."""

    def __init__(self, devices: int):
        if int(devices) < 1:
            raise LeaseError(f"devices must be >= 1, got {devices!r}")
        self.devices = tuple(range(int(devices)))
        self.holder: dict[int, str] = {}  # device -> pipeline holding it
        self.waiting: deque[_Waiter] = deque()
        self._seq = 0

    def free(self) -> list[int]:
        return [d for d in self.devices if d not in self.holder]

    def request(self, pipeline: str, purpose: str, n: int) -> _Waiter:
        if not 1 <= int(n) <= len(self.devices):
            raise LeaseError(f"n_devices must be in 1..{len(self.devices)} (the pool's size), got {n!r}")
        self._seq += 1
        w = _Waiter(pipeline, purpose, int(n), self._seq)
        self.waiting.append(w)
        self.grant()
        return w

    def _order(self) -> list[_Waiter]:
        return sorted(self.waiting, key=lambda w: (w.purpose not in ROLLOUT_PURPOSES, w.seq))

    def grant(self) -> list[_Waiter]:
        """Grant what fits, in order; stop at the first that does not fit (no starvation)."""
        granted = []
        for w in self._order():
            free = self.free()
            if w.n > len(free):
                break
            w.granted = tuple(free[: w.n])
            for d in w.granted:
                self.holder[d] = w.pipeline
            self.waiting.remove(w)
            w.event.set()
            granted.append(w)
        return granted

    def cancel(self, w: _Waiter) -> None:
        if w in self.waiting:
            self.waiting.remove(w)

    def release(self, pipeline: str, devices) -> None:
        devices = tuple(int(d) for d in devices)
        bad = [d for d in devices if self.holder.get(d) != pipeline]
        if bad:
            raise LeaseError(f"pipeline {pipeline!r} does not hold device(s) {bad}; it holds "
                             f"{sorted(d for d, p in self.holder.items() if p == pipeline)}")
        for d in devices:
            del self.holder[d]
        self.grant()

    def release_all(self, pipeline: str) -> tuple[int, ...]:
        """Give back every device of ``pipeline`` and drop its waiting requests (their
        ``acquire`` never returns a grant); returns the devices it held."""
        held = tuple(sorted(d for d, p in self.holder.items() if p == pipeline))
        for w in [w for w in self.waiting if w.pipeline == pipeline]:
            self.waiting.remove(w)
            w.event.set()  # wakes its acquire, which finds no grant
        self.release(pipeline, held)
        return held


class SpillingEventLog(EventRecorder):
    """The coordinator's event log: the newest ``max_in_memory`` events in memory, older
    ones appended to ``spill_path`` (JSONL) in chunks, so memory stays flat however long
    the run. ``all_events()`` reads both back in order; ``self.events`` is the in-memory
    tail only.
    """

    def __init__(self, max_in_memory: int = 100_000, spill_path: str | Path | None = None):
        if isinstance(max_in_memory, bool) or not isinstance(max_in_memory, int) or max_in_memory < 2:
            raise SpecError("max_events_in_memory", max_in_memory, "an integer >= 2")
        super().__init__(include_progress=True)
        self.max_in_memory = max_in_memory
        self.spill_path = Path(spill_path) if spill_path else None
        self.spilled = 0  # events written to spill_path
        if self.spill_path is not None:
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            self.spill_path.write_text("")  # a log of this coordinator only

    def _record(self, hook_name: str, arguments: dict) -> None:
        super()._record(hook_name, arguments)
        self._bound()

    def append(self, event: dict) -> None:
        """Record an event the coordinator writes itself (a plain, JSON-friendly dict)."""
        self.events.append(event)
        self._bound()

    def _bound(self) -> None:
        if len(self.events) <= self.max_in_memory:
            return
        # Spill the older half at once: one file append per max_in_memory / 2 events.
        cut = len(self.events) - self.max_in_memory // 2
        old, self.events[:] = self.events[:cut], self.events[cut:]
        if self.spill_path is None:
            self.spill_path = Path(tempfile.mkstemp(prefix="jigsaw-coordinator-", suffix=".jsonl")[1])
        with open(self.spill_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(e, default=repr) + "\n" for e in old)
        self.spilled += len(old)

    def __len__(self) -> int:
        return self.spilled + len(self.events)

    def all_events(self) -> list[dict]:
        """Every event of the run, oldest first (the spilled ones read back from disk)."""
        spilled = self.from_jsonl(self.spill_path) if self.spilled else []
        return spilled + list(self.events)


class _CoordinatorImpl:
    """The actor's body (an async Ray actor: ``acquire`` waits without blocking others)."""

    def __init__(self, devices: int, heartbeat_timeout_s: float = 10.0, max_events_in_memory: int = 100_000,
                 event_spill_path: str | None = None):
        from jigsaw_plugin.manager import get_plugin_manager, register

        self.pool = DevicePool(devices)
        self.pipelines: dict[str, dict] = {}
        self.recorder = SpillingEventLog(max_events_in_memory, event_spill_path)
        self.pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
        register(self.pm, self.recorder, name="recorder")
        self.started = time.time()
        self._next: dict[str, int] = {}  # client -> sequence number of its next event
        self._held: dict[str, dict] = {}  # client -> events that arrived before their turn
        self.heartbeats = HeartbeatBook(heartbeat_timeout_s)
        self._reaper: asyncio.Task | None = None
        self.reaped: list[dict] = []  # pipelines whose driver went silent (info())

    def info(self) -> dict:
        return {"devices": len(self.pool.devices), "pipelines": dict(self.pipelines),
                "holder": dict(self.pool.holder), "waiting": len(self.pool.waiting),
                "events": len(self.recorder), "events_in_memory": len(self.recorder.events),
                "events_spilled": self.recorder.spilled,
                "spill_path": str(self.recorder.spill_path) if self.recorder.spill_path else None,
                "watched": list(self.heartbeats.watched()), "reaped": list(self.reaped), "pid": os.getpid()}

    async def register_pipeline(self, pipeline: str, spec: dict, client: str | None = None) -> None:
        """Join the pool. A ``client`` id means that client sends heartbeats for the
        pipeline, and its silence for ``heartbeat_timeout_s`` ends the pipeline."""
        self.pipelines[pipeline] = dict(spec or {})
        self._emit("jigsaw_register_pipeline", {"pipeline": pipeline, "spec": dict(spec or {})})
        if client is not None:
            self.heartbeats.watch(pipeline, time.monotonic())
            self._start_reaper()

    def unregister_pipeline(self, pipeline: str) -> None:
        self._drop(pipeline, "unregistered")

    def heartbeat(self, pipelines: list) -> list:
        """A client's heartbeat for its pipelines; returns those the coordinator no longer
        knows (reaped after a silence, or never registered): their leases are gone."""
        now = time.monotonic()
        return [p for p in pipelines if not self.heartbeats.beat(p, now)]

    def _drop(self, pipeline: str, reason: str) -> None:
        """Forget a pipeline and give its devices to the waiting drivers."""
        self.pipelines.pop(pipeline, None)
        self.heartbeats.forget(pipeline)
        held = self.pool.release_all(pipeline)
        if held:
            self._record_release(pipeline, held, reason)

    def _record_release(self, pipeline: str, devices: tuple, reason: str) -> None:
        # Written here, not through the hook: the hook has no ``reason`` argument.
        self.recorder.append({"hook": "jigsaw_lease_released", "pipeline": pipeline, "devices": list(devices),
                              "t": time.time() - self.started, "reason": reason})

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        period = min(1.0, self.heartbeats.timeout_s / 4)
        while self.heartbeats.watched():
            await asyncio.sleep(period)
            for pipeline in self.heartbeats.expired(time.monotonic()):
                held = tuple(sorted(d for d, p in self.pool.holder.items() if p == pipeline))
                self.reaped.append({"pipeline": pipeline, "devices": list(held), "t": time.time() - self.started})
                print(f"jigsaw coordinator: pipeline {pipeline!r} sent no heartbeat for "
                      f"{self.heartbeats.timeout_s:g} s (its driver died or hangs): releasing devices "
                      f"{list(held)}", file=sys.stderr)
                self._drop(pipeline, "driver_lost")

    def _emit(self, hook_name: str, kwargs: dict) -> None:
        from jigsaw_plugin.manager import call

        call(self.pm, hook_name, **kwargs)

    def emit(self, hook_name: str, kwargs: dict, client: str | None = None, seq: int | None = None) -> None:
        """Record an event. An async actor may run fire-and-forget calls out of order, so
        a client numbers its emits and they are recorded in that order (a later one waits
        here until the earlier ones arrived)."""
        if client is None:
            self._emit(hook_name, kwargs)
            return
        held = self._held.setdefault(client, {})
        held[int(seq)] = (hook_name, kwargs)
        nxt = self._next.get(client, 0)
        while nxt in held:
            self._emit(*held.pop(nxt))
            nxt += 1
        self._next[client] = nxt

    def events(self) -> list[dict]:
        return self.recorder.all_events()

    async def acquire(self, pipeline: str, purpose: str, n_devices: int, timeout_s: float | None) -> tuple:
        if pipeline not in self.pipelines:
            raise LeaseError(f"pipeline {pipeline!r} is not registered; registered: {sorted(self.pipelines)}")
        w = self.pool.request(pipeline, purpose, n_devices)
        try:
            await asyncio.wait_for(w.event.wait(), timeout_s)
        except asyncio.TimeoutError:
            self.pool.cancel(w)
            raise TimeoutError(f"{pipeline}: no {n_devices} device(s) for {purpose!r} within {timeout_s} s "
                               f"(held: {dict(self.pool.holder)})") from None
        if w.granted is None:
            raise LeaseError(f"pipeline {pipeline!r} left the pool (unregistered, or its driver went silent) "
                             f"while waiting for {n_devices} device(s) for {purpose!r}")
        self._emit("jigsaw_lease_granted", {"pipeline": pipeline, "devices": w.granted, "purpose": purpose,
                                            "t": time.time() - self.started})
        return w.granted

    def release(self, pipeline: str, devices) -> None:
        self.pool.release(pipeline, devices)
        self._record_release(pipeline, tuple(devices), "released")

    async def run_workload(self, workload: dict, policy: str, policy_options: dict | None, options: dict) -> dict:
        """Run a workload under a registered policy on live engines (runtime/ray_bench.py)."""
        from jigsaw_plugin.runtime.ray_bench import run_in_coordinator

        return await run_in_coordinator(workload, policy, policy_options or {}, options)

    def shutdown_pool(self) -> None:
        """Stop the engines ``run_workload`` started (cleanly, before the actor goes)."""
        from jigsaw_plugin.runtime.ray_bench import shutdown_pool

        shutdown_pool()

    async def pool_pids(self) -> list[int]:
        """Pids of the run's trainer actors, the pooled engine actors and their vLLM
        processes (clean-up tests)."""
        from jigsaw_plugin.runtime import ray_bench

        pool = ray_bench._POOL
        if pool is None:
            return []
        out = list(ray_bench._TRAINER_PIDS)
        for engine in list(pool.engines.values()):
            out += await engine.handle.pids.remote()
        return out


def coordinator_actor_class():
    import ray

    return ray.remote(_CoordinatorImpl)


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

    def register_pipeline(self, pipeline: str, spec: dict | None = None) -> None:
        with self._lock:
            self._registered.add(pipeline)
            self.evicted.discard(pipeline)
        self._call("register_pipeline", pipeline, dict(spec or {}), self._id)
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
                default: tuple | None = None) -> tuple:
        """A lease of ``n_devices`` from the pool (blocks until granted or ``timeout_s``).
        After a coordinator loss in fallback mode: ``default`` (the host's own devices for
        this purpose), else devices ``0..n_devices-1``."""
        own = tuple(default) if default is not None else tuple(range(int(n_devices)))
        got = self._call("acquire", pipeline, purpose, int(n_devices), timeout_s, fallback=own)
        return tuple(got)

    def release(self, pipeline: str, devices) -> None:
        self._call("release", pipeline, tuple(devices))

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
                        event_spill_path: str | None = None) -> CoordinatorClient:
    """Get the named coordinator, creating it (with ``devices`` in its pool) if absent.

    ``ray.init`` must have been called (a local cluster, or ``address=...`` of a real one).
    ``devices`` defaults to the cluster's ``jigsaw_device`` resources, else its GPUs, else 1.
    Client side: ``heartbeat_s``, ``loss_timeout_s``, ``on_coordinator_loss``
    (:class:`~jigsaw_plugin.runtime.liveness.LivenessSettings`). Coordinator side, used only
    when this call creates it: ``heartbeat_timeout_s`` (a pipeline silent this long is
    released), ``max_events_in_memory`` and ``event_spill_path`` (:class:`SpillingEventLog`).
    """
    import ray

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
        opts = dict(name=name, namespace=namespace, get_if_exists=True, num_cpus=num_cpus, max_concurrency=1000)
        if detached:
            opts["lifetime"] = "detached"
        handle = coordinator_actor_class().options(**opts).remote(int(devices), heartbeat_timeout_s,
                                                                   max_events_in_memory, event_spill_path)
    client = CoordinatorClient(handle, name, liveness)
    client.info()  # fail here, naming the coordinator, if it cannot start
    return client


#: Hooks the coordinator records itself (from register_pipeline, acquire and release):
#: a forwarder leaves them out, or they would be logged twice.
RECORDED_BY_COORDINATOR = ("jigsaw_register_pipeline", "jigsaw_lease_granted", "jigsaw_lease_released")


class CoordinatorForwarder(EventRecorder):
    """A pluggy plugin forwarding observation hooks to the coordinator (``client.emit``).

    It is an ``EventRecorder`` whose record step sends instead of keeping: one list of
    hook implementations for both. ``hooks``: which to forward (default: every
    observation hook but ``RECORDED_BY_COORDINATOR``).
    """

    def __init__(self, client: CoordinatorClient, include_progress: bool = False, hooks=None):
        if hooks is None:
            from jigsaw_plugin.events import OBSERVATION_HOOKS

            hooks = [h for h in OBSERVATION_HOOKS if h not in RECORDED_BY_COORDINATOR]
        super().__init__(include_progress=include_progress, hooks=hooks)
        self.client = client

    def _record(self, hook_name: str, arguments: dict) -> None:
        if hook_name in self._hooks:
            self.client.emit(hook_name, **{k: v for k, v in arguments.items() if k != "self"})
