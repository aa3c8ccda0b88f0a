"""Every duration an executor charges is priced through ``jigsaw_predict_duration``.

The built-in cost model answers the hook as an ordinary plugin (``builtin.CostModelPlugin``);
a plugin registered with ``tryfirst=True`` overrides it for the kinds it prices. When the
built-in plugin is the hook's only implementation (checked when the run starts), the
pricer calls the cost model directly: the same numbers without pluggy's per-call cost on
the simulator's hottest path (a decode step is priced at every replica event).
"""

from __future__ import annotations

from jigsaw_plugin.builtin import CostModelPlugin
from jigsaw_plugin.costmodel.predictor import spans_extra_nodes

__all__ = ["Pricer"]


class Pricer:
    def __init__(self, pm, cost, models: dict, nodes: tuple[int, ...] | None = None):
        self.cost = cost
        self._models = models  # pipeline name -> ModelProfile
        self._nodes = nodes  # device id -> node (ClusterSpec.device_nodes); None: d // gpus_per_node
        self._plugin = CostModelPlugin(cost, models, nodes)
        self._hook = pm.hook.jigsaw_predict_duration
        impls = self._hook.get_hookimpls()
        self._direct = len(impls) == 1 and isinstance(impls[0].plugin, CostModelPlugin)
        self._cross: dict[tuple, bool] = {}  # a replica's devices -> whether they straddle nodes

    def _cross_node(self, devices: tuple) -> bool:
        """``spans_extra_nodes`` of a replica's devices, once per device set (a decode step
        is priced at every replica event; a replica's devices never change)."""
        got = self._cross.get(devices)
        if got is None:
            got = self._cross[devices] = spans_extra_nodes(devices, self.cost.f.gpus_per_node, self._nodes)
        return got

    def _ask(self, kind: str, pipeline: str, sizes: dict, devices: tuple) -> float:
        value = self._hook(kind=kind, pipeline=pipeline, sizes=sizes, devices=devices)
        if value is None:
            raise RuntimeError(f"no plugin priced {kind!r} for pipeline {pipeline!r}")
        return float(value)

    def decode_step_s(self, pipeline: str, devices: tuple, batch: int, kv_tokens: float) -> float:
        if self._direct:
            return self.cost.decode_step_s(self._models[pipeline], len(devices), batch, kv_tokens,
                                           self._cross_node(devices))
        return self._ask("decode_step", pipeline, {"batch": batch, "kv_tokens": kv_tokens}, devices)

    def decode_step_parts(self, pipeline: str, devices: tuple, batch: int, kv_tokens: float):
        """``decode_step_s`` in the cost model's terms (``CostModel.decode_step_parts``), or
        None where a plugin prices the step: its total says nothing of its parts."""
        if not self._direct:
            return None
        return self.cost.decode_step_parts(self._models[pipeline], len(devices), batch, kv_tokens,
                                           self._cross_node(devices))

    def prefill_s(self, pipeline: str, devices: tuple, tokens: float) -> float:
        if self._direct:
            return self.cost.prefill_s(self._models[pipeline], len(devices), tokens)
        return self._ask("prefill", pipeline, {"tokens": tokens}, devices)

    def context_switch_s(self, pipeline: str, devices: tuple, train_state: bool) -> float:
        if self._direct:
            return self.cost.context_switch_s(self._models[pipeline], len(devices), train_state)
        return self._ask("context_switch", pipeline, {"train_state": train_state}, devices)

    def stage_s(self, pipeline: str, stage: str, devices: tuple, samples: int, tokens: float,
                colocated: bool = True, cross_node: bool = False) -> float:
        """A training-side stage (forward passes, updates, weight sync) on ``devices``."""
        sizes = {"samples": samples, "tokens": tokens, "colocated": colocated, "cross_node": cross_node}
        if self._direct:
            return self._plugin.jigsaw_predict_duration(stage, pipeline, sizes, devices)
        return self._ask(stage, pipeline, sizes, devices)
