"""jigsaw's own features as ordinary plugins (pytest's model): the scheduler and the cost
model answer ``jigsaw_schedule`` and ``jigsaw_predict_duration`` like any third-party
plugin would, so a plugin registered with ``tryfirst=True`` can override either."""

from __future__ import annotations

from jigsaw_plugin.algorithms import FORWARD_STAGES, UPDATE_STAGES
from jigsaw_plugin.costmodel.predictor import node_counts, spans_extra_nodes
from jigsaw_plugin.hookspecs import hookimpl

__all__ = ["SchedulerPlugin", "CostModelPlugin"]


class SchedulerPlugin:
    """Answers ``jigsaw_schedule`` with a pure policy's decisions."""

    def __init__(self, policy):
        self.policy = policy

    @hookimpl
    def jigsaw_schedule(self, state):
        return self.policy.decide(state)


class CostModelPlugin:
    """Answers ``jigsaw_predict_duration`` for training stages, prefill, decode steps,
    context switches and weight sync.

    ``models`` maps pipeline names to model profiles; kinds it does not price return
    ``None`` so that another plugin may. ``nodes``: the node of each device id
    (``ClusterSpec.device_nodes``; None: device ``d`` on node ``d // gpus_per_node``).
    """

    def __init__(self, cost, models: dict, nodes: tuple[int, ...] | None = None):
        self.cost = cost
        self.models = models
        self.nodes = nodes

    @hookimpl
    def jigsaw_predict_duration(self, kind, pipeline, sizes, devices):
        model = self.models.get(pipeline)
        if model is None:
            return None
        n = max(1, len(devices))
        tokens = float(sizes.get("tokens", 0))
        if kind in FORWARD_STAGES or kind in UPDATE_STAGES:
            # the layouts the gang's placement allows (hybrid sharding needs node-local groups)
            price = self.cost.forward_s if kind in FORWARD_STAGES else self.cost.train_s
            return price(model, n, tokens, nodes=node_counts(devices, self.cost.f.gpus_per_node, self.nodes))
        if kind in ("prefill", "migration"):
            return self.cost.prefill_s(model, n, tokens)
        if kind == "weight_sync":
            return self.cost.weight_sync_s(model, colocated=bool(sizes.get("colocated", True)),
                                           cross_node=bool(sizes.get("cross_node", False)))
        if kind == "context_switch":
            return self.cost.context_switch_s(model, n, train_state=bool(sizes.get("train_state", False)))
        if kind == "decode_step":
            return self.cost.decode_step_s(model, n, int(sizes.get("batch", 1)), float(sizes.get("kv_tokens", 0)),
                                           cross_node=spans_extra_nodes(devices, self.cost.f.gpus_per_node, self.nodes))
        return None
