"""Pricing of two pipelines' rollout replicas co-located on one device group: the decode
step of each while the other decodes too, and the split of the KV room their weights
leave (docs/colocation.md). Pure functions of the cost model: the simulator prices a pair
with them and the jigsaw policy weighs a co-location with the same figures
(``scheduler/colocation.py``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["colocated_step_s", "KvSplit", "split_kv"]


def colocated_step_s(own_alone_s: float, other_alone_s: float, overhead_s: float) -> float:
    """One decode step of a replica while the replica sharing its devices decodes too.

    Each step alone costs ``overhead_s`` of host-side work (the engine's scheduler, sampler
    and launches: the cost model's ``decode_step_overhead_s``) plus its GPU work (weight
    and KV reads, FLOPs, tensor-parallel all-reduces). Two engines' kernels do not run
    concurrently on one GPU (separate processes are time-sliced), so their GPU work adds;
    each engine's host-side part overlaps the other's GPU work. In steady state both step
    once per ``max(gpu_own + gpu_other, own_alone, other_alone)``."""
    if other_alone_s <= 0.0:
        return own_alone_s
    if own_alone_s <= 0.0:
        return 0.0
    gpu_own = max(0.0, own_alone_s - overhead_s)
    gpu_other = max(0.0, other_alone_s - overhead_s)
    return max(gpu_own + gpu_other, own_alone_s, other_alone_s)


@dataclass(frozen=True, slots=True)
class KvSplit:
    """The KV caches of a co-located pair: per-device bytes each must treat as taken by the
    other (``other_bytes`` of ``CostModel.kv_capacity_tokens``) and the capacities that gives."""

    host_other_bytes: float
    guest_other_bytes: float
    host_tokens: int
    guest_tokens: int


def split_kv(cost, host_model, guest_model, tp: int, guest_share: float) -> KvSplit:
    """Both weights resident on ``tp`` devices; the KV room left is split ``guest_share`` to
    the guest, the rest to the host. Each side's ``other_bytes`` is the other's weights plus
    the other's part of the room, so ``kv_capacity_tokens`` sizes each cache."""
    host_w = host_model.weight_bytes / tp
    guest_w = guest_model.weight_bytes / tp
    # the room left per device once both weights are in (bytes): from the host's capacity
    # with the guest's weights taken
    room = cost.kv_capacity_tokens(host_model, tp, guest_w) * host_model.kv_bytes_per_token / tp
    host_other = guest_w + guest_share * room
    guest_other = host_w + (1.0 - guest_share) * room
    return KvSplit(host_other, guest_other, cost.kv_capacity_tokens(host_model, tp, host_other),
                   cost.kv_capacity_tokens(guest_model, tp, guest_other))
