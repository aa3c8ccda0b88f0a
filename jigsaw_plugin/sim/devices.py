"""Device classes in the simulator: which class each device id belongs to, and prices by class.

The workload's classes (``ClusterSpec.device_classes()``) are laid out class by class over
device ids. Each class has its own cost model (its GPU profile), so a replica's decode
steps, KV capacity and a training gang's stages are priced on the devices they run on; a
gang that spans classes is priced at its slowest class (the others wait for it). A class
behind a wide-area ``link`` receives weights over it. A single-class workload keeps the
executor's own pricer untouched (the same numbers as before device classes existed).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceClasses", "ClassPricer", "ClassUsage"]


@dataclass(frozen=True)
class ClassUsage:
    """What one class cost in a run: provisioned device-hours (less preempted downtime)
    times its price; ``priced`` False when the spec gave no price (cost = device-hours)."""

    name: str
    gpu: str
    count: int
    device_hours: float
    price_per_hour: float | None
    preempted: int

    @property
    def cost(self) -> float:
        return self.device_hours * (self.price_per_hour if self.price_per_hour is not None else 1.0)

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "count": self.count, "device_hours": self.device_hours,
                "price_per_hour": self.price_per_hour, "cost": self.cost, "preemptions": self.preempted}


class DeviceClasses:
    """The run's device -> class map and one cost model per class."""

    def __init__(self, cluster, factors=None):
        from jigsaw_plugin.costmodel import CostModel, hardware_profile

        self.specs = cluster.device_classes()
        self.of: list[int] = [k for k, c in enumerate(self.specs) for _ in range(c.count)]
        self.first: list[int] = []
        start = 0
        for c in self.specs:
            self.first.append(start)
            start += c.count
        self.costs = [CostModel(hardware_profile(c.gpu, f"cluster.classes[{k}].gpu"), factors)
                      for k, c in enumerate(self.specs)]
        self.heterogeneous = len(self.specs) > 1

    def classes_of(self, devices) -> list[int]:
        return sorted({self.of[d] for d in devices})

    def device(self, cls: int, index: int) -> int:
        """The device id of the ``index``-th device of class ``cls``."""
        return self.first[cls] + index

    def cost_for(self, devices):
        """The cost model a gang runs at: its class with the least memory per device (a
        replica's KV cache is bounded by its smallest member)."""
        ks = self.classes_of(devices) or [0]
        return min((self.costs[k] for k in ks), key=lambda c: c.hw.memory_gb)

    def weight_pull_s(self, model, devices) -> float:
        """Moving one copy of a model's weights to ``devices`` over their classes' links
        (0 for classes in the trainer's data centre: the executor's weight sync prices those)."""
        worst = 0.0
        for k in self.classes_of(devices):
            link = self.specs[k].link
            if link is not None:
                worst = max(worst, link.transfer_s(model.weight_bytes))
        return worst


class ClassPricer:
    """``core.Pricer``'s interface, answered per class: each class has its own ``Pricer``
    (and cost model); a call on devices of several classes takes the slowest answer."""

    def __init__(self, classes: DeviceClasses, pm, models: dict):
        from jigsaw_plugin.core.pricing import Pricer

        self.classes = classes
        self._pricers = [Pricer(pm, cost, models) for cost in classes.costs]
        self.cost = classes.costs[0]

    def _each(self, devices):
        return [self._pricers[k] for k in (self.classes.classes_of(devices) or [0])]

    def decode_step_s(self, pipeline: str, devices: tuple, batch: int, kv_tokens: float) -> float:
        return max(p.decode_step_s(pipeline, devices, batch, kv_tokens) for p in self._each(devices))

    def prefill_s(self, pipeline: str, devices: tuple, tokens: float) -> float:
        return max(p.prefill_s(pipeline, devices, tokens) for p in self._each(devices))

    def context_switch_s(self, pipeline: str, devices: tuple, train_state: bool) -> float:
        return max(p.context_switch_s(pipeline, devices, train_state) for p in self._each(devices))

    def stage_s(self, pipeline: str, stage: str, devices: tuple, samples: int, tokens: float,
                colocated: bool = True, cross_node: bool = False) -> float:
        return max(p.stage_s(pipeline, stage, devices, samples, tokens, colocated, cross_node)
                   for p in self._each(devices))
