"""Device classes in the simulator: which class each device id belongs to, and prices by class.

The workload's classes (``ClusterSpec.device_classes()``) are laid out class by class over
device ids. Each class has its own cost model (its GPU profile), so a replica's decode
steps, KV capacity and a training gang's stages are priced on the devices they run on; a
gang that spans classes is priced at its slowest class (the others wait for it). A class
behind a wide-area ``link`` receives weights over it. A single-class workload keeps the
executor's own pricer untouched (the same numbers as before device classes existed).
"""

from __future__ import annotations

__all__ = ["DeviceClasses", "ClassPricer", "wan_dissemination_s"]


class DeviceClasses:
    """The run's device -> class map and one cost model per class."""

    def __init__(self, cluster, factors=None):
        from jigsaw_plugin.costmodel import CostModel

        self.specs = cluster.device_classes()
        self.of: list[int] = [k for k, c in enumerate(self.specs) for _ in range(c.count)]
        self.first: list[int] = []
        start = 0
        for c in self.specs:
            self.first.append(start)
            start += c.count
        self.costs = CostModel.of_classes(cluster, factors)
        self.heterogeneous = len(self.specs) > 1
        self.nodes = cluster.device_nodes()  # device id -> node, each class in nodes of its own size
        self._views: tuple | None = None

    def views(self) -> tuple:
        """The classes as ``DeviceClassView``s (what ``SchedulerState.classes`` carries)."""
        if self._views is None:
            from jigsaw_plugin.scheduler.state import DeviceClassView

            self._views = tuple(
                DeviceClassView(k, c.name, c.gpu if isinstance(c.gpu, str) else str(c.gpu.get("name", "custom")),
                                range(self.first[k], self.first[k] + c.count), self.costs[k], c.price_per_hour,
                                c.preemptible is not None, c.link, c)
                for k, c in enumerate(self.specs))
        return self._views

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

    def weight_pull_s(self, model, replicas) -> float:
        """Getting one version of a model's weights to ``replicas`` (each a tuple of device
        ids) in classes behind a wide-area link: per class, the cheapest of the dissemination
        strategies as ``costmodel.dissemination`` prices them (naive, ECHO-2's chain, RLAX's
        pull) over the class's link with GPU hops; the slowest class decides. 0 when no
        replica is behind a link (the executor's weight sync prices those)."""
        count: dict[int, int] = {}
        for devs in replicas:
            remote = [k for k in self.classes_of(devs) if self.specs[k].link is not None]
            if remote:
                k = max(remote, key=lambda k: self.specs[k].link.transfer_s(model.weight_bytes))
                count[k] = count.get(k, 0) + 1
        return max((wan_dissemination_s(self.specs[k], model, n) for k, n in count.items()), default=0.0)


def wan_dissemination_s(spec, model, replicas: int) -> float:
    """One version of ``model``'s weights to ``replicas`` replicas of device class ``spec``
    over its link: the cheapest strategy of ``costmodel.dissemination``, GPU hops."""
    from jigsaw_plugin.costmodel.dissemination import dissemination_price, gpu_hop
    from jigsaw_plugin.runtime.dissemination.spec import STRATEGIES, DisseminationSpec
    from jigsaw_plugin.runtime.dissemination.spec import LinkSpec as WanLink

    link = spec.link
    wan = WanLink(bandwidth_bytes_s=link.bytes_per_s, latency_s=link.latency_ms / 1e3)
    hop = gpu_hop(spec.gpu, "internode")
    return min(dissemination_price(DisseminationSpec(s, link=wan), int(model.weight_bytes), max(1, replicas),
                                   hop=hop).seconds for s in STRATEGIES)


class ClassPricer:
    """``core.Pricer``'s interface, answered per class: each class has its own ``Pricer``
    (and cost model); a call on devices of several classes takes the slowest answer."""

    def __init__(self, classes: DeviceClasses, pm, models: dict):
        from jigsaw_plugin.core.pricing import Pricer

        self.classes = classes
        self._pricers = [Pricer(pm, cost, models, classes.nodes) for cost in classes.costs]
        self.cost = classes.costs[0]

    def _each(self, devices):
        return [self._pricers[k] for k in (self.classes.classes_of(devices) or [0])]

    def decode_step_s(self, pipeline: str, devices: tuple, batch: int, kv_tokens: float) -> float:
        return max(p.decode_step_s(pipeline, devices, batch, kv_tokens) for p in self._each(devices))

    def decode_step_parts(self, pipeline: str, devices: tuple, batch: int, kv_tokens: float):
        """The parts of the slowest class's step (``decode_step_s``'s answer), or None where a
        plugin priced one."""
        parts = [p.decode_step_parts(pipeline, devices, batch, kv_tokens) for p in self._each(devices)]
        if any(x is None for x in parts):
            return None
        return max(parts, key=lambda x: x.total_s)

    def prefill_s(self, pipeline: str, devices: tuple, tokens: float) -> float:
        return max(p.prefill_s(pipeline, devices, tokens) for p in self._each(devices))

    def context_switch_s(self, pipeline: str, devices: tuple, train_state: bool) -> float:
        return max(p.context_switch_s(pipeline, devices, train_state) for p in self._each(devices))

    def stage_s(self, pipeline: str, stage: str, devices: tuple, samples: int, tokens: float,
                colocated: bool = True, cross_node: bool = False) -> float:
        return max(p.stage_s(pipeline, stage, devices, samples, tokens, colocated, cross_node)
                   for p in self._each(devices))
