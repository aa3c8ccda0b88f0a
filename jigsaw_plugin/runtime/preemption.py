"""Preemptible devices in real runs: when each device is lost, and the driver that loses it.

The workload's device classes carry ``preemptible`` (a Poisson ``rate_per_hour`` per device,
or a trace of times) and ``replace_s`` (workload/spec.py), in device time. A real run lasts
minutes, so rates per device-hour would give no event: ``time_scale`` says how many device
seconds one wall second stands for (``time_scale=30``: 1 per device-hour becomes one per
two wall minutes per device; ``replace_s=120`` becomes 4 wall seconds). Every output that
quotes a rate says its scale.

``PreemptionDriver`` runs beside a live run: one task per preemptible device draws its
next preemption (seeded by the run's seed, the class and the device's index in it, so
two runs with one seed see the same times), sleeps until then, asks the *target* to
preempt the device (``await target.preempt(device, recovery)``), waits the class's
replacement delay and asks the target to bring a replacement up (``await
target.replace(device)``, which takes what it takes: a real engine's start is on top of
the delay). The next preemption of that device is drawn from the moment the replacement
joined, as in the simulator (sim/preemption.py). What a preemption does to the run is the
target's business (runtime/preemption_ray.py: the live executor, the engine pool, the
trainers, the parameter server); this module imports neither Ray nor torch.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.errors import SpecError

__all__ = ["RECOVERIES", "PreemptibleDevice", "PreemptionDriver", "PreemptionRecord", "ReplacementRecord",
           "draw_times", "preemptible_devices"]

#: What a preempted rollout worker's in-flight requests do: ``migrate`` (resume on another
#: replica with the tokens they generated) or ``restart`` (the baseline: every request of
#: the step still in flight is generated again from its first token).
RECOVERIES = ("migrate", "restart")
_SEED_SALT = 0x9E3779B1  # the simulator's salt (sim/preemption.py)


@dataclass(frozen=True, slots=True)
class PreemptibleDevice:
    """One preemptible device, in wall seconds: its Poisson rate per wall second (0: trace
    only), its trace's times and its replacement delay, all divided by the time scale."""

    device: int
    cls: str
    cls_index: int
    index: int  # within its class
    rate_per_wall_s: float
    trace_wall_s: tuple[float, ...]
    replace_wall_s: float


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """One preemption as the target handled it (wall seconds from the driver's start)."""

    device: int
    cls: str
    at_s: float
    hit: str  # "replica", "stage", "idle" (what ran on the device)
    requests: int  # in-flight requests on the preempted replica
    pipeline: str | None = None


@dataclass(frozen=True, slots=True)
class ReplacementRecord:
    """A preempted device's replacement joining the run."""

    device: int
    at_s: float  # when it joined (wall seconds from the driver's start)
    down_s: float  # since its preemption: the replacement delay plus the replacement's own start
    weight_versions: tuple  # (pipeline, version its engine pulled) per engine on the device
    trainer_versions: tuple = ()  # (pipeline, version restored) for a preempted trainer


def _positive_finite(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(field, value, "a finite number > 0")
    return float(value)


def preemptible_devices(cluster, time_scale: float) -> tuple[PreemptibleDevice, ...]:
    """The preemptible devices of ``cluster`` (a ``ClusterSpec``), devices numbered class
    by class as the executor numbers them, in wall seconds at ``time_scale`` device seconds
    per wall second."""
    scale = _positive_finite("time_scale", time_scale)
    out, first = [], 0
    for k, c in enumerate(cluster.device_classes()):
        pre = c.preemptible
        if pre is not None:
            for i in range(c.count):
                trace = tuple(sorted(t / scale for t, d in (pre.trace or ()) if d == i))
                rate = (pre.rate_per_hour or 0.0) * scale / 3600.0
                out.append(PreemptibleDevice(first + i, c.name, k, i, rate, trace, pre.replace_s / scale))
        first += c.count
    return tuple(out)


def draw_times(dev: PreemptibleDevice, seed: int):
    """An iterator over ``dev``'s preemption times: ``send(after)`` (wall seconds) returns
    the next time after ``after``. Poisson draws come from a generator seeded by the run's
    seed, the class and the device's index; a trace's times are taken in order."""
    rng = np.random.default_rng([int(seed), _SEED_SALT, dev.cls_index, dev.index])
    trace = list(dev.trace_wall_s)
    after = yield None
    while True:
        candidates = []
        while trace and trace[0] < after:
            trace.pop(0)  # the device was down then: that trace event hit nothing
        if trace:
            candidates.append(trace[0])
        if dev.rate_per_wall_s > 0:
            candidates.append(after + float(rng.exponential(1.0 / dev.rate_per_wall_s)))
        if not candidates:
            return
        t = min(candidates)
        if trace and t == trace[0]:
            trace.pop(0)
        after = yield t


class PreemptionDriver:
    """Preempts ``devices`` of a running run at their drawn times (module docstring).

    ``target``: ``await preempt(device, recovery) -> PreemptionRecord fields (hit,
    requests, pipeline)`` as a dict, and ``await replace(device) -> (weight_versions,
    trainer_versions)``; ``done()``: the run has finished (no more preemptions)."""

    def __init__(self, devices, target, seed: int = 0, recovery: str = "migrate", done=None, clock=time.monotonic):
        if recovery not in RECOVERIES:
            raise SpecError("recovery", recovery, " | ".join(RECOVERIES))
        self.devices, self.target, self.seed, self.recovery = tuple(devices), target, int(seed), recovery
        self._done = done or (lambda: False)
        self._clock = clock
        self._t0 = 0.0
        self._stop: asyncio.Event | None = None
        self.preemptions: list[PreemptionRecord] = []
        self.replacements: list[ReplacementRecord] = []

    def now(self) -> float:
        return self._clock() - self._t0

    async def run(self) -> None:
        """The run's preemptions, until ``stop()`` (or every device's trace is spent). A
        replacement under way when it stops still joins: ``run`` returns after it."""
        self._t0 = self._clock()
        self._stop = asyncio.Event()
        await asyncio.gather(*(self._device(d) for d in self.devices))

    def stop(self) -> None:
        """No more preemptions (the run has ended)."""
        if self._stop is not None:
            self._stop.set()

    async def _sleep_until(self, t: float) -> bool:
        """Sleep until driver time ``t``; False if stopped (or the run is done) first."""
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=max(0.0, t - self.now()))
        except asyncio.TimeoutError:
            pass
        return not (self._stop.is_set() or self._done())

    async def _device(self, dev: PreemptibleDevice) -> None:
        times = draw_times(dev, self.seed)
        next(times)
        after = 0.0
        while True:
            try:
                at = times.send(after)
            except StopIteration:
                return
            if not await self._sleep_until(at):
                return
            await self.preempt_now(dev)
            after = self.now()

    async def preempt_now(self, dev: PreemptibleDevice) -> None:
        """Preempt ``dev`` now, wait its replacement delay (never cut short), bring the
        replacement up; both recorded."""
        if self._stop is None:  # used without run(): times count from the first call
            self._t0, self._stop = self._clock(), asyncio.Event()
        lost = self.now()
        hit = await self.target.preempt(dev.device, self.recovery)
        self.preemptions.append(PreemptionRecord(dev.device, dev.cls, lost, **hit))
        await asyncio.sleep(max(0.0, lost + dev.replace_wall_s - self.now()))
        weights, trainers = await self.target.replace(dev.device)
        back = self.now()
        self.replacements.append(ReplacementRecord(dev.device, back, back - lost, tuple(weights), tuple(trainers)))
