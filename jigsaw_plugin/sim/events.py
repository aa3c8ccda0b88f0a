"""Simulator events: one small class per kind; ``handle`` returns follow-up events.

Simultaneous events are ordered by (time, priority, sequence number): devices are freed
before replicas advance, replicas advance before samples move on, so that a policy
called after a batch of simultaneous events sees all of them.
"""

from __future__ import annotations

__all__ = ["Event", "StageDone", "MicroBatchDone", "ReplicaTick", "ToolDone", "RewardDone"]


class Event:
    priority = 9
    background = False  # True: dropped once every pipeline has finished (sim.preemption)
    __slots__ = ("t",)

    def __init__(self, t: float):
        self.t = t

    def handle(self, world) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class StageDone(Event):
    """A training-side stage (or weight sync) finished: its devices are free."""

    priority = 0
    __slots__ = ("pipeline", "step", "stage", "devices")

    def __init__(self, t, pipeline, step, stage, devices):
        super().__init__(t)
        self.pipeline, self.step, self.stage, self.devices = pipeline, step, stage, devices

    def handle(self, world) -> None:
        world.on_stage_done(self)


class MicroBatchDone(Event):
    """A micro-batch of a training stage finished: the stage may resize here."""

    priority = 0
    __slots__ = ("pipeline", "epoch")

    def __init__(self, t, pipeline, epoch):
        super().__init__(t)
        self.pipeline, self.epoch = pipeline, epoch

    def handle(self, world) -> None:
        world.on_micro_batch_done(self)


class ReplicaTick(Event):
    """A replica's next finish, full cache or segment end (stale if the epoch moved on)."""

    priority = 1
    __slots__ = ("replica", "epoch")

    def __init__(self, t, replica, epoch):
        super().__init__(t)
        self.replica, self.epoch = replica, epoch

    def handle(self, world) -> None:
        if self.epoch == self.replica.tick_epoch:
            world.on_replica_tick(self.replica)


class ToolDone(Event):
    """A tool call returned: the sample's next turn is submitted."""

    priority = 2
    __slots__ = ("request",)

    def __init__(self, t, request):
        super().__init__(t)
        self.request = request

    def handle(self, world) -> None:
        world.on_tool_done(self.request)


class RewardDone(Event):
    """A sample's reward is computed: it is ready for training."""

    priority = 3
    __slots__ = ("pipeline", "step", "version", "latency_s")

    def __init__(self, t, pipeline, step, version, latency_s):
        super().__init__(t)
        self.pipeline, self.step, self.version = pipeline, step, version
        self.latency_s = latency_s  # from the trajectory's last token

    def handle(self, world) -> None:
        world.on_reward_done(self)
