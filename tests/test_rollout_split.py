"""Where a rollout's device-seconds go (``gap_breakdown["rollout"]``): decode steps bound by
their HBM reads (too few sequences for the devices' compute), decode steps bound by their
FLOPs, prefill, time held with no request, and the rest; of the decode, the engines'
host-side step work and the tensor-parallel all-reduces; and the cost model's
``decode_memory_bound`` that tells the two decode regimes apart."""

import pytest

from jigsaw_plugin.costmodel import CostModel, model_profile
from jigsaw_plugin.costmodel.profiles import hardware_profile
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim.engine import Simulation
from sim_helpers import small_workload


def _h100() -> CostModel:
    return CostModel.for_nodes(hardware_profile("h100"), 8)


def test_a_decode_step_is_memory_bound_below_its_batch_knee_and_with_long_contexts():
    cost, m = _h100(), model_profile("qwen2.5-7b")
    bound = [cost.decode_memory_bound(m, b, 0.0) for b in range(1, cost.f.max_num_seqs + 1)]
    knee = bound.index(False)
    # one knee: every batch below it reads more than it computes, every batch above computes
    assert knee > 1 and not any(bound[knee:]) and all(bound[:knee])
    # where the step is memory-bound, its price is the memory term (plus the fixed step cost)
    mem = m.weight_bytes / (cost.hw.hbm_bytes_per_s * cost.f.decode_bw_eff)
    assert cost.decode_step_s(m, 1, 1, 0.0) == pytest.approx(cost.f.decode_step_overhead_s + mem)
    # the regime is the larger of decode_step_s's two terms, over batches and contexts
    read = cost.hw.hbm_bytes_per_s * cost.f.decode_bw_eff
    for b in (1, 3, 8, 40, 96, 200, 512, 1024):
        for kv in (0.0, 1e4, 1e5, 1e6, 4e6):
            mem_s = (m.weight_bytes + kv * m.kv_bytes_per_token) / read
            priced = cost.decode_step_s(m, 1, b, kv) - cost.f.decode_step_overhead_s
            assert cost.decode_memory_bound(m, b, kv) == (priced == pytest.approx(mem_s, rel=1e-12)), (b, kv)
    # a long context's KV reads make a batch past the knee memory-bound again
    assert not cost.decode_memory_bound(m, 256, 0.0)
    assert cost.decode_memory_bound(m, 256, 256 * 4096.0)


def _split(wl, policy: str, **opts) -> dict:
    r = Simulation(wl, get_policy(policy, **opts), seed=0).run()
    return r["gap_breakdown"]


def test_a_lone_request_decodes_memory_bound_only():
    wl = small_workload(gpus=1, pipelines=1, prompts=1, samples=1, steps=1, agentic=(False,),
                        algorithms=("grpo",), modes=("sync",), median=500)
    got = _split(wl, "verl-sync")["rollout"]
    assert got["decode_memory_bound_device_s"] > 0.0
    assert got["decode_compute_bound_device_s"] == 0.0
    assert got["by_width"]["1"]["decode_memory_bound_device_s"] == pytest.approx(got["decode_memory_bound_device_s"])


def test_a_replica_waiting_on_tool_calls_is_held_empty():
    # agentic trajectories between turns leave their replica with no request: the time it
    # is held so is "empty", not decode; a single-turn pipeline whose last replica holds its
    # last response is never empty
    agent = small_workload(gpus=1, pipelines=1, prompts=2, samples=2, steps=1, agentic=(True,),
                           algorithms=("grpo",), modes=("sync",), median=50)
    single = small_workload(gpus=1, pipelines=1, prompts=1, samples=1, steps=1, agentic=(False,),
                            algorithms=("grpo",), modes=("sync",), median=500)
    assert _split(agent, "verl-sync")["rollout"]["empty_device_s"] > 0.5
    assert _split(single, "verl-sync")["rollout"]["empty_device_s"] == pytest.approx(0.0, abs=1e-9)


def test_a_full_batch_decodes_mostly_compute_bound():
    # responses capped at 400 tokens: a short tail, most tokens decoded at large batches
    wl = small_workload(gpus=1, pipelines=1, prompts=256, samples=4, steps=1, agentic=(False,),
                        algorithms=("grpo",), modes=("sync",), median=200, max_len=400)
    got = _split(wl, "verl-sync")["rollout"]
    assert got["decode_compute_bound_device_s"] > max(0.0, got["decode_memory_bound_device_s"])
    # a batch decoding at its largest batch runs near its ideal
    assert got["decode_compute_bound_device_s"] < 2.0 * got["ideal_decode_device_s"]


@pytest.mark.parametrize("policy,opts", [("verl-sync", {}), ("jigsaw", {}), ("jigsaw", {"colocate": True})])
def test_the_split_accounts_for_no_more_than_the_replicas_held(policy, opts):
    # jigsaw migrates (re-prefill), widens tails (other widths) and, with colocate, pairs
    # replicas on one device (only the replica holding the devices' record counts)
    wl = small_workload(gpus=8, pipelines=2, prompts=16, samples=4, steps=2, median=600)
    gap = _split(wl, policy, **opts)
    got = gap["rollout"]
    recorded = (got["decode_memory_bound_device_s"] + got["decode_compute_bound_device_s"] + got["prefill_device_s"]
                + got["empty_device_s"])
    assert recorded > 0.0 and got["other_device_s"] >= -1e-6
    widths = got["by_width"].values()
    for key in ("decode_memory_bound_device_s", "decode_compute_bound_device_s", "prefill_device_s",
                "empty_device_s"):
        assert sum(w[key] for w in widths) == pytest.approx(got[key])
    # the ideal is split, not added to
    assert got["ideal_decode_device_s"] > 0.0 and got["ideal_prefill_device_s"] > 0.0


def test_an_executor_that_records_no_rollout_time_reports_no_split():
    # a live executor's engines do not report each step's batch: its result has no split,
    # rather than one made up
    from types import SimpleNamespace

    from jigsaw_plugin.core.bounds import Bounds, rollout_split

    bounds = Bounds(10.0, 1.0, 1.0, 1.0, 4.0, 6.0, 1.0)
    assert rollout_split(SimpleNamespace(), bounds, 5.0) is None
    got = rollout_split(SimpleNamespace(rollout_time={1: [1.0, 2.0, 0.5, 0.25]}), bounds, 5.0)
    assert got["ideal_decode_device_s"] == 3.0 and got["other_device_s"] == pytest.approx(1.25)
    assert got["decode_host_device_s"] is None  # a record without the decode's parts


def test_a_decode_step_is_its_host_work_roofline_and_all_reduces():
    # the three parts sum to the step's price exactly (in its order), whatever the width
    cost = _h100()
    for name in ("qwen2.5-7b", "qwen2.5-32b"):
        m = model_profile(name)
        for tp in (1, 2, 4, 8):
            for b, kv in ((1, 0.0), (7, 3e4), (256, 1e6)):
                parts = cost.decode_step_parts(m, tp, b, kv)
                assert parts.total_s == cost.decode_step_s(m, tp, b, kv)
                assert parts.host_s == cost.f.decode_step_overhead_s
                assert (parts.allreduce_s == 0.0) == (tp == 1)
    assert cost.decode_step_parts(model_profile("qwen2.5-7b"), 1, 0, 0.0).total_s == 0.0


def test_the_decodes_host_work_and_all_reduces_are_recorded_as_parts_of_it():
    # a lone request on one device: every decode step is its host work plus the weight
    # reads (its KV a few MB): the host part is the step's overhead share of the decode
    lone = small_workload(gpus=1, pipelines=1, prompts=1, samples=1, steps=1, agentic=(False,),
                          algorithms=("grpo",), modes=("sync",), median=500)
    got = _split(lone, "verl-sync")["rollout"]
    cost, m = _h100(), model_profile(lone.pipelines[0].model)
    share = cost.f.decode_step_overhead_s / cost.decode_step_s(m, 1, 1, 0.0)
    assert got["decode_host_device_s"] == pytest.approx(share * got["decode_memory_bound_device_s"], rel=0.02)
    assert got["decode_allreduce_device_s"] == 0.0
    # jigsaw re-shards tails onto wider replicas: their steps run all-reduces, and both
    # parts stay within the decode they are parts of, width by width
    wl = small_workload(gpus=8, pipelines=2, prompts=16, samples=4, steps=2, median=600)
    got = _split(wl, "jigsaw")["rollout"]
    assert got["decode_host_device_s"] > 0.0 and got["decode_allreduce_device_s"] > 0.0
    for tp, w in got["by_width"].items():
        decode = w["decode_memory_bound_device_s"] + w["decode_compute_bound_device_s"]
        assert w["decode_host_device_s"] + w["decode_allreduce_device_s"] <= decode + 1e-6
        assert (w["decode_allreduce_device_s"] > 0.0) == (tp != "1" and decode > 0.0)
    for key in ("decode_host_device_s", "decode_allreduce_device_s"):
        assert sum(w[key] for w in got["by_width"].values()) == pytest.approx(got[key])


def test_a_decode_priced_by_a_plugin_has_no_parts():
    # a plugin's price is a total: its host work and all-reduces are not known, and the
    # split says so (None) rather than the cost model's guess
    from jigsaw_plugin.hookspecs import hookimpl
    from jigsaw_plugin.manager import get_plugin_manager, register

    class Decode:
        @hookimpl(tryfirst=True)
        def jigsaw_predict_duration(self, kind, pipeline, sizes, devices):
            return 0.01 if kind == "decode_step" else None

    wl = small_workload(gpus=1, pipelines=1, prompts=1, samples=1, steps=1, agentic=(False,),
                        algorithms=("grpo",), modes=("sync",), median=500)
    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, Decode(), "decode")
    got = Simulation(wl, get_policy("verl-sync"), seed=0, pm=pm).run()["gap_breakdown"]["rollout"]
    assert got["decode_memory_bound_device_s"] > 0.0
    assert got["decode_host_device_s"] is None and got["decode_allreduce_device_s"] is None
    assert got["by_width"]["1"]["decode_host_device_s"] is None
