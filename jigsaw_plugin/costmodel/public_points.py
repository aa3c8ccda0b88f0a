"""Public measurements the efficiency factors are fitted to (docs/calibration.md).

Each point is one published figure, its source, the setup we read from the source (and the
assumptions we had to add, said as such), and the tolerance within which the fitted cost
model must reproduce it (tests/test_costmodel.py). ``predict`` prices a point's setup with
the cost model, so a point is checked against exactly the formulas the simulator uses.

The end-to-end verl table (one_step_off recipe, 16 H20) needs the simulator and lives in
``benchmarks/calibrate.py``; verl's fully_async documentation is never a point: it is the
held-out check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jigsaw_plugin.costmodel.predictor import CostModel, EfficiencyFactors
from jigsaw_plugin.costmodel.profiles import HARDWARE, HardwareProfile, ModelProfile

__all__ = ["PublicPoint", "PUBLIC_POINTS", "predict", "LLAMA31_8B", "A100_40GB"]

#: Llama-3.1-8B's published config.json (8.03B parameters, GQA with 8 KV heads).
LLAMA31_8B = ModelProfile("llama-3.1-8b", 8.03, 32, 4096, 8, 128, 128256)
#: Llama-2-7B (6.74B parameters, full multi-head attention).
LLAMA2_7B = ModelProfile("llama-2-7b", 6.74, 32, 4096, 32, 128, 32000)
#: KempnerForge's "7B Llama-3" (its exact parameter count is not published: 7.0B assumed).
KEMPNER_7B = ModelProfile("llama-3-style-7b", 7.0, 32, 4096, 8, 128, 128256)
#: A100 SXM 40 GB: 312 TFLOP/s bf16, 1.555 TB/s.
A100_40GB = HardwareProfile("a100-40gb", 312.0, 1.555, 40.0, link_gbps=300.0, internode_gbps=25.0)


@dataclass(frozen=True, slots=True)
class PublicPoint:
    """One published figure and the setup it was measured in.

    ``kind``: "decode_tpot" (ms per output token of a steady batch: ``batch`` sequences at
    ``context`` tokens each), "decode_throughput" (output tokens/s of one engine: ``batch``
    running sequences at mean ``context``, each request prefilling ``prompt`` tokens for
    ``output`` generated ones) or "train_tokens_per_gpu" (tokens/s per device of FSDP
    training: micro-batches of ``tokens_per_device`` on a gang of ``devices``).
    """

    name: str
    regime: str  # "decode batch 1", "decode saturated", "training"
    kind: str
    published: float
    unit: str
    tolerance: float  # relative: the fitted model must land within it
    source: str
    setup: str  # what the source says, then our assumptions (marked "assumed")
    hardware: HardwareProfile
    model: ModelProfile
    batch: int = 1
    context: float = 0.0
    prompt: float = 0.0
    output: float = 1.0
    devices: int = 1
    gpus_per_node: int = 8
    tokens_per_device: float = 4096.0
    recompute: bool = False


PUBLIC_POINTS: tuple[PublicPoint, ...] = (
    PublicPoint(
        "h100-llama8b-tpot-b1", "decode batch 1", "decode_tpot", 6.48, "ms/token", 0.15,
        "InferenceBench concurrency sweep, https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/ "
        "(vLLM 0.21.0, 1x H100-80GB-HBM3, table row conc=1: tpot_p50_ms 6.48)",
        "Llama-3.1-8B-Instruct fp16, one request at a time; context about 300 tokens (assumed: "
        "a short chat prompt)", HARDWARE["h100"], LLAMA31_8B, batch=1, context=300,
    ),
    PublicPoint(
        "h100-llama8b-tpot-b4", "decode batch 1", "decode_tpot", 6.59, "ms/token", 0.15,
        "same table, row conc=4: tpot_p50_ms 6.59",
        "4 concurrent requests, context about 300 tokens each (assumed)",
        HARDWARE["h100"], LLAMA31_8B, batch=4, context=300,
    ),
    PublicPoint(
        "a100-llama8b-tpot-b1", "decode batch 1", "decode_tpot", 13.3, "ms/token", 0.15,
        "J. Musgrave, 'vLLM throughput-latency sweep on NVIDIA A100', "
        "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on (vLLM 0.23.0, 1x A100 40GB: "
        "'decode at one request per time runs at about 75 tokens/sec')",
        "Llama-3.1-8B-Instruct bf16, 1024 input + 128 output tokens: mean context 1088",
        A100_40GB, LLAMA31_8B, batch=1, context=1088,
    ),
    PublicPoint(
        "h100-llama8b-saturated", "decode saturated", "decode_throughput", 12500.0, "tok/s", 0.20,
        "morphllm.com 'vLLM Benchmarks' throughput table, https://www.morphllm.com/vllm-benchmarks "
        "(Llama 3.1 8B BF16, 1x H100 80GB, ~12,500 output tok/s, FlashInfer, 0.8 GPU util)",
        "a ShareGPT-style offline run (assumed): 256 running sequences, mean 220 prompt and 200 "
        "output tokens per request, mean context 320 while decoding", HARDWARE["h100"], LLAMA31_8B,
        batch=256, context=320, prompt=220, output=200,
    ),
    PublicPoint(
        "a100-llama2-7b-fsdp-128", "training", "train_tokens_per_gpu", 3700.0, "tok/s/GPU", 0.15,
        "PyTorch blog (IBM and Meta), 'Maximizing training throughput using PyTorch FSDP' (2024): "
        "Llama-2 7B on 128 A100 80GB, 3,700 tokens/s per GPU, MFU 57%",
        "sequence length 4096; hybrid sharding inside each 8-GPU node (assumed), so the "
        "collectives run over NVLink; one 4096-token micro-batch per device (assumed)",
        HARDWARE["a100"], LLAMA2_7B, devices=8, tokens_per_device=4096,
    ),
    PublicPoint(
        "h200-7b-1gpu", "training", "train_tokens_per_gpu", 10471.0, "tok/s/GPU", 0.15,
        "KempnerForge benchmarks, https://kempnerinstitute.github.io/KempnerForge/reference/benchmarks.html "
        "('Best MFU by GPU count': 1 GPU, 7B, 57.8% MFU, 10,471 tok/s)",
        "bf16, full activation checkpointing, seq_len 4096; one sequence per micro-batch (assumed)",
        HARDWARE["h200"], KEMPNER_7B, devices=1, gpus_per_node=4, tokens_per_device=4096, recompute=True,
    ),
    PublicPoint(
        "h200-7b-fsdp4", "training", "train_tokens_per_gpu", 38983.0 / 4, "tok/s/GPU", 0.15,
        "same table: 4 GPUs, 7B FSDP=4, 53.8% MFU, 38,983 tok/s",
        "one node of 4 H200 (NVLink)", HARDWARE["h200"], KEMPNER_7B, devices=4, gpus_per_node=4,
        tokens_per_device=4096, recompute=True,
    ),
    PublicPoint(
        "h200-7b-fsdp32", "training", "train_tokens_per_gpu", 10471.0 * 26.9 / 57.8, "tok/s/GPU", 0.25,
        "same page: 'At 32 GPUs the 7B model ... hits 26.9% MFU' (tokens/s scaled from the 1-GPU "
        "row by the MFU ratio)",
        "8 nodes x 4 H200, InfiniBand between nodes; one 400 Gb/s NIC per GPU (assumed)",
        HARDWARE["h200"], KEMPNER_7B, devices=32, gpus_per_node=4, tokens_per_device=4096, recompute=True,
    ),
)


def predict(point: PublicPoint, factors: EfficiencyFactors) -> float:
    """The cost model's value of ``point``'s figure, in the point's unit."""
    f = dataclasses.replace(factors, gpus_per_node=point.gpus_per_node, recompute=point.recompute)
    cost = CostModel(point.hardware, f)
    m = point.model
    if point.kind == "decode_tpot":
        return 1e3 * cost.decode_step_s(m, 1, point.batch, point.batch * point.context)
    if point.kind == "decode_throughput":
        per_token = cost.decode_step_s(m, 1, point.batch, point.batch * point.context) / point.batch
        per_token += cost.prefill_s(m, 1, point.prompt) / point.output  # the prefill / decode mix
        return 1.0 / per_token
    if point.kind == "train_tokens_per_gpu":
        return point.tokens_per_device / cost.micro_batch_s(m, point.devices, point.tokens_per_device, backward=True)
    raise ValueError(f"unknown point kind {point.kind!r}")
