"""Cost model: profiles, roofline shape, memory as a hard limit, bad profiles."""

import pytest

from jigsaw_plugin.costmodel import CostModel, EfficiencyFactors, hardware_profile, model_profile
from jigsaw_plugin.errors import SpecError


@pytest.fixture
def h100():
    return CostModel(hardware_profile("h100"))


def test_profiles_match_design_figures():
    for name, flops, bw, mem in [("h100", 989, 3.35, 80), ("h200", 989, 4.8, 141), ("h800", 989, 3.35, 80),
                                 ("h20", 148, 4.0, 96), ("a100", 312, 2.0, 80)]:
        hw = hardware_profile(name)
        assert (hw.flops_tflops, hw.hbm_tbps, hw.memory_gb) == (flops, bw, mem)


def test_qwen7b_kv_bytes_per_token_is_about_57kb():
    assert model_profile("qwen2.5-7b").kv_bytes_per_token == pytest.approx(57344)


def test_kv_cache_is_a_hard_limit(h100):
    m = model_profile("qwen2.5-7b")
    cap = h100.kv_capacity_tokens(m, 1)
    # DESIGN.md 7: 8 H100 replicas cannot hold 2,048 sequences of 10K tokens at once
    assert 8 * cap < 2048 * 10_000
    assert h100.kv_capacity_tokens(m, 2) > 2 * cap  # weights split over tp leave more room
    # another pipeline's resident weights shrink the cache
    assert h100.kv_capacity_tokens(m, 1, other_bytes=m.weight_bytes) < cap
    assert h100.kv_capacity_tokens(model_profile("qwen2.5-72b"), 1) == 0  # does not fit


def test_decode_is_memory_bound_small_batch_compute_bound_large(h100):
    m = model_profile("qwen2.5-7b")
    one = h100.decode_step_s(m, 1, 1, 1000)
    sixteen = h100.decode_step_s(m, 1, 16, 16_000)
    assert sixteen < 1.2 * one  # batching is nearly free while memory-bound
    big = h100.decode_step_s(m, 1, 4096, 100_000)
    assert big > 3 * one  # compute-bound at large batch
    assert h100.decode_step_s(m, 2, 1, 1000) < one  # tensor parallel splits the weight reads


def test_training_scales_with_devices_and_recompute_costs_more(h100):
    m = model_profile("qwen2.5-7b")
    t8, t16 = h100.train_s(m, 8, 1e6), h100.train_s(m, 16, 1e6)
    f = h100.f.train_stage_overhead_s
    assert (t8 - f) == pytest.approx(2 * (t16 - f))
    rc = CostModel(hardware_profile("h100"), EfficiencyFactors(recompute=True))
    assert rc.train_s(m, 8, 1e6) > t8
    assert h100.train_s(m, 8, 1e9) > 2.5 * h100.forward_s(m, 8, 1e9)


def test_links_and_switches_are_bytes_over_bandwidth(h100):
    m = model_profile("qwen2.5-7b")
    assert h100.weight_sync_s(m, colocated=False, cross_node=True) > h100.weight_sync_s(m, colocated=True, cross_node=False)
    assert h100.context_switch_s(m, 1, train_state=True) == pytest.approx(8 * h100.context_switch_s(m, 1, train_state=False))
    assert h100.migration_s(m, 1, 10_000) == pytest.approx(h100.prefill_s(m, 1, 10_000))


def test_custom_profiles_and_errors():
    hw = hardware_profile({"flops_tflops": 100, "hbm_tbps": 1, "memory_gb": 40, "link_gbps": 100})
    assert hw.memory_gb == 40
    with pytest.raises(SpecError, match="cluster.gpu.hbm_tbps"):
        hardware_profile({"flops_tflops": 100})
    with pytest.raises(SpecError, match="h100"):
        hardware_profile("tpu")
    with pytest.raises(SpecError, match="qwen2.5-7b"):
        model_profile("llama-7b")
    m = model_profile({"params_b": 3, "layers": 20, "hidden": 2048, "kv_heads": 4, "head_dim": 64, "vocab": 32000})
    assert m.default_tp == 1


def test_tiny_model_fits_one_cpu_core_device():
    cpu = CostModel(hardware_profile("cpu"))
    assert cpu.kv_capacity_tokens(model_profile("tiny-qwen2"), 1) > 100_000
