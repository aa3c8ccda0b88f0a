"""Cost-aware activation of heterogeneous rollout workers (scheduler/activation.py).

The states are hand-built from the typed views an executor hands a policy; the device
classes come from a parsed workload through ``DeviceClasses.views()`` (what the simulator
puts in ``SchedulerState.classes``). One small simulated run checks the jigsaw policy's
wiring and the elastic cost figure.
"""

import dataclasses

import pytest

from jigsaw_plugin.costmodel import model_profile
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.plan.capacity import evaluate
from jigsaw_plugin.scheduler.activation import activate, trainer_site, within_link_bound
from jigsaw_plugin.scheduler.state import DeviceView, LengthSummary, PipelineView, SchedulerState
from jigsaw_plugin.sim.devices import DeviceClasses
from jigsaw_plugin.workload import parse_workload
from sim_helpers import small_workload

MODEL = model_profile("qwen2.5-7b")
TRAINER = {"name": "h100", "gpu": "h100", "count": 4, "gpus_per_node": 4, "price_per_hour": 4.0}
RTX4090 = {"name": "rtx4090", "flops_tflops": 165.0, "hbm_tbps": 1.008, "memory_gb": 24.0, "link_gbps": 32.0}
SLOW_LINK = {"bandwidth_gbit_s": 1.0, "latency_ms": 50}  # 15 GB of weights: about 2 minutes a version


def spot(name, price, count=8, gpu="a100"):
    return {"name": name, "gpu": gpu, "count": count, "gpus_per_node": 8, "price_per_hour": price,
            "preemptible": {"rate_per_hour": 0}}


def remote(price=0.3, count=8):
    return {"name": "remote", "gpu": RTX4090, "count": count, "gpus_per_node": 8, "price_per_hour": price,
            "link": SLOW_LINK}


def workload(classes, staleness=1, prompts=32, model="qwen2.5-1.5b"):
    w = small_workload(pipelines=1, prompts=prompts, samples=16, algorithms=("grpo",), agentic=(False,),
                       modes=("async",), staleness=(staleness,), models=(model,)).to_dict()
    w["cluster"] = {"classes": classes}
    return parse_workload(w)


def hand_state(w, longest=3000.0):
    """One async pipeline owning the whole pool, nothing running, every device free."""
    dc = DeviceClasses(w.cluster)
    spec = w.pipelines[0]
    n = sum(c.count for c in dc.specs)
    p = PipelineView(
        name=spec.name, index=0, spec=spec, model=MODEL, stages=("old_log_prob", "ref", "adv", "update_actor",
                                                                   "weight_sync"),
        static_devices=tuple(range(n)), gen_next=0, train_next=0, stage_next=0, stage_running=False, version=0,
        rollout_version=0, done=False, generating=False, pending=0, replicas=(), steps={}, history=None,
        lengths=LengthSummary(100, 150.0, 600.0, 750.0, 1.0, longest), stage_history_s={},
        running_stage_end_t=None)
    devices = tuple(DeviceView(d, d // 8, None, (), None) for d in range(n))
    state = SchedulerState(t=0.0, gpus=n, gpus_per_node=8, devices=devices, free=frozenset(range(n)), order=(p,),
                           cost=dc.costs[0], max_num_seqs=256, classes=dc.views())
    return state, p


def classes_of(state, devices):
    return [state.device_class(d).name for d in devices]


def test_the_cheaper_per_token_class_is_chosen_first():
    # two classes of the same GPU at different prices: the cheap one's samples come first
    state, p = hand_state(workload([TRAINER, spot("dear", 3.0), spot("cheap", 1.2)], prompts=32))
    a = activate(state, p, sorted(state.free), 1)
    elastic = [d for d in a.devices if d not in trainer_site(state)]
    assert elastic and set(classes_of(state, elastic)) == {"cheap"}
    assert [o.name for o in a.offers] == ["cheap", "dear"]
    assert a.offers[0].tokens_per_cost > a.offers[1].tokens_per_cost
    # a demand beyond the cheap class: every cheap device before the first dear one
    state, p = hand_state(workload([TRAINER, spot("dear", 3.0), spot("cheap", 1.2, count=2)], prompts=32))
    a = activate(state, p, sorted(state.free), 1, staleness=2)
    names = classes_of(state, [d for d in a.devices if d not in trainer_site(state)])
    assert "dear" in names and names == ["cheap"] * 2 + ["dear"] * (len(names) - 2)


def test_the_trainer_sites_free_devices_are_activated_first_without_the_rule():
    # the on-demand classes in the trainer's data centre are billed whole, idle or not:
    # their free devices run rollout ahead of any elastic one, and the rule provisions
    # only the elastic classes (a spot class offered, the site's not)
    state, p = hand_state(workload([TRAINER, spot("cheap", 1.2)], prompts=512))
    a = activate(state, p, sorted(state.free), 1)
    assert a.devices[:4] == (0, 1, 2, 3) and set(a.devices[4:]) <= set(range(4, 12))
    assert [o.name for o in a.offers] == ["cheap"]
    assert trainer_site(state) == frozenset(range(4))
    # every on-demand class without a link is the site (not only the first)
    a100 = {"name": "a100", "gpu": "a100", "count": 2, "gpus_per_node": 2, "price_per_hour": 2.0}
    state, p = hand_state(workload([TRAINER, spot("cheap", 1.2), a100, remote(0.3)], prompts=512))
    assert trainer_site(state) == frozenset([0, 1, 2, 3, 12, 13])
    a = activate(state, p, [13, 5, 0, 20], 1)
    assert a.devices[:2] == (13, 0) and {o.name for o in a.offers} <= {"cheap", "remote"}


def test_spot_classes_join_the_trainer_site_only_where_the_on_demand_ones_cannot_hold_an_update():
    from jigsaw_plugin.scheduler.activation import holds_updates, trainer_classes

    def small(count):
        return {"name": "small", "gpu": RTX4090, "count": count, "gpus_per_node": 8, "price_per_hour": 1.0}

    # the pipeline's 7B update needs 6 devices of 24 GB: 8 hold it, the site is theirs alone
    state, _ = hand_state(workload([small(8), spot("cheap", 1.2), remote(0.3)]))
    assert [c.name for c in trainer_classes(state)] == ["small"]
    # 2 do not: the spot A100s join them (the remote class never does)
    state, _ = hand_state(workload([small(2), spot("cheap", 1.2), remote(0.3)]))
    site = trainer_classes(state)
    assert [c.name for c in site] == ["small", "cheap"] and holds_updates(site, (MODEL,))
    assert not holds_updates(site[:1], (MODEL,))


def test_a_pool_with_no_on_demand_class_gives_a_running_rollout_more_devices():
    # every class spot: the whole pool is the site, and a rollout that runs replicas
    # already still gets the free devices (it got none: no class was offered)
    from jigsaw_plugin.scheduler.state import ReplicaView

    state, p = hand_state(workload([spot("a", 1.2, count=4), spot("b", 0.9, count=4)], prompts=64))
    running = (ReplicaView(0, p.name, (0,), 10, 0, 0.0, 1e6, 256, False, 0.02, 0.0),)
    busy = dataclasses.replace(p, replicas=running)
    again = dataclasses.replace(state, order=(busy,), free=state.free - {0})
    assert activate(again, busy, sorted(again.free), 1).devices == tuple(range(1, 8))


def test_a_tighter_staleness_bound_activates_more_devices():
    state, p = hand_state(workload([TRAINER, spot("cheap", 1.2)], prompts=32))
    loose = activate(state, p, sorted(state.free), 1, staleness=4)
    tight = activate(state, p, sorted(state.free), 1, staleness=2)
    assert loose.fed and tight.fed  # both pools keep the learner fed at their bound
    assert len(tight.devices) > len(loose.devices) >= 1
    assert len(activate(state, p, sorted(state.free), 1, staleness=1).devices) >= len(tight.devices)


def test_a_slow_remote_class_is_left_out_when_its_weight_pull_breaks_the_bound():
    # the remote class is the cheapest per token; a version takes ~2 min over its link
    state, p = hand_state(workload([TRAINER, spot("a100", 1.2), remote(0.3)], prompts=32))
    tight = activate(state, p, sorted(state.free), 1, staleness=1)
    off = next(o for o in tight.offers if o.name == "remote")
    assert not off.admitted and "staleness bound" in off.reason and off.pull_s > tight.train_s
    assert "remote" not in classes_of(state, tight.devices) and tight.devices
    # a bound loose enough for the copy admits it, but every step of a pool holding it
    # waits ~2 min for the copy: the pool of the local class alone gives cheaper samples
    # (the order alone, cheapest per token first, held no pool without the remote class:
    # 8 remote + 1 A100 stepped in 143 s at 6x the cost per sample)
    loose = activate(state, p, sorted(state.free), 1, staleness=8)
    assert next(o for o in loose.offers if o.name == "remote").admitted
    assert loose.devices and "remote" not in classes_of(state, loose.devices)
    with_remote = evaluate(loose.provision.inputs, {"remote": 8, "a100": 1})
    assert loose.provision.cost_per_sample * 3 < with_remote.cost_per_sample


def test_moves_outside_a_launch_meet_the_link_rule_too():
    # a tail re-shard picks free devices itself: those of a class whose pull breaks the
    # bound are taken out, the rest left to it (how many, which widths hold the replica)
    state, p = hand_state(workload([TRAINER, spot("a100", 1.2), remote(0.3)], prompts=32))
    free = sorted(state.free)
    kept = within_link_bound(state, p, free, 1, staleness=1)
    assert set(classes_of(state, kept)) == {"h100", "a100"} and len(kept) == 12
    assert within_link_bound(state, p, free, 1, staleness=8) == free  # the copy fits that bound
    one = hand_state(workload([dict(TRAINER, count=8, gpus_per_node=8)]))[0]
    assert within_link_bound(one, p, [3, 1], 1) == [3, 1]


def test_a_tail_is_not_resharded_onto_a_class_the_activation_refuses():
    # (c)'s asynchronous DAPO pipeline at staleness 1 on H100 + spot A100 + remote 4090s
    # behind 1 Gbit/s (benchmarks/heterogeneous.py's pool, 4 steps): the rule refuses the
    # remote class (a version's pull about 2 minutes against T_train about 50 s); the tail
    # re-shard used to skip the rule, and at 212 s put a tp4 replica there
    from pathlib import Path

    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from jigsaw_plugin.workload import load_workload

    spec = load_workload(Path(__file__).parents[1] / "examples" / "workloads" / "c_async2_16gpu.yaml").to_dict()
    pipe = dict(spec["pipelines"][0], prompts_per_step=128, steps=4, staleness=1)
    pipe.pop("gpus", None)
    rtx = dict(remote(0.35), name="rtx4090-remote")
    w = parse_workload({"version": 1, "pipelines": [pipe], "cluster": {"classes": [
        TRAINER, spot("a100-spot", 1.2), spot("l40s-spot", 0.9, gpu={**RTX4090, "name": "l40s", "flops_tflops": 362.0,
                                                                  "hbm_tbps": 0.864, "memory_gb": 48.0}), rtx]}})
    sim = Simulation(w, get_policy("jigsaw"), 0)
    sim.run()
    remote_ids = set(range(20, 28))
    held = [(round(a, 1), devices) for _n, kind, devices, a, _b in sim.world.trace
            if kind == "rollout" and set(devices) & remote_ids]
    assert held == []


def test_replicas_already_running_count_towards_the_pool():
    from jigsaw_plugin.scheduler.state import ReplicaView

    state, p = hand_state(workload([TRAINER, spot("cheap", 1.2)], prompts=32))
    site = trainer_site(state)
    first = activate(state, p, sorted(d for d in state.free if d not in site), 1, staleness=2)
    running = tuple(ReplicaView(i, p.name, (d,), 10, 0, 0.0, 1e6, 256, False, 0.02, 0.0)
                    for i, d in enumerate(first.devices[:2]))
    busy = dataclasses.replace(p, replicas=running)
    again = dataclasses.replace(state, order=(busy,), free=state.free - set(first.devices[:2]))
    more = activate(again, busy, sorted(d for d in again.free if d not in site), 1, staleness=2)
    assert len(more.devices) == len(first.devices) - 2 >= 1


def test_a_single_class_pool_is_left_as_given():
    w = small_workload(pipelines=1, algorithms=("grpo",), agentic=(False,), modes=("async",), staleness=(1,))
    state, p = hand_state(w)
    cands = [3, 1, 2]
    assert activate(state, p, cands, 1).devices == (3, 1, 2)


def test_a_replica_too_small_for_a_class_is_refused_with_the_reason():
    tiny = {"name": "tiny", "flops_tflops": 100.0, "hbm_tbps": 1.0, "memory_gb": 8.0, "link_gbps": 32.0}
    state, p = hand_state(workload([TRAINER, spot("small", 0.1, gpu=tiny), spot("cheap", 1.2)], prompts=32))
    a = activate(state, p, sorted(state.free), 1)
    small = next(o for o in a.offers if o.name == "small")
    assert not small.admitted and "KV cache" in small.reason
    assert "small" not in classes_of(state, a.devices)


def test_a_bad_replica_size_is_a_clear_error():
    state, p = hand_state(workload([TRAINER, spot("cheap", 1.2)]))
    with pytest.raises(SpecError, match="tp"):
        activate(state, p, sorted(state.free), 0)


def test_the_jigsaw_policy_keeps_training_on_the_trainer_site_and_bills_elastic_workers_held():
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    # 32 prompts: the training passes are long enough for the critical pipeline's running
    # stage to grow (critical_loans) onto free devices, which must stay on the trainer site
    w = workload([dict(TRAINER, count=2, gpus_per_node=2), spot("cheap", 1.2, count=4), remote(0.3, count=2)],
                 prompts=32, model="qwen2.5-7b")
    sim = Simulation(w, get_policy("jigsaw"), 0)
    r = sim.run()
    trainer = set(range(2))
    remote_ids = set(range(6, 8))
    for _name, kind, devices, _a, _b in sim.world.trace:
        if kind != "rollout":
            assert set(devices) <= trainer, (kind, devices)
        else:
            assert not set(devices) & remote_ids  # its weight pull breaks staleness 1
    cost = r["cost"]
    assert 0 < cost["elastic"]["total"] < cost["total"]
    assert cost["classes"]["remote"]["held_device_hours"] == 0.0
    assert cost["classes"]["h100"]["held_device_hours"] <= cost["classes"]["h100"]["device_hours"]


def test_the_steps_longest_response_is_the_expected_longest_of_its_samples():
    import numpy as np

    from jigsaw_plugin.predict.history import LengthHistory
    from jigsaw_plugin.scheduler.activation import rollout_demand

    state, p = hand_state(workload([TRAINER, spot("cheap", 1.2)], prompts=32), longest=9000.0)
    lengths = np.arange(1, 2001) * 2  # 2 .. 4000 tokens
    history = LengthHistory(4096)
    for i, n in enumerate(lengths):
        history.record_finished(0, i // 16, 0, int(n))
    d = rollout_demand(dataclasses.replace(p, history=history))
    n = p.spec.samples_per_step  # 512
    assert d.tail_tokens == pytest.approx(np.quantile(lengths, 1 - 1 / (n + 1)))
    assert d.tail_tokens < 9000.0  # below the longest seen, above most of a step's samples
    assert rollout_demand(p).tail_tokens == 9000.0  # no evidence yet: the longest seen


def test_one_on_demand_class_bills_the_same_either_way():
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation

    w = small_workload(gpus=4, pipelines=1, prompts=4, samples=4, steps=1, algorithms=("grpo",), agentic=(False,))
    cost = Simulation(w, get_policy("jigsaw"), 0).run()["cost"]
    assert cost["elastic"]["total"] == pytest.approx(cost["total"])
    assert 0 < cost["classes"]["h100"]["held_device_hours"] <= cost["classes"]["h100"]["device_hours"]
