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
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from jigsaw_plugin.events import EventRecorder
from jigsaw_plugin.hookspecs import HOOK_NAMES

__all__ = [
    "CoordinatorClient",
    "CoordinatorDied",
    "CoordinatorForwarder",
    "DevicePool",
    "LeaseError",
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

    def release_all(self, pipeline: str) -> None:
        self.release(pipeline, [d for d, p in self.holder.items() if p == pipeline])
        for w in [w for w in self.waiting if w.pipeline == pipeline]:
            self.waiting.remove(w)


class _CoordinatorImpl:
    """The actor's body (an async Ray actor: ``acquire`` waits without blocking others)."""

    def __init__(self, devices: int):
        from jigsaw_plugin.manager import get_plugin_manager, register

        self.pool = DevicePool(devices)
        self.pipelines: dict[str, dict] = {}
        self.recorder = EventRecorder()
        self.pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
        register(self.pm, self.recorder, name="recorder")
        self.started = time.time()
        self._next: dict[str, int] = {}  # client -> sequence number of its next event
        self._held: dict[str, dict] = {}  # client -> events that arrived before their turn

    def info(self) -> dict:
        return {"devices": len(self.pool.devices), "pipelines": dict(self.pipelines),
                "holder": dict(self.pool.holder), "waiting": len(self.pool.waiting),
                "events": len(self.recorder.events)}

    def register_pipeline(self, pipeline: str, spec: dict) -> None:
        self.pipelines[pipeline] = dict(spec or {})
        self._emit("jigsaw_register_pipeline", {"pipeline": pipeline, "spec": dict(spec or {})})

    def unregister_pipeline(self, pipeline: str) -> None:
        self.pipelines.pop(pipeline, None)
        self.pool.release_all(pipeline)

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
        return list(self.recorder.events)

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
        self._emit("jigsaw_lease_granted", {"pipeline": pipeline, "devices": w.granted, "purpose": purpose,
                                            "t": time.time() - self.started})
        return w.granted

    def release(self, pipeline: str, devices) -> None:
        self.pool.release(pipeline, devices)
        self._emit("jigsaw_lease_released", {"pipeline": pipeline, "devices": tuple(devices),
                                             "t": time.time() - self.started})

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
    """A handle on the coordinator; every call raises ``CoordinatorDied`` if it is gone."""

    def __init__(self, handle, name: str):
        import uuid

        self.handle, self.name = handle, name
        self._unsent: list = []  # refs of emits not yet known to have run
        self._id, self._seq = uuid.uuid4().hex, 0  # emits are numbered: recorded in order

    def __reduce__(self):
        # a copy in another process numbers its own emits: it gets a fresh client id
        return (CoordinatorClient, (self.handle, self.name))

    def flush(self) -> None:
        """Wait until every event this client emitted is recorded (an async actor does not
        keep submission order, so ``events()`` flushes first)."""
        refs, self._unsent = self._unsent, []
        if refs:
            self._get(refs)

    def _get(self, ref, timeout=None):
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayActorError as e:
            raise CoordinatorDied(f"the jigsaw coordinator {self.name!r} died: {e}") from None
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, (LeaseError, TimeoutError, ValueError, NotImplementedError)):
                raise cause from None
            raise

    def info(self) -> dict:
        return self._get(self.handle.info.remote())

    def register_pipeline(self, pipeline: str, spec: dict | None = None) -> None:
        self._get(self.handle.register_pipeline.remote(pipeline, dict(spec or {})))

    def unregister_pipeline(self, pipeline: str) -> None:
        self._get(self.handle.unregister_pipeline.remote(pipeline))

    def emit(self, hook_name: str, **kwargs) -> None:
        """Fire-and-forget; the hook name is checked here, where a typo can be reported."""
        if hook_name not in HOOK_NAMES:
            raise ValueError(f"unknown hook {hook_name!r}; valid hooks: {', '.join(HOOK_NAMES)}")
        self._unsent.append(self.handle.emit.remote(hook_name, kwargs, self._id, self._seq))
        self._seq += 1
        if len(self._unsent) >= 256:  # keep the list short: drop the refs that have run
            import ray

            done, self._unsent = ray.wait(self._unsent, num_returns=len(self._unsent), timeout=0)
            self._get(done)  # surfaces a coordinator that died

    def events(self) -> list[dict]:
        self.flush()
        return self._get(self.handle.events.remote())

    def acquire(self, pipeline: str, purpose: str, n_devices: int, timeout_s: float | None = None) -> tuple:
        return tuple(self._get(self.handle.acquire.remote(pipeline, purpose, int(n_devices), timeout_s)))

    def release(self, pipeline: str, devices) -> None:
        self._get(self.handle.release.remote(pipeline, tuple(devices)))

    def run_workload(self, workload: dict, policy: str, policy_options: dict | None = None, **options) -> dict:
        return self._get(self.handle.run_workload.remote(workload, policy, policy_options, options))

    def shutdown_pool(self) -> None:
        self._get(self.handle.shutdown_pool.remote())

    def shutdown(self) -> None:
        import ray

        ray.kill(self.handle)


def connect_coordinator(name: str = "jigsaw", namespace: str = "jigsaw", devices: int | None = None,
                        detached: bool = False, num_cpus: float = 0) -> CoordinatorClient:
    """Get the named coordinator, creating it (with ``devices`` in its pool) if absent.

    ``ray.init`` must have been called (a local cluster, or ``address=...`` of a real one).
    ``devices`` defaults to the cluster's ``jigsaw_device`` resources, else its GPUs, else 1.
    """
    import ray

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
        handle = coordinator_actor_class().options(**opts).remote(int(devices))
    client = CoordinatorClient(handle, name)
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
