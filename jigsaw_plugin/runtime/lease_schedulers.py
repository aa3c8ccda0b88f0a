"""How the coordinator grants devices: one registered scheduler per coordinator.

- ``fifo-lease``: the first-come lease queue (``DevicePool``): a lease of ``n`` devices is
  granted when they are free, waiters in order of arrival, rollout first among them;
- any policy of the scheduler registry (``jigsaw``, ``verl-sync`` = static halves, ...):
  ``PolicyScheduler``, where the policy decides every grant through ``jigsaw_schedule``
  over a ``SchedulerState`` built from the hosts' requests and reports
  (``runtime.host_executor.HostExecutor``).

Both answer the same calls (``register``, ``acquire``, ``release``, ``drop``,
``observe``, ``take_migrations``, ``migration_outcome``, ``rollout_servers``) from the
coordinator actor, so a host adapter does not know which one runs. Under a policy, a host that declared
``migration`` has its request events observed (the rows its policy sees) and takes the
``HostMigration`` commands its policy chose (``runtime.host_requests``). ``CoordinatorConfig``
(frozen) is how the choice crosses processes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.host_executor import ROLLOUT_STAGES, HostExecutor, HostPipeline
from jigsaw_plugin.runtime.host_requests import MigrationOutcome

__all__ = ["CoordinatorConfig", "DevicePool", "LeaseError", "FifoLeaseScheduler", "PolicyScheduler",
           "make_scheduler", "import_policy_modules", "FIFO_LEASE", "ROLLOUT_PURPOSES"]

FIFO_LEASE = "fifo-lease"
ROLLOUT_PURPOSES = ("gen", "rollout")


class LeaseError(ValueError):
    """A lease request that can never be granted, or a release of devices not held."""


@dataclass(frozen=True)
class CoordinatorConfig:
    """The coordinator's settings, fixed by whoever creates it.

    :param devices: Devices in the shared pool.
    :param policy: ``fifo-lease`` or a registered policy name (``jigsaw``, ``verl-sync``, ...).
    :param policy_options: ``(name, value)`` pairs of the policy's config fields.
    :param heartbeat_timeout_s: A pipeline silent this long is released.
    :param max_events_in_memory: Events kept in memory (older ones spill to a file).
    :param event_spill_path: Where they spill (default: a temporary file).
    :param policy_modules: Modules imported before ``policy`` is looked up, for policies
        registered outside jigsaw-plugin (``register_policy``); importable where the
        coordinator runs (the Ray workers' ``PYTHONPATH``).
    """

    devices: int
    policy: str = FIFO_LEASE
    policy_options: tuple = ()
    heartbeat_timeout_s: float = 10.0
    max_events_in_memory: int = 100_000
    event_spill_path: str | None = None
    policy_modules: tuple = ()

    def __post_init__(self):
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices < 1:
            raise SpecError("coordinator.devices", self.devices, "an integer >= 1")
        import_policy_modules(self.policy_modules)
        if self.policy != FIFO_LEASE:
            from jigsaw_plugin.scheduler.base import get_policy

            get_policy(self.policy, **dict(self.policy_options))  # names the bad policy or option
        elif self.policy_options:
            raise SpecError("coordinator.policy_options", dict(self.policy_options),
                            "none (fifo-lease takes no options)")


def import_policy_modules(modules) -> None:
    """Import the modules that register the coordinator's policy (``CoordinatorConfig.policy_modules``)."""
    import importlib

    if isinstance(modules, str) or not isinstance(modules, (tuple, list)):
        raise SpecError("coordinator.policy_modules", modules, "a tuple of module names")
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # ImportError, or the module failed while registering
            raise SpecError("coordinator.policy_modules", name,
                            f"an importable module that registers policies ({type(e).__name__}: {e})") from None


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


class FifoLeaseScheduler:
    """``fifo-lease``: the first-come queue of ``DevicePool``."""

    name = FIFO_LEASE

    def __init__(self, config: CoordinatorConfig):
        self.pool = DevicePool(config.devices)

    def register(self, pipeline: str, host: HostPipeline | None) -> None:
        pass  # any pipeline may ask for leases

    def holder(self) -> dict:
        return dict(self.pool.holder)

    def waiting(self) -> int:
        return len(self.pool.waiting)

    async def acquire(self, pipeline: str, purpose: str, n: int, timeout_s, step=None, stage=None) -> tuple:
        w = self.pool.request(pipeline, purpose, n)
        try:
            await asyncio.wait_for(w.event.wait(), timeout_s)
        except asyncio.TimeoutError:
            self.pool.cancel(w)
            raise TimeoutError(f"{pipeline}: no {n} device(s) for {purpose!r} within {timeout_s} s "
                               f"(held: {dict(self.pool.holder)})") from None
        if w.granted is None:
            raise LeaseError(f"pipeline {pipeline!r} left the pool (unregistered, or its driver went silent) "
                             f"while waiting for {n} device(s) for {purpose!r}")
        return w.granted

    def release(self, pipeline: str, devices, step=None, stage=None, tokens=None) -> tuple:
        self.pool.release(pipeline, devices)
        return tuple(devices)

    def drop(self, pipeline: str) -> tuple:
        return self.pool.release_all(pipeline)

    def observe(self, hook: str, kwargs: dict) -> None:
        pass  # leases only: a host's requests do not matter here

    async def take_migrations(self, pipeline: str, wait_s: float = 0.0) -> list:
        if wait_s > 0:
            await asyncio.sleep(wait_s)  # a long poll that never gets one: no policy, no migrations
        return []

    def migration_outcome(self, outcome: MigrationOutcome) -> None:
        pass

    def rollout_servers(self, pipeline: str) -> dict:
        return {}  # no policy binds servers to devices

    def report(self) -> dict:
        return {"policy": self.name}


class PolicyScheduler:
    """A registered policy decides every grant (``HostExecutor``); see the module docstring.

    Hosts must register with a ``HostPipeline`` and name the step and stage of each
    request. A request without them (a phase lease: ``purpose`` ``rollout``/``train``)
    is taken as the pipeline's next rollout or training phase. If every waiting pipeline
    waits on the policy while it holds no device and decides nothing, the waits fail with
    that reason (a policy that can never grant them would otherwise hang the hosts).
    """

    def __init__(self, config: CoordinatorConfig, pm, on_record):
        from jigsaw_plugin.scheduler.base import get_policy

        self.config = config
        self.name = config.policy
        self.pm = pm
        self.on_record = on_record  # (dict) -> None: writes the coordinator's event log
        import_policy_modules(config.policy_modules)  # in the actor's process: registers them here too
        self.policy = get_policy(config.policy, **dict(config.policy_options))
        self.ex: HostExecutor | None = None
        self._events: dict[int, asyncio.Event] = {}
        self._ticker: asyncio.Task | None = None
        self._commands: dict[str, asyncio.Event] = {}  # pipeline -> set when a command is queued for it
        self._round_queued = False  # a round after a burst of request events is already scheduled

    # ---- membership -------------------------------------------------------------------
    def register(self, pipeline: str, host: HostPipeline | None) -> None:
        if host is None:
            raise SpecError("register_pipeline(host=)", None,
                            f"a HostPipeline (policy {self.name!r} plans with each pipeline's declared settings "
                            f"and capabilities; run the coordinator with policy={FIFO_LEASE!r} for plain leases)")
        if host.name != pipeline:
            raise SpecError("host.name", host.name, f"the registered pipeline's name {pipeline!r}")
        if self.ex is None:
            self.ex = HostExecutor(self.config.devices, host, self.policy, hooks=self.pm.hook, pm=self.pm,
                                   on_refusal=self._refused, on_migration=self._migration_logged)
        elif pipeline not in self.ex.pipelines:
            self.ex.add(host)
        self._round()

    def drop(self, pipeline: str) -> tuple:
        if self.ex is None or pipeline not in self.ex.pipelines:
            return ()
        held = tuple(sorted(d for d, task in self.ex.task.items() if task.pipeline == pipeline))
        self.ex.remove(pipeline)
        self._round()
        return held

    def holder(self) -> dict:
        return {} if self.ex is None else {d: task.pipeline for d, task in self.ex.task.items()}

    def waiting(self) -> int:
        return 0 if self.ex is None else len(self.ex.tickets)

    # ---- grants ----------------------------------------------------------------------------
    def _step_stage(self, pipeline: str, purpose: str, step, stage) -> tuple[int, str]:
        p = self.ex.pipelines[pipeline]
        if stage is None:
            stage = "gen" if purpose in ROLLOUT_PURPOSES else "train"
        if step is None:
            step = p.gen_next if stage in ROLLOUT_STAGES else p.train_next
        return int(step), stage

    async def acquire(self, pipeline: str, purpose: str, n: int, timeout_s, step=None, stage=None) -> tuple:
        if self.ex is None or pipeline not in self.ex.pipelines:
            raise LeaseError(f"pipeline {pipeline!r} is not registered with policy {self.name!r}")
        step, stage = self._step_stage(pipeline, purpose, step, stage)
        tk = self.ex.want(pipeline, step, stage)
        if tk.resolved:
            return self._answer(tk)
        event = self._events.setdefault(id(tk), asyncio.Event())
        self._start_ticker()
        self._round()
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            if tk in self.ex.tickets:
                self.ex.tickets.remove(tk)
            raise TimeoutError(f"{pipeline}: policy {self.name!r} granted no devices for {stage} of step {step} "
                               f"within {timeout_s} s (held: {self.holder()})") from None
        finally:
            self._events.pop(id(tk), None)
        return self._answer(tk)

    def _answer(self, tk) -> tuple:
        if tk.refused is not None:
            raise LeaseError(tk.refused)
        self.on_record({"hook": "jigsaw_stage_granted", "pipeline": tk.pipeline, "step": tk.step,
                        "stage": tk.stage, "devices": list(tk.granted), "policy": self.name, "t": self.ex.t})
        return tk.granted

    def release(self, pipeline: str, devices, step=None, stage=None, tokens=None) -> tuple:
        """The end of a granted stage (or phase), or part of a rollout grant given back early
        (``devices`` fewer than the rollout holds: ``HostExecutor.release_replicas``); returns
        the devices it gave back."""
        if self.ex is None or pipeline not in self.ex.pipelines:
            raise LeaseError(f"pipeline {pipeline!r} is not registered with policy {self.name!r}")
        if step is None or stage is None:
            p = self.ex.pipelines[pipeline]
            if stage is None:
                stage = "gen" if p.gen_next > p.train_next and p.replicas else "train"
            if step is None:
                step = p.gen_next - 1 if stage in ROLLOUT_STAGES else p.train_next
        before = set(d for d, task in self.ex.task.items() if task.pipeline == pipeline)
        self.ex.done(pipeline, int(step), stage, tokens, devices=tuple(devices))
        self._round()
        after = set(d for d, task in self.ex.task.items() if task.pipeline == pipeline)
        return tuple(sorted(before - after))

    # ---- a migration-capable host's requests ------------------------------------------------
    def observe(self, hook: str, kwargs: dict) -> None:
        """An event the coordinator recorded: a host's request events feed its rows, and a
        round runs on them (a tail the policy would move shows in them)."""
        if self.ex is None or not self.ex.request_event(hook, kwargs):
            return
        self._start_ticker()
        self._round_soon()

    def _round_soon(self) -> None:
        """One round after the request events that arrive together (a step's submissions
        come in bursts of hundreds): run on the actor's loop once the current call returns,
        at once when there is no running loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._round()
            return
        if not self._round_queued:
            self._round_queued = True
            loop.call_soon(self._queued_round)

    def _queued_round(self) -> None:
        self._round_queued = False
        self._round()

    async def take_migrations(self, pipeline: str, wait_s: float = 0.0) -> list:
        """The pipeline's queued ``HostMigration`` commands as dicts, waiting up to
        ``wait_s`` for one (a host polls this from one thread: a long poll)."""
        if self.ex is None or pipeline not in self.ex.pipelines:
            raise LeaseError(f"pipeline {pipeline!r} is not registered with policy {self.name!r}")
        got = self.ex.take_migrations(pipeline)
        if not got and wait_s > 0:
            event = self._commands.setdefault(pipeline, asyncio.Event())
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
            if self.ex is not None and pipeline in self.ex.pipelines:
                got = self.ex.take_migrations(pipeline)
        return [c.to_dict() for c in got]

    def rollout_servers(self, pipeline: str) -> dict:
        """{device: server id} the policy bound for ``pipeline``'s open rollout."""
        return {} if self.ex is None else self.ex.rollout_servers(pipeline)

    def migration_outcome(self, outcome: MigrationOutcome) -> None:
        if self.ex is not None:
            self.ex.migration_outcome(outcome)
            self._round()

    def _migration_logged(self, record: dict) -> None:
        self.on_record({**record, "policy": self.name})
        if record["hook"] == "jigsaw_migration_issued":
            event = self._commands.get(record["pipeline"])
            if event is not None:
                event.set()

    # ---- rounds ------------------------------------------------------------------------------
    def _round(self) -> None:
        if self.ex is None:
            return
        for tk in self.ex.round():
            event = self._events.get(id(tk))
            if event is not None:
                event.set()
        self._check_stuck()

    def _check_stuck(self) -> None:
        ex = self.ex
        if not ex.tickets or ex.task:
            return
        waiting = {tk.pipeline for tk in ex.tickets}
        if any(not p.done and p.name not in waiting for p in ex.order):
            return  # a pipeline still runs on its own (its rollout, its driver): it may free things
        ex.dirty = True
        ex.round()
        if not ex.tickets or ex.task:
            return
        for tk in list(ex.tickets):
            tk.refused = (f"{tk.pipeline}: policy {self.name!r} decided nothing for {tk.stage} of step {tk.step} "
                          f"while every pipeline waits on it and no device is busy (it would never be granted)")
            ex.tickets.remove(tk)
            self._refused({"pipeline": tk.pipeline, "decision": None, "reason": tk.refused, "t": ex.t})
            event = self._events.get(id(tk))
            if event is not None:
                event.set()

    def _refused(self, record: dict) -> None:
        self.on_record({"hook": "jigsaw_decision_refused", "policy": self.name, **record})

    def _start_ticker(self) -> None:
        """Rounds also run on a timer while hosts wait: a look-ahead policy may wait for a
        projected time rather than for an event."""
        if self._ticker is None or self._ticker.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # called outside the actor's loop: the next acquire starts it
            self._ticker = loop.create_task(self._tick())

    async def _tick(self) -> None:
        while self.ex is not None and (self.ex.tickets or any(b.rows for b in self.ex.books.values())):
            await asyncio.sleep(0.25)
            self.ex.dirty = True
            self._round()

    def report(self) -> dict:
        if self.ex is None:
            return {"policy": self.name}
        return {"policy": self.name, "refusals": list(self.ex.refusals), "adapted": list(self.ex.adapted),
                "migrations": list(self.ex.migration_log),
                "decisions": len(self.ex.decision_us), "decision_s": round(sum(self.ex.decision_us) / 1e6, 3),
                "trace": [list(x) for x in self.ex.trace],
                "busy_device_s": self.ex.busy_s}


def make_scheduler(config: CoordinatorConfig, pm, on_record):
    if config.policy == FIFO_LEASE:
        return FifoLeaseScheduler(config)
    return PolicyScheduler(config, pm, on_record)
