"""The jigsaw coordinator: one Ray actor per shared device pool.

Host trainers (verl, OpenRLHF: separate driver processes, possibly on other nodes) and the
reference runtime talk to it through :class:`CoordinatorClient` (``coordinator_client.py``):

- ``register_pipeline`` / ``unregister_pipeline``: who shares the pool;
- ``emit``: hook events (fire-and-forget), recorded in one ``EventRecorder`` so the
  sub-stage graph of every pipeline in the pool is built from one event log
  (``client.events()`` -> ``graph.build_from_events``);
- ``acquire`` / ``release``: device grants, decided by the coordinator's scheduler
  (``runtime.lease_schedulers``, fixed by ``CoordinatorConfig`` when it is created):
  ``fifo-lease`` grants a lease when enough devices are free, waiters in order of arrival
  (a big request is not starved by later small ones), rollout first among them; a
  registered policy (``jigsaw``, ``verl-sync``, ...) grants each host stage by its
  ``jigsaw_schedule`` decisions (``runtime.host_executor``), within the capabilities the
  host declared at registration (``runtime.capabilities``; outside them: a refusal);
- ``scheduler_report``: the policy's refusals, adapted decisions, migrations and device trace;
- ``take_migrations`` / ``migration_outcome``: a host that declared ``migration`` takes the
  ``HostMigration`` commands its policy chose (a long poll) and reports those it could not
  carry out (``runtime.host_requests``); its request events, recorded through ``emit``,
  are the rows the policy chose them from;
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
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.events import EventRecorder
from jigsaw_plugin.runtime.coordinator_client import CoordinatorClient, CoordinatorDied, connect_coordinator
from jigsaw_plugin.runtime.host_executor import HostPipeline
from jigsaw_plugin.runtime.host_requests import REQUEST_HOOKS, MigrationOutcome
from jigsaw_plugin.runtime.lease_schedulers import (
    FIFO_LEASE,
    CoordinatorConfig,
    DevicePool,
    LeaseError,
    make_scheduler,
)
from jigsaw_plugin.runtime.liveness import HeartbeatBook

__all__ = [
    "CoordinatorClient",
    "CoordinatorDied",
    "CoordinatorForwarder",
    "CoordinatorConfig",
    "DevicePool",
    "LeaseError",
    "SpillingEventLog",
    "connect_coordinator",
]

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
        self.spill_errors = 0  # failed spills (disk full): their events stayed in memory
        self._hold = 0  # after a failed spill, the next try waits for this many events
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
        if len(self.events) <= max(self.max_in_memory, self._hold):
            return
        # Spill the older half at once: one file append per max_in_memory / 2 events.
        cut = len(self.events) - self.max_in_memory // 2
        if self.spill_path is None:
            self.spill_path = Path(tempfile.mkstemp(prefix="jigsaw-coordinator-", suffix=".jsonl")[1])
        if self._spill(self.events[:cut]):
            del self.events[:cut]
            self.spilled += cut
            self._hold = 0
        else:  # a full disk must not fail the drivers' emits: keep them, try again later
            self._hold = len(self.events) + self.max_in_memory // 2

    def _spill(self, old: list) -> bool:
        """Append ``old`` whole or not at all (a partial chunk is cut off again)."""
        data = memoryview("".join(json.dumps(e, default=repr) + "\n" for e in old).encode())
        try:
            fd = os.open(self.spill_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            return self._spill_failed(e, len(old))
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            while data:
                data = data[os.write(fd, data):]
            return True
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            return self._spill_failed(e, len(old))
        finally:
            os.close(fd)

    def _spill_failed(self, error: OSError, n: int) -> bool:
        self.spill_errors += 1
        if self.spill_errors == 1:
            print(f"jigsaw-plugin: WARNING: cannot append to the event log's spill file {self.spill_path}: {error}; "
                  f"keeping {n} older events in memory (memory grows) and trying again every "
                  f"{self.max_in_memory // 2} events", file=sys.stderr, flush=True)
        return False

    def __len__(self) -> int:
        return self.spilled + len(self.events)

    def all_events(self) -> list[dict]:
        """Every event of the run, oldest first (the spilled ones read back from disk)."""
        spilled = self.from_jsonl(self.spill_path) if self.spilled else []
        return spilled + list(self.events)


class _CoordinatorImpl:
    """The actor's body (an async Ray actor: ``acquire`` waits without blocking others)."""

    def __init__(self, config: CoordinatorConfig):
        from jigsaw_plugin.manager import get_plugin_manager, register

        self.config = config
        self.pipelines: dict[str, dict] = {}
        self.hosts: dict[str, HostPipeline] = {}
        self.recorder = SpillingEventLog(config.max_events_in_memory, config.event_spill_path)
        self.pm = get_plugin_manager(load_entrypoints=False, default_plugins=False)
        register(self.pm, self.recorder, name="recorder")
        self.started = time.time()
        self.scheduler = make_scheduler(config, self.pm, self._record)
        self._next: dict[str, int] = {}  # client -> sequence number of its next event
        self._held: dict[str, dict] = {}  # client -> events that arrived before their turn
        self.heartbeats = HeartbeatBook(config.heartbeat_timeout_s)
        self._reaper: asyncio.Task | None = None
        self.reaped: list[dict] = []  # pipelines whose driver went silent (info())

    def _record(self, event: dict) -> None:
        """An event the coordinator writes itself (grants, refusals: no hook carries them)."""
        self.recorder.append({**event, "t": time.time() - self.started} if "t" not in event else event)

    def info(self) -> dict:
        return {"devices": self.config.devices, "policy": self.scheduler.name, "pipelines": dict(self.pipelines),
                "holder": self.scheduler.holder(), "waiting": self.scheduler.waiting(),
                "events": len(self.recorder), "events_in_memory": len(self.recorder.events),
                "events_spilled": self.recorder.spilled,
                "spill_errors": self.recorder.spill_errors,
                "spill_path": str(self.recorder.spill_path) if self.recorder.spill_path else None,
                "watched": list(self.heartbeats.watched()), "reaped": list(self.reaped), "pid": os.getpid()}

    def scheduler_report(self) -> dict:
        """What the scheduler did: its policy, refusals, adapted decisions, device trace."""
        return self.scheduler.report()

    async def register_pipeline(self, pipeline: str, spec: dict, client: str | None = None,
                                host: HostPipeline | None = None) -> None:
        """Join the pool. A ``client`` id means that client sends heartbeats for the
        pipeline, and its silence for ``heartbeat_timeout_s`` ends the pipeline. ``host``:
        the pipeline's declared settings and capabilities (required by a policy scheduler)."""
        self.scheduler.register(pipeline, host)
        self.pipelines[pipeline] = dict(spec or {})
        if host is not None:
            self.hosts[pipeline] = host
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
        self.hosts.pop(pipeline, None)
        self.heartbeats.forget(pipeline)
        held = self.scheduler.drop(pipeline)
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
                held = tuple(sorted(d for d, p in self.scheduler.holder().items() if p == pipeline))
                self.reaped.append({"pipeline": pipeline, "devices": list(held), "t": time.time() - self.started})
                print(f"jigsaw coordinator: pipeline {pipeline!r} sent no heartbeat for "
                      f"{self.heartbeats.timeout_s:g} s (its driver died or hangs): releasing devices "
                      f"{list(held)}", file=sys.stderr)
                self._drop(pipeline, "driver_lost")

    def _emit(self, hook_name: str, kwargs: dict) -> None:
        from jigsaw_plugin.manager import call

        call(self.pm, hook_name, **kwargs)
        if hook_name in REQUEST_HOOKS:  # in the clients' order: the rows follow the host
            self.scheduler.observe(hook_name, kwargs)

    async def take_migrations(self, pipeline: str, wait_s: float = 0.0) -> list:
        """``pipeline``'s queued migration commands (``HostMigration.to_dict()``), waiting up
        to ``wait_s`` seconds for one."""
        return await self.scheduler.take_migrations(pipeline, float(wait_s))

    def rollout_servers(self, pipeline: str) -> dict:
        """{device: server id} the policy bound for ``pipeline``'s open rollout (a host with
        ``migration`` that places its servers on the granted devices reads it)."""
        return dict(self.scheduler.rollout_servers(pipeline))

    def migration_outcome(self, outcome: dict) -> None:
        """A host's report on a command it did not carry out (``MigrationOutcome.to_dict()``)."""
        self.scheduler.migration_outcome(MigrationOutcome.from_dict(outcome))

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

    async def acquire(self, pipeline: str, purpose: str, n_devices: int, timeout_s: float | None,
                      step: int | None = None, stage: str | None = None) -> tuple:
        """Devices for ``pipeline``'s next ``purpose`` (``step``/``stage``: which stage of
        which step, for a policy scheduler), once the scheduler grants them."""
        if pipeline not in self.pipelines:
            raise LeaseError(f"pipeline {pipeline!r} is not registered; registered: {sorted(self.pipelines)}")
        granted = await self.scheduler.acquire(pipeline, purpose, int(n_devices), timeout_s, step, stage)
        if self.scheduler.name == FIFO_LEASE:  # a policy's executor reports its own grants
            self._emit("jigsaw_lease_granted", {"pipeline": pipeline, "devices": granted, "purpose": purpose,
                                                "t": time.time() - self.started})
        return granted

    def release(self, pipeline: str, devices, step: int | None = None, stage: str | None = None,
                tokens: int | None = None) -> None:
        """The end of a lease (``step``/``stage``: the end of that stage, for a policy)."""
        if self.scheduler.name != FIFO_LEASE and pipeline not in self.pipelines:
            raise LeaseError(f"pipeline {pipeline!r} is not registered; registered: {sorted(self.pipelines)}")
        self.scheduler.release(pipeline, tuple(devices), step, stage, tokens)
        if self.scheduler.name == FIFO_LEASE:
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
