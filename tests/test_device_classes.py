"""Device classes in the workload spec (cluster.classes) and their prices in the simulator."""

from __future__ import annotations

import copy
import re

import pytest
from sim_helpers import small_workload

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.sim import Simulation, simulate
from jigsaw_plugin.workload import parse_workload

TWO_CLASSES = {"classes": [
    {"name": "od", "gpu": "h100", "count": 4, "gpus_per_node": 4, "price_per_hour": 4.0},
    {"name": "spot", "gpu": "a100", "count": 4, "price_per_hour": 1.5,
     "link": {"bandwidth_gbit_s": 10, "latency_ms": 30}, "preemptible": {"rate_per_hour": 2, "replace_s": 30}},
]}


def _with_cluster(cluster) -> dict:
    d = small_workload(modes=("async", "async"), staleness=(1, 1)).to_dict()
    d["cluster"] = copy.deepcopy(cluster)
    return d


def test_classes_parse_and_round_trip():
    w = parse_workload(_with_cluster(TWO_CLASSES))
    c = w.cluster
    assert c.gpus == 8 and c.gpu == "h100" and c.gpus_per_node == 4
    od, spot = c.device_classes()
    assert (od.name, od.count, od.price_per_hour, od.link, od.preemptible) == ("od", 4, 4.0, None, None)
    assert spot.link.bandwidth_gbit_s == 10 and spot.link.latency_ms == 30
    assert spot.preemptible.rate_per_hour == 2 and spot.preemptible.replace_s == 30
    assert parse_workload(w.to_dict()) == w


def test_single_class_form_is_one_class():
    w = parse_workload(_with_cluster({"gpus": 8, "gpu": "h100", "price_per_hour": 2.5}))
    (only,) = w.cluster.device_classes()
    assert (only.name, only.count, only.price_per_hour, only.gpus_per_node) == ("h100", 8, 2.5, 8)
    assert parse_workload(w.to_dict()) == w


def test_preemption_trace_file(tmp_path):
    (tmp_path / "pre.csv").write_text("t_s,device\n10.5,1\n# a comment\n3,0\n")
    cl = copy.deepcopy(TWO_CLASSES)
    cl["classes"][1]["preemptible"] = {"trace": "pre.csv"}
    w = parse_workload(_with_cluster(cl), base_dir=tmp_path)
    assert w.cluster.classes[1].preemptible.trace == ((3.0, 0), (10.5, 1))


def _bad(path: str, value):
    cl = copy.deepcopy(TWO_CLASSES)
    node = cl
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    if value is KeyError:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return cl


@pytest.mark.parametrize("cluster, field, value", [
    (_bad("classes", []), "cluster.classes", []),
    (_bad("classes.0.count", 0), "cluster.classes[0].count", 0),
    (_bad("classes.0.count", KeyError), "cluster.classes[0].count", "<missing>"),
    (_bad("classes.0.gpu", "tpu"), "cluster.classes[0].gpu", "tpu"),
    (_bad("classes.0.price_per_hour", -1), "cluster.classes[0].price_per_hour", -1),
    (_bad("classes.0.price_per_hour", "cheap"), "cluster.classes[0].price_per_hour", "cheap"),
    (_bad("classes.1.name", "od"), "cluster.classes[1].name", "od"),
    (_bad("classes.1.link", {"latency_ms": 3}), "cluster.classes[1].link.bandwidth_gbit_s", "<missing>"),
    (_bad("classes.1.link.bandwidth_gbit_s", 0), "cluster.classes[1].link.bandwidth_gbit_s", 0),
    (_bad("classes.1.link.latency_ms", -2), "cluster.classes[1].link.latency_ms", -2),
    (_bad("classes.1.link.mtu", 9000), "cluster.classes[1].link.mtu", "mtu"),
    (_bad("classes.1.preemptible.rate_per_hour", -0.5), "cluster.classes[1].preemptible.rate_per_hour", -0.5),
    (_bad("classes.1.preemptible", {"replace_s": 5}), "cluster.classes[1].preemptible", {"replace_s": 5}),
    (_bad("classes.1.preemptible.trace", "x.csv"), "cluster.classes[1].preemptible",
     {"rate_per_hour": 2, "replace_s": 30, "trace": "x.csv"}),
    (_bad("classes.1.preemptible.replace_s", "soon"), "cluster.classes[1].preemptible.replace_s", "soon"),
    (_bad("classes.1.colour", "red"), "cluster.classes[1].colour", "colour"),
    (dict(TWO_CLASSES, gpus=8), "cluster.gpus", 8),
    ({"gpus": 8, "gpu": "h100", "price_per_hour": -3}, "cluster.price_per_hour", -3),
])
def test_bad_classes_name_the_field(cluster, field, value):
    with pytest.raises(SpecError) as e:
        parse_workload(_with_cluster(cluster))
    assert e.value.field == field and e.value.value == value


@pytest.mark.parametrize("line", ["-1,0", "5,4", "abc,0", "5", "5,0,1"])
def test_bad_trace_lines_name_the_line(tmp_path, line):
    (tmp_path / "pre.csv").write_text(f"t_s,device\n1,0\n{line}\n")
    cl = copy.deepcopy(TWO_CLASSES)
    cl["classes"][1]["preemptible"] = {"trace": "pre.csv"}
    with pytest.raises(SpecError) as e:
        parse_workload(_with_cluster(cl), base_dir=tmp_path)
    assert e.value.field == "cluster.classes[1].preemptible.trace line 3"


def test_missing_trace_file_is_a_spec_error(tmp_path):
    cl = copy.deepcopy(TWO_CLASSES)
    cl["classes"][1]["preemptible"] = {"trace": "nope.csv"}
    with pytest.raises(SpecError) as e:
        parse_workload(_with_cluster(cl), base_dir=tmp_path)
    assert e.value.field == "cluster.classes[1].preemptible.trace"


def _rollout_split(cls_rollout: str):
    """4 rollout devices of ``cls_rollout`` first (one-step-off's rollout share), 4 H100 trainers."""
    return {"classes": [{"name": "roll", "gpu": cls_rollout, "count": 4, "price_per_hour": 1.0},
                        {"name": "train", "gpu": "h100", "count": 4, "price_per_hour": 3.0}]}


def test_each_device_is_priced_by_its_class():
    from jigsaw_plugin.scheduler import get_policy

    d = _with_cluster(_rollout_split("h100"))
    d["pipelines"] = d["pipelines"][:1]
    fast = simulate(parse_workload(d), get_policy("one-step-off", rollout_gpus=4))
    d["cluster"] = _rollout_split({"name": "slow", "flops_tflops": 100, "hbm_tbps": 0.5, "memory_gb": 80,
                                   "link_gbps": 100})
    slow = simulate(parse_workload(d), get_policy("one-step-off", rollout_gpus=4))
    # rollout runs on the slow class: generation takes longer, training (same H100s) does not
    assert slow["pipelines"]["p0"]["stage_s"]["gen"] > 1.5 * fast["pipelines"]["p0"]["stage_s"]["gen"]
    assert slow["pipelines"]["p0"]["stage_s"]["update_actor"] == pytest.approx(
        fast["pipelines"]["p0"]["stage_s"]["update_actor"], rel=1e-9)


def test_cost_is_device_hours_times_price_per_class():
    w = parse_workload(_with_cluster(_rollout_split("a100")))
    r = simulate(w, "jigsaw")
    hours = r["makespan_s"] / 3600
    c = r["cost"]
    assert c["unit"] == "price"
    assert c["classes"]["roll"]["device_hours"] == pytest.approx(4 * hours)
    assert c["total"] == pytest.approx(4 * hours * 1.0 + 4 * hours * 3.0)
    assert c["samples_per_cost"] == pytest.approx(r["samples"] / c["total"])


def test_unpriced_cluster_counts_device_hours():
    r = simulate(small_workload(), "verl-sync")
    assert r["cost"]["unit"] == "device-hours"
    assert r["cost"]["total"] == pytest.approx(8 * r["makespan_s"] / 3600)


def test_gangs_sized_by_the_first_class_stay_on_classes_that_hold_them():
    # activation off: the policy sizes a 32B's gangs from the first class's 80 GB H100s; on
    # a pool that also has 24 GB devices a gang reaches them only where they hold its state
    # (the executor refuses a gang whose smallest devices cannot)
    from jigsaw_plugin.scheduler import get_policy

    d = _with_cluster({"classes": [
        {"name": "h100", "gpu": "h100", "count": 8, "gpus_per_node": 8},
        {"name": "small", "gpu": {"name": "small", "flops_tflops": 165.0, "hbm_tbps": 1.0, "memory_gb": 24.0,
                                  "link_gbps": 32.0}, "count": 8, "gpus_per_node": 8}]})
    d["pipelines"] = d["pipelines"][:1]
    d["pipelines"][0].update(model="qwen2.5-32b", gpus=16)
    d["pipelines"][0].pop("rollout_tp", None)
    sim = Simulation(parse_workload(d), get_policy("jigsaw", cost_aware=False), seed=0)
    r = sim.run()
    assert r["pipelines"]["p0"]["samples"] == d["pipelines"][0]["prompts_per_step"] * \
        d["pipelines"][0]["samples_per_prompt"] * d["pipelines"][0]["steps"]
    model = sim.world.pipelines["p0"].model
    gangs = [(cat, devs) for _, cat, devs, _, _ in sim.world.trace if cat not in ("rollout", "weight_sync")]
    assert gangs and all(len(devs) >= sim.world.device_classes.cost_for(devs).stage_min_gang(model, cat)
                         for cat, devs in gangs)
    assert any(max(devs) >= 8 for _, devs in gangs)  # the small devices still train where they hold it


_SMALL = {"name": "small", "flops_tflops": 165.0, "hbm_tbps": 1.0, "memory_gb": 24.0, "link_gbps": 32.0}


def _two_sizes(first, second, model="qwen2.5-7b", gpus=None, mode="async"):
    """One pipeline on a pool of two classes of (gpu, count)."""
    d = _with_cluster({"classes": [{"name": "c0", "gpu": first[0], "count": first[1]},
                                   {"name": "c1", "gpu": second[0], "count": second[1]}]})
    d["pipelines"] = d["pipelines"][:1]
    d["pipelines"][0].update(model=model, gpus=gpus or first[1] + second[1], mode=mode)
    d["pipelines"][0].pop("rollout_tp", None)
    if mode == "sync":
        d["pipelines"][0].pop("staleness", None)
    return parse_workload(d)


@pytest.mark.parametrize("policy, options, words", [
    ("one-step-off", {"rollout_gpus": 12}, "2 training devices after one-step-off's 12 rollout devices"),
    ("rollmux", {}, "rollmux group's 2 training devices"),
])
def test_a_split_whose_trainers_cannot_hold_the_state_on_their_class_is_refused(policy, options, words):
    # 12 H100 then 2 devices of 24 GB: the split's training devices are the small ones, too
    # few to hold a 7B's training state there (6 needed); refused before the run, by field,
    # where it was a PolicyViolation mid-run
    from jigsaw_plugin.scheduler import get_policy

    d = _two_sizes(("h100", 12), (_SMALL, 2)).to_dict()
    d["cluster"]["classes"][0]["gpus_per_node"] = 2
    d["pipelines"][0].update(prompts_per_step=4, max_response_len=512)
    with pytest.raises(SpecError, match=re.escape("pipelines[0].gpus")) as e:
        simulate(parse_workload(d), get_policy(policy, **options))
    assert words in str(e.value)


def test_a_share_is_checked_against_its_own_classes():
    # a 14B's share of 5 devices, 2 H100 (3 needed) and 3 of 24 GB (11 needed): no part of
    # it holds the training state, refused for every policy
    d = _two_sizes(("h100", 2), (_SMALL, 8)).to_dict()
    d["pipelines"][0].update(model="qwen2.5-14b", gpus=5)
    d["pipelines"].append(dict(d["pipelines"][0], name="p1", model="qwen2.5-0.5b", gpus=5))
    with pytest.raises(SpecError, match=re.escape("pipelines[0].gpus")) as e:
        simulate(parse_workload(d), "jigsaw")
    assert "c0 (cluster.classes[0])" in str(e.value)
    # 4 H100 in the share hold it: jigsaw runs, verl-sync (which trains on all of it) refuses
    d["cluster"]["classes"][0]["count"] = 4
    d["pipelines"][0]["gpus"] = 7
    assert simulate(parse_workload(d), "jigsaw")["samples"] > 0
    with pytest.raises(SpecError, match=re.escape("pipelines[0].gpus")) as e:
        simulate(parse_workload(d), "verl-sync")
    assert "smallest class" in str(e.value)


def test_cost_aware_jigsaw_refuses_a_trainer_site_too_small_for_a_pipeline():
    # the trainer site is the on-demand classes in the trainer's data centre: 4 devices of
    # 24 GB cannot hold a 7B's update (6 needed) beside 8 remote H100 (behind a link); with
    # activation off the gangs go to the H100s
    from jigsaw_plugin.scheduler import get_policy

    d = _two_sizes((_SMALL, 4), ("h100", 8), gpus=12).to_dict()
    d["cluster"]["classes"][1]["link"] = {"bandwidth_gbit_s": 100.0, "latency_ms": 1}
    w = parse_workload(d)
    with pytest.raises(SpecError, match="cluster.classes") as e:
        simulate(w, get_policy("jigsaw"))
    assert "trainer site" in str(e.value) and "cost_aware=False" in str(e.value)
    assert simulate(w, get_policy("jigsaw", cost_aware=False))["samples"] > 0
    # the same H100 as spot in the trainer's data centre: the site takes them beside the
    # 24 GB devices (a gang there restarts when one is preempted: priced, not refused)
    del d["cluster"]["classes"][1]["link"]
    d["cluster"]["classes"][1]["preemptible"] = {"rate_per_hour": 0.0}
    assert simulate(parse_workload(d), get_policy("jigsaw"))["samples"] > 0


def test_a_pool_of_on_demand_classes_in_one_data_centre_is_one_trainer_site():
    # nothing for activation to choose (every device billed whole): the 24 GB first class
    # is no trainer site that must hold the update alone, and the H100s train
    from jigsaw_plugin.scheduler import get_policy

    w = _two_sizes((_SMALL, 4), ("h100", 8), gpus=12)
    sim = Simulation(w, get_policy("jigsaw"), seed=0)
    r = sim.run()
    off = simulate(w, get_policy("jigsaw", cost_aware=False))
    assert r["samples"] > 0 and r["makespan_s"] == off["makespan_s"]
    assert any(kind != "rollout" and set(devs) & set(range(4, 12)) for _n, kind, devs, _a, _b in sim.world.trace)


def test_a_gang_narrowed_onto_too_few_of_a_small_class_starts_on_the_devices_that_hold_it():
    # activation off: 4 A100 then 12 devices of 48 GB, a 32B (8 A100 or 13 of the small
    # ones hold its update); the look-ahead's narrowed gang mixed both and was too few for
    # the small class, and the run stalled at its first update
    from jigsaw_plugin.scheduler import get_policy

    small = {"name": "l40s", "flops_tflops": 362.0, "hbm_tbps": 0.864, "memory_gb": 48.0, "link_gbps": 32.0}
    d = _two_sizes(("a100", 4), (small, 12), model="qwen2.5-32b", mode="sync").to_dict()
    d["cluster"]["classes"][1]["gpus_per_node"] = 8
    d["pipelines"][0].update(prompts_per_step=4, max_response_len=512, steps=2)
    r = simulate(parse_workload(d), get_policy("jigsaw", cost_aware=False))
    assert r["pipelines"]["p0"]["samples"] == 2 * 4 * d["pipelines"][0]["samples_per_prompt"]


def test_a_paused_stage_resumes_on_devices_that_hold_it():
    # activation off: L40S + RTX 4090 + A100, a 1.5B PPO pipeline whose update, paused when
    # the A100s' owner took them back, resumed narrowed onto one 24 GB device too small for
    # it; the executor refused that, and the run stalled with the update paused
    from jigsaw_plugin.scheduler import get_policy

    rtx = {"name": "rtx4090", "flops_tflops": 165.0, "hbm_tbps": 1.008, "memory_gb": 24.0, "link_gbps": 32.0}
    small = {"name": "l40s", "flops_tflops": 362.0, "hbm_tbps": 0.864, "memory_gb": 48.0, "link_gbps": 32.0}
    pipeline = {"algorithm": "ppo", "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_len": 4096,
                "prompt_len": {"dist": "const", "value": 200},
                "response_len": {"dist": "lognormal", "median": 300, "sigma": 0.8, "min": 1}, "steps": 2}
    d = {"version": 1, "cluster": {"classes": [
        {"name": "c0", "gpu": small, "count": 16, "gpus_per_node": 4},
        {"name": "c1", "gpu": rtx, "count": 8, "gpus_per_node": 8},
        {"name": "c2", "gpu": "a100", "count": 6, "gpus_per_node": 8}]},
        "pipelines": [dict(pipeline, name="p0", model="qwen2.5-1.5b", mode="sync", gpus=19),
                      dict(pipeline, name="p1", model="qwen2.5-0.5b", mode="async", staleness=1, gpus=11)]}
    r = simulate(parse_workload(d), get_policy("jigsaw", cost_aware=False))
    assert r["pipelines"]["p0"]["samples"] == r["pipelines"]["p1"]["samples"] == 2 * 4 * 4


def test_gangs_are_sized_on_the_class_that_holds_them_not_the_first():
    # activation off: 2 L40S (the first class, 48 GB), 12 H20 (96 GB), 2 A100; a 14B on a
    # home of 5 and a 32B on a home of 11. Sized from the L40S profile each update needed
    # more than its home and neither lent its home while its own update waited: deadlock
    from jigsaw_plugin.scheduler import get_policy

    small = {"name": "l40s", "flops_tflops": 362.0, "hbm_tbps": 0.864, "memory_gb": 48.0, "link_gbps": 32.0}
    pipeline = {"algorithm": "dapo", "samples_per_prompt": 4, "prompt_len": {"dist": "const", "value": 200},
                "response_len": {"dist": "lognormal", "median": 300, "sigma": 0.8, "min": 1}, "steps": 2}
    d = {"version": 1, "cluster": {"classes": [
        {"name": "c0", "gpu": small, "count": 2, "gpus_per_node": 4},
        {"name": "c1", "gpu": "h20", "count": 12, "gpus_per_node": 2},
        {"name": "c2", "gpu": "a100", "count": 2, "gpus_per_node": 4}]},
        "pipelines": [dict(pipeline, name="p0", model="qwen2.5-14b", mode="sync", prompts_per_step=16,
                           max_response_len=4096, gpus=5),
                      dict(pipeline, name="p1", model="qwen2.5-32b", mode="async", staleness=1, prompts_per_step=4,
                           max_response_len=512, gpus=11)]}
    r = simulate(parse_workload(d), get_policy("jigsaw", cost_aware=False))
    assert r["pipelines"]["p0"]["samples"] == 2 * 16 * 4 and r["pipelines"]["p1"]["samples"] == 2 * 4 * 4


def _fourteen_b_at_width_one():
    """A 14B with ``rollout_tp: 1`` on 4 H100, 8 devices of 24 GB and 4 H100 (the split
    baselines train on the last): one device holds its weights (28 GB) on an H100, not on
    a small one; 11 small ones hold its training state (verl-sync trains on all 16)."""
    d = _two_sizes(("h100", 4), (_SMALL, 8), model="qwen2.5-14b", mode="sync").to_dict()
    d["cluster"]["classes"][1]["gpus_per_node"] = 4
    d["cluster"]["classes"].append({"name": "c2", "gpu": "h100", "count": 4, "gpus_per_node": 4})
    d["pipelines"][0].update(rollout_tp=1, gpus=16, prompts_per_step=4, max_response_len=256, steps=1)
    return parse_workload(d)


@pytest.mark.parametrize("policy, options", [("verl-sync", {}), ("rollmux", {}), ("one-step-off", {}),
                                             ("jigsaw", {"cost_aware": False}), ("jigsaw", {})])
def test_a_rollout_width_too_narrow_for_a_small_class_runs_wider_there_or_off_it(policy, options):
    # seed 149 of odd_workloads --classes: the width was taken from the first class, and
    # verl-sync, rollmux and jigsaw with activation off launched a one-device 14B replica
    # on a 24 GB device (a ValueError inside the simulator's replica). Now the baselines
    # run one width on the class with the least memory among their rollout devices (verl
    # and OpenRLHF take one tensor-parallel size for every engine) and jigsaw keeps its
    # replicas off devices whose class cannot hold them
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    sim = Simulation(_fourteen_b_at_width_one(), get_policy(policy, **options), seed=0)
    r = sim.run()
    assert r["samples"] == 4 * r["pipelines"]["p0"]["steps"] * sim.world.pipelines["p0"].spec.samples_per_prompt
    model = sim.world.pipelines["p0"].model
    launched = [devs for _, cat, devs, _, _ in sim.world.trace if cat == "rollout"]
    assert launched
    assert all(sim.world.device_classes.cost_for(devs).kv_capacity_tokens(model, len(devs)) > 0 for devs in launched)
    if policy == "verl-sync":  # its share's smallest class sets one width for all
        assert {len(devs) for devs in launched} == {2}


def test_the_simulator_refuses_a_replica_whose_class_cannot_hold_it_before_booking_anything():
    from jigsaw_plugin.core.executor import PolicyViolation
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.scheduler.decisions import LaunchReplica
    from jigsaw_plugin.sim import Simulation

    sim = Simulation(_fourteen_b_at_width_one(), get_policy("jigsaw"), seed=0)
    w = sim.world
    with pytest.raises(PolicyViolation, match=r"LaunchReplica.devices: \(5,\).*small device\(s\) \(24 GB\)"
                                              r".*allowed: 2 of that class"):
        w.apply(LaunchReplica("p0", (5,)))
    assert not w.replicas and all(w.task.get(d) is None for d in range(16))


def test_a_share_too_small_for_one_replica_on_its_smallest_class_is_refused_by_field():
    # verl-sync rolls out on the whole share at one width: a 72B's weights (145 GB) leave a
    # 16 GB device no KV room even at width 8 (its training state on the host:
    # train_offload full); refused before the run, naming the share
    tiny = dict(_SMALL, name="tiny", memory_gb=16.0)
    d = _two_sizes(("h100", 8), (tiny, 8), model="qwen2.5-72b", mode="sync").to_dict()
    d["cluster"]["classes"][0]["gpus_per_node"] = d["cluster"]["classes"][1]["gpus_per_node"] = 8
    d["pipelines"][0]["train_offload"] = "full"
    with pytest.raises(SpecError, match=re.escape("pipelines[0].gpus")) as e:
        simulate(parse_workload(d), "verl-sync")
    assert "hold a replica of qwen2.5-72b on their smallest class (tiny, 16 GB" in str(e.value)


def test_a_site_behind_a_link_holds_only_the_version_it_was_last_sent():
    # the start's preload counts as resident until a weight sync leaves the site without a
    # live replica of the pipeline (the sync pulls the new version only to sites with one);
    # a launch there then pulls the version over the link first
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.scheduler.decisions import LaunchReplica

    w = Simulation(parse_workload(_with_cluster(TWO_CLASSES)), get_policy("jigsaw"), seed=0).world
    p = w.pipelines["p0"]
    w.make_resident(p.name, range(8))
    w._on_weights_synced(p)  # no replica of p behind the link: that site keeps the old version
    assert all(p.name in w.resident[d] for d in range(4))
    assert not any(p.name in w.resident[d] for d in range(4, 8))
    w.apply(LaunchReplica(p.name, (4,)))
    rep = p.replicas[-1]
    pull = w.device_classes.weight_pull_s(p.model, [(4,)])
    assert pull > 1.0 and rep.switch_s >= pull
    w.make_resident(p.name, range(4, 8))
    w._on_weights_synced(p)  # now a live replica there: the sync's copy reached the site
    assert all(p.name in w.resident[d] for d in range(4, 8))
