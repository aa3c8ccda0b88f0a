"""Preemptible devices in the simulator (RLAX's preemption tolerance).

A class with ``preemptible: {rate_per_hour: X}`` loses each device at Poisson times of
that rate (seeded by the run's seed and the class); ``{trace: FILE}`` gives the times. When
a device is preempted:

- a rollout replica on it is closed; its in-flight requests resume on the pipeline's
  other replicas through the migration path (``World.lose_replica``): with recovery
  ``migrate`` (the default) they keep the tokens they generated and the destination
  re-prefills their context; with ``restart`` (the baseline a system without migration
  has) they are generated again from their first token;
- a training stage on it loses the micro-batches done since the last checkpointed
  version (the update's start) and runs again when the replacement joins
  (``World.restart_stage``);
- a free device just leaves the pool;
- a device in a weight sync or host stage is preempted when that stage ends (the sync is
  a few seconds; retried there rather than modelled mid-copy).

The device comes back ``replace_s`` later as a fresh device (nothing resident: a replica
launched on it pulls the latest weights, priced as a context switch and over its class's
link). Downtime is not billed (``downtime_s``). Preemptions stop when every pipeline has
finished; they never decide anything a policy could: the policy sees the device leave and
come back through the state.
"""

from __future__ import annotations

import numpy as np

from jigsaw_plugin.sim.events import Event

__all__ = ["RECOVERIES", "Preempt", "DeviceBack", "Preemptions"]

RECOVERIES = ("migrate", "restart")
#: A run never draws more preemptions than this (a policy that stalls must still end).
MAX_PREEMPTIONS = 100_000
_RETRY_S = 1.0  # a preemption that hits a pending resize is looked at again this much later


class Preempt(Event):
    """Device ``device`` (of class ``cls``) is preempted."""

    priority = 0
    background = True  # never keeps a finished run going
    __slots__ = ("device", "cls", "poisson")

    def __init__(self, t, device, cls, poisson):
        super().__init__(t)
        self.device, self.cls, self.poisson = device, cls, poisson

    def handle(self, world) -> None:
        world.preemptions.on_preempt(self)


class DeviceBack(Event):
    """The replacement of a preempted device joins the pool."""

    priority = 0
    background = True
    __slots__ = ("device",)

    def __init__(self, t, device):
        super().__init__(t)
        self.device = device

    def handle(self, world) -> None:
        world.preemptions.on_back(self)


class Preemptions:
    def __init__(self, world, classes, recovery: str, seed: int):
        self.world = world
        self.classes = classes
        self.recovery = recovery
        self._rng = {k: np.random.default_rng([seed, 0x9E3779B1, k]) for k in range(len(classes.specs))}
        self.down: dict[int, float] = {}  # device -> when its replacement joins
        self.count = [0] * len(classes.specs)  # preemptions per class
        self.downtime: list[list] = [[] for _ in classes.specs]  # (start, end) per class
        self._down_total = [0.0] * len(classes.specs)  # the downs' full lengths, summed
        self._open: list[list] = [[] for _ in classes.specs]  # ends of downs that may still be open
        self.resumed_requests = 0  # in-flight requests moved off preempted replicas
        self.restarted_stages = 0
        self._drawn = 0

    @property
    def any(self) -> bool:
        return any(c.preemptible is not None for c in self.classes.specs)

    def start(self) -> None:
        for k, c in enumerate(self.classes.specs):
            pre = c.preemptible
            if pre is None:
                continue
            if pre.trace is not None:
                for t, index in pre.trace:
                    self._push(Preempt(t, self.classes.device(k, index), k, False))
            elif pre.rate_per_hour:
                for i in range(c.count):
                    self._draw(k, self.classes.device(k, i), 0.0)

    def _push(self, ev) -> None:
        self._drawn += 1
        if self._drawn <= MAX_PREEMPTIONS:
            self.world.push_event(ev)

    def _draw(self, k: int, device: int, after: float) -> None:
        rate = self.classes.specs[k].preemptible.rate_per_hour / 3600.0
        self._push(Preempt(after + float(self._rng[k].exponential(1.0 / rate)), device, k, True))

    def _finished(self) -> bool:
        return all(p.done for p in self.world.order)

    # ---- events -------------------------------------------------------------------------
    def on_preempt(self, ev: Preempt) -> None:
        w, d, k = self.world, ev.device, ev.cls
        if self._finished():
            return
        replace_s = self.classes.specs[k].preemptible.replace_s
        if d in self.down:  # already down: the replacement's own lifetime starts when it joins
            if ev.poisson:
                self._draw(k, d, self.down[d])
            return
        task = w.task.get(d)
        back_t = w.t + replace_s
        if task is None:
            w.take_down(d)
            self._went_down(k, d, back_t)
        elif task.kind == "replica" and task.replica in w.replicas:
            moved = w.lose_replica(w.replicas[task.replica], keep_tokens=self.recovery == "migrate")
            self.resumed_requests += len(moved)
            w.take_down(d)
            self._went_down(k, d, back_t)
        else:
            run = w.stage_run_on(d)
            if run is not None:
                w.restart_stage(run, d, back_t)
                self.restarted_stages += 1
                self._count_down(k, back_t)
            else:  # a weight sync, a stage run alongside, or a pending resize: preempt it when it ends
                p = w.pipelines.get(task.pipeline)
                end = None
                if p is not None:
                    end = w.alongside_end_t(p) if task.stage == p.alongside else w.running_stage_end_t(p)
                when = end if end is not None and end > w.t else w.t + _RETRY_S
                self.world.push_event(Preempt(when, d, k, ev.poisson))
                return
        if ev.poisson:
            self._draw(k, d, back_t)

    def _went_down(self, k: int, d: int, back_t: float) -> None:
        self._count_down(k, back_t)
        self.down[d] = back_t
        self.world.push_event(DeviceBack(back_t, d))

    def _count_down(self, k: int, back_t: float) -> None:
        self.count[k] += 1
        self.downtime[k].append((self.world.t, back_t))
        self._down_total[k] += back_t - self.world.t
        self._open[k].append(back_t)

    def on_back(self, ev: DeviceBack) -> None:
        if self.down.pop(ev.device, None) is not None:
            self.world.bring_up(ev.device)

    # ---- what a policy sees ---------------------------------------------------------------
    def seen(self, t: float) -> tuple:
        """``PreemptionsSeen`` of each class that has lost a device by ``t`` (what
        ``SchedulerState.preemptions`` carries): counts and device-seconds down so far, a
        down still open counted up to ``t``; never a preemption still to come."""
        from jigsaw_plugin.scheduler.state import PreemptionsSeen

        out = []
        for k, c in enumerate(self.classes.specs):
            if not self.count[k]:
                continue
            still = self._open[k] = [b for b in self._open[k] if b > t]
            down = self._down_total[k] - sum(b - t for b in still)
            out.append(PreemptionsSeen(k, self.count[k], max(0.0, c.count * t - down), down))
        return tuple(out)

    # ---- result ---------------------------------------------------------------------------
    def downtime_s(self, k: int, until: float) -> float:
        """Device-seconds class ``k`` was down before ``until`` (not billed)."""
        return sum(max(0.0, min(b, until) - a) for a, b in self.downtime[k] if a < until)

    def summary(self) -> dict:
        return {"recovery": self.recovery, "preemptions": int(sum(self.count)),
                "resumed_requests": self.resumed_requests, "restarted_stages": self.restarted_stages,
                "per_class": {c.name: n for c, n in zip(self.classes.specs, self.count)}}
