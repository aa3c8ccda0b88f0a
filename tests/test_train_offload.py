"""Training state on the host (``pipelines[i].train_offload``): what an update must hold on
its gang, what offload costs, and that every executor and policy honours it."""

import pytest

from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile, with_train_offload
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.algorithms import UPDATE_STAGES
from jigsaw_plugin.workload import parse_workload
from tests.sim_helpers import small_workload

H100 = CostModel.for_nodes(hardware_profile("h100"), 8)


def _m(name, offload):
    return with_train_offload(model_profile(name), offload)


def test_the_spec_takes_where_the_training_state_lives():
    wl = small_workload(pipelines=2, train_offload=("optimizer", "full"))
    assert [p.train_offload for p in wl.pipelines] == ["optimizer", "full"]
    assert parse_workload(wl.to_dict()).pipelines[1].train_offload == "full"  # round trip
    assert small_workload(pipelines=1).pipelines[0].train_offload == "none"
    assert "train_offload" not in small_workload(pipelines=1).to_dict()["pipelines"][0]
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.train_offload.*'disk'.*none \| optimizer \| full"):
        small_workload(pipelines=1, train_offload=("disk",))


@pytest.mark.parametrize("name, none, optimizer, full", [("qwen2.5-7b", 2, 1, 1), ("qwen2.5-32b", 8, 2, 1),
                                                          ("qwen2.5-72b", 17, 5, 1)])
def test_offload_lowers_the_fewest_devices_an_update_fits_on(name, none, optimizer, full):
    # none: 16 bytes a parameter on the gang; optimizer: bf16 weights + grads (4); full: streamed
    assert [H100.min_gang(_m(name, o), update=True) for o in ("none", "optimizer", "full")] == [none, optimizer, full]
    # a forward pass holds the bf16 weights unless they live on the host
    assert H100.min_gang(_m(name, "optimizer"), update=False) == H100.min_gang(_m(name, "none"), update=False)
    assert H100.min_gang(_m(name, "full"), update=False) == 1


def test_offload_costs_host_time_that_a_wider_gang_spreads():
    tokens = 6e6
    none, opt, full = (_m("qwen2.5-7b", o) for o in ("none", "optimizer", "full"))
    # the host optimizer step adds time at every width; per device it shrinks with the gang
    for w in (2, 8, 16):
        assert H100.train_s(opt, w, tokens) > H100.train_s(none, w, tokens)
        assert H100.train_s(full, w, tokens) > H100.train_s(none, w, tokens)
    assert H100.host_step_s(opt, 8) == pytest.approx(H100.host_step_s(opt, 1) / 8)
    assert H100.host_step_s(none, 8) == 0.0 and H100.host_stream_s(opt, 8, backward=True) == 0.0
    # full offload streams the weights every micro-batch: on one device the host link binds
    # (slower than optimizer offload there), on eight it hides behind compute
    assert H100.train_s(full, 1, tokens) > H100.train_s(opt, 1, tokens)
    per_device = tokens / 8 / max(H100.f.ppo_mini_batches, -(-tokens / 8 // H100.f.micro_batch_tokens))
    assert H100.host_stream_s(full, 8, backward=True) < H100.micro_batch_s(none, 8, per_device, backward=True)
    # a gang moving to other devices reloads only what lives on them
    assert H100.context_switch_s(none, 8, train_state=True) > H100.context_switch_s(opt, 8, train_state=True) > 0
    assert H100.context_switch_s(full, 8, train_state=True) == 0.0
    # the rollout's weights are what they were
    assert H100.context_switch_s(full, 1, train_state=False) == H100.context_switch_s(none, 1, train_state=False)


def _updates_hold_their_state(ex):
    for name, category, devices, start, end in ex.trace:
        if category in UPDATE_STAGES:
            p = ex.pipelines[name.split()[0]]
            assert len(devices) >= ex.cost.stage_min_gang(p.model, category), (name, devices)


def test_a_big_model_on_a_small_share_runs_with_offload_and_is_refused_without():
    # a 72B on 8 devices: its training state needs 17 without offload, 5 with optimizer offload
    kw = dict(gpus=8, pipelines=1, prompts=2, samples=2, steps=2, median=200, models=("qwen2.5-72b",),
              agentic=(False,), algorithms=("grpo",))
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.gpus.*at least 17 h100.*or set train_offload"):
        Simulation(small_workload(**kw), get_policy("verl-sync"))
    wl = small_workload(train_offload=("optimizer",), **kw)
    for name in ("verl-sync", "jigsaw"):
        sim = Simulation(wl, get_policy(name), seed=0)
        r = sim.run()
        assert r["samples"] == 2 * 2 * 2 and r["makespan_s"] >= r["bounds"]["makespan_lower_bound_s"]
        _updates_hold_their_state(sim.world)
    # a disaggregated trainer holds the training state beside a rollout replica: a 32B on 8
    # devices needs 8 + 4 without offload, 2 + 4 with optimizer offload
    akw = {**kw, "models": ("qwen2.5-32b",), "modes": ("async",), "staleness": (1,)}
    aw = small_workload(train_offload=("optimizer",), **akw)
    for name in ("one-step-off", "streamrl", "areal"):
        with pytest.raises(SpecError, match=r"pipelines\[0\]\.gpus.*at least 12 devices"):
            Simulation(small_workload(**akw), get_policy(name))
        sim = Simulation(aw, get_policy(name), seed=0)
        r = sim.run()
        assert r["samples"] == 8 and r["makespan_s"] >= r["bounds"]["makespan_lower_bound_s"]
        _updates_hold_their_state(sim.world)


def test_an_offloaded_update_is_slower_on_the_same_devices():
    kw = dict(gpus=8, pipelines=1, prompts=8, samples=4, steps=2, median=300, models=("qwen2.5-7b",),
              agentic=(False,), algorithms=("grpo",))
    steps = {}
    for offload in ("none", "optimizer", "full"):
        r = Simulation(small_workload(train_offload=(offload,), **kw), get_policy("verl-sync"), seed=0).run()
        steps[offload] = r["pipelines"]["p0"]["stage_s"]["update_actor"]
    assert steps["optimizer"] > steps["none"] and steps["full"] > steps["none"], steps


def test_hosts_declare_where_their_trainer_keeps_the_state():
    from types import SimpleNamespace as NS

    from jigsaw_plugin.adapters.openrlhf.host import openrlhf_host_pipeline
    from jigsaw_plugin.adapters.verl.options import JigsawOptions, train_offload_of
    from jigsaw_plugin.adapters.verl.session import JigsawSession
    from jigsaw_plugin.runtime.host_executor import HostPipeline, host_workload
    from tests.test_openrlhf_host import args

    # OpenRLHF: --ds.adam_offload keeps Adam on the host (DeepSpeed's offload_optimizer)
    plain = openrlhf_host_pipeline("orl", args(), n_engines=2, n_train=1, active_engines=None, steps=2,
                                   request_migration=False)
    a = args()
    a.ds = NS(adam_offload=True)
    offloaded = openrlhf_host_pipeline("orl", a, n_engines=2, n_train=1, active_engines=None, steps=2,
                                       request_migration=False)
    assert (plain.train_offload, offloaded.train_offload) == ("none", "optimizer")
    assert HostPipeline.from_dict(offloaded.to_dict()) == offloaded
    assert host_workload(3, [offloaded]).pipelines[0].train_offload == "optimizer"
    # verl: FSDP2's offload_policy keeps everything on the host; param/optimizer offload do not
    assert train_offload_of({"fsdp_config": {"offload_policy": True}}) == "full"
    assert train_offload_of({"fsdp_config": {"param_offload": True, "optimizer_offload": True}}) == "none"
    assert train_offload_of({}) == "none"
    s = JigsawSession(JigsawOptions(pipeline="p", coordinator="jig", policy="observe"), n_devices=2)
    spec = {"algorithm": "grpo", "prompts_per_step": 2, "samples_per_prompt": 2, "max_response_len": 64,
            "max_prompt_len": 64, "steps": 2, "model": "tiny-qwen2", "train_offload": "full"}
    assert s.host_pipeline(spec).train_offload == "full"
    with pytest.raises(SpecError, match=r"pipeline p: train_offload.*'disk'.*none \| optimizer \| full"):
        s.host_pipeline({**spec, "train_offload": "disk"})


def test_the_ray_backend_refuses_offload_it_cannot_carry_out():
    from jigsaw_plugin.runtime.ray_bench import check_ray_workload

    kw = dict(gpus=2, pipelines=1, models=("tiny-qwen2",), algorithms=("grpo",), gpu="cpu", agentic=(False,))
    check_ray_workload(small_workload(**kw))
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.train_offload.*'optimizer'.*none"):
        check_ray_workload(small_workload(train_offload=("optimizer",), **kw))
