"""A rollout replica whose devices straddle a node boundary runs its all-reduces over the
node NICs (the simulator prices it so), and the jigsaw policy cuts its home into replicas
that each sit on one node."""

from __future__ import annotations

from jigsaw_plugin.costmodel.predictor import spans_extra_nodes
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.workload import parse_workload


def _offset_home(steps: int = 1):
    """Two pipelines on two nodes of 8: a 1.5B on devices 0-1, then a 7B whose tp4 home
    (devices 2-13) starts two devices into node 0: cut in order, its replicas would be
    2-5, 6-9 (across the boundary) and 10-13."""
    def pipe(name, model, gpus, tp):
        return {"name": name, "model": model, "algorithm": "grpo", "mode": "sync", "prompts_per_step": 16,
                "samples_per_prompt": 4, "max_response_len": 2048, "gpus": gpus, "rollout_tp": tp,
                "prompt_len": {"dist": "const", "value": 200},
                "response_len": {"dist": "lognormal", "median": 400, "sigma": 0.6, "min": 1}, "steps": steps}
    return parse_workload({"version": 1, "cluster": {"gpus": 16, "gpu": "h100", "gpus_per_node": 8},
                           "pipelines": [pipe("small", "qwen2.5-1.5b", 2, 1), pipe("big", "qwen2.5-7b", 12, 4)]})


def _rollouts(sim):
    return [(name, devs) for name, cat, devs, _, _ in sim.world.trace if cat == "rollout"]


def test_verl_sync_cuts_its_home_in_rank_order_and_pays_the_nics_for_it():
    # verl's rank order: the tp group 6-9 spans nodes 0 and 1; its decode steps are priced
    # with the all-reduces over the NICs (an aligned tp4 replica's are not)
    sim = Simulation(_offset_home(), get_policy("verl-sync"), seed=0)
    sim.run()
    big = [devs for name, devs in _rollouts(sim) if name.startswith("big")]
    assert (6, 7, 8, 9) in big
    pricer = sim.world.pricer
    across = pricer.decode_step_s("big", (6, 7, 8, 9), 128, 128 * 600.0)
    inside = pricer.decode_step_s("big", (10, 11, 12, 13), 128, 128 * 600.0)
    assert across > inside
    model = sim.world.pipelines["big"].model
    assert inside == sim.world.cost.decode_step_s(model, 4, 128, 128 * 600.0)
    assert across == sim.world.cost.decode_step_s(model, 4, 128, 128 * 600.0, cross_node=True)


def test_jigsaw_cuts_a_home_into_replicas_on_one_node_first():
    # the offset home 2-13 on nodes of 8 at tp4: one replica on each node (2-5, 8-11),
    # then what is left (6, 7, 12, 13): the count rank order gives, two fewer straddlers
    sim = Simulation(_offset_home(), get_policy("jigsaw"), seed=0)
    pol, state = sim.policy, sim.world.snapshot()
    home = list(range(2, 14))
    assert pol._node_groups(state, home, 4) == [(2, 3, 4, 5), (8, 9, 10, 11), (6, 7, 12, 13)]
    assert pol._node_groups(state, home, 2) == [(2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13)]
    # wider than a node: whole nodes first, in the order given; a part-node only as the rest
    assert pol._node_groups(state, list(range(16)), 8) == [tuple(range(8)), tuple(range(8, 16))]
    assert pol._node_groups(state, list(range(4, 16)), 8) == [tuple(range(8, 16))]
    assert pol._node_groups(state, list(range(2, 10)), 8) == [tuple(range(2, 10))]  # no node holds one


def test_jigsaw_places_its_replicas_on_one_node_where_a_node_holds_them():
    sim = Simulation(_offset_home(steps=2), get_policy("jigsaw"), seed=0)
    res = sim.run()
    big = [devs for name, devs in _rollouts(sim) if name.startswith("big")]
    assert (8, 9, 10, 11) in big and (6, 7, 8, 9) not in big  # rank order's straddler: 6-9
    assert res["pipelines"]["big"]["samples"] == 2 * 64


def _mixed_nodes():
    """A pool of two classes whose nodes differ in size: 6 devices in nodes of 4 (node 0:
    devices 0-3, node 1: 4-5, a node the class does not fill), then 8 in one node of 8
    (node 2: devices 6-13). Numbered by the first class's node size, devices 6-7 and 8-13
    would sit on two different nodes."""
    def pipe(name, model, gpus, tp, steps):
        return {"name": name, "model": model, "algorithm": "grpo", "mode": "sync", "prompts_per_step": 16,
                "samples_per_prompt": 4, "max_response_len": 2048, "gpus": gpus, "rollout_tp": tp,
                "prompt_len": {"dist": "const", "value": 200},
                "response_len": {"dist": "lognormal", "median": 400, "sigma": 0.6, "min": 1}, "steps": steps}
    return parse_workload({"version": 1, "cluster": {"classes": [
        {"name": "small-nodes", "gpu": "h100", "count": 6, "gpus_per_node": 4},
        {"name": "big-node", "gpu": "h100", "count": 8, "gpus_per_node": 8}]},
        "pipelines": [pipe("small", "qwen2.5-1.5b", 6, 1, 1), pipe("big", "qwen2.5-7b", 8, 4, 1)]})


def test_each_class_is_laid_out_in_nodes_of_its_own_size():
    cluster = _mixed_nodes().cluster
    assert cluster.device_nodes() == (0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2)
    assert cluster.node_sizes() == (4, 4, 8) and cluster.largest_node == 8
    single = parse_workload({"version": 1, "cluster": {"gpus": 12, "gpu": "h100", "gpus_per_node": 8},
                             "pipelines": _offset_home().to_dict()["pipelines"][:1]}).cluster
    assert single.device_nodes() == tuple(d // 8 for d in range(12)) and single.node_sizes() == (8, 8)


def test_a_replica_on_one_node_of_a_class_with_larger_nodes_is_priced_on_one_node():
    sim = Simulation(_mixed_nodes(), get_policy("jigsaw"), seed=0)
    state = sim.world.snapshot()
    assert [d.node for d in state.devices] == list(sim.world.nodes)
    assert state.gpus_per_node == 8 and state.node_size(1) == 4 and state.node_size(2) == 8
    pricer, model = sim.world.pricer, sim.world.pipelines["big"].model
    kv = 64 * 600.0
    # 6-9 and 10-13 are both on node 2; 4-7 spans nodes 1 and 2
    assert pricer.decode_step_s("big", (6, 7, 8, 9), 64, kv) == pricer.decode_step_s("big", (10, 11, 12, 13), 64, kv)
    assert pricer.decode_step_s("big", (6, 7, 8, 9), 64, kv) == sim.world.cost.decode_step_s(model, 4, 64, kv)
    assert pricer.decode_step_s("big", (4, 5, 6, 7), 64, kv) == sim.world.cost.decode_step_s(
        model, 4, 64, kv, cross_node=True)
    assert not spans_extra_nodes((6, 7, 8, 9), 8, sim.world.nodes) and spans_extra_nodes((6, 7, 8, 9), 8)


def test_jigsaw_cuts_groups_by_each_nodes_own_size():
    sim = Simulation(_mixed_nodes(), get_policy("jigsaw"), seed=0)
    pol, state = sim.policy, sim.world.snapshot()
    # tp8: the node of 8 holds one; the nodes of 4 hold none and are not whole-node pairs (node 1 is part-filled)
    assert pol._node_groups(state, list(range(14)), 8) == [tuple(range(6, 14))]
    # tp4: one on node 0, two on node 2; node 1's two devices are left over
    assert pol._node_groups(state, list(range(14)), 4) == [(0, 1, 2, 3), (6, 7, 8, 9), (10, 11, 12, 13)]


def test_on_a_pool_of_several_classes_a_group_goes_to_the_fastest_class_and_is_priced_on_it():
    # 4 H100 (one node) and 8 slower L40S-like devices (one node of 8): a 4-wide group goes
    # to the H100 node though the L40S node has more free devices, and a plan on the L40S
    # node is priced on the L40S's cost model, not the first class's
    from jigsaw_plugin.scheduler.jigsaw.round import Round

    slow = {"name": "slow", "flops_tflops": 362.0, "hbm_tbps": 0.864, "memory_gb": 48.0, "link_gbps": 32.0}
    spec = _mixed_nodes().to_dict()
    spec["cluster"] = {"classes": [{"name": "fast", "gpu": "h100", "count": 4, "gpus_per_node": 4},
                                   {"name": "slow", "gpu": slow, "count": 8, "gpus_per_node": 8}]}
    spec["pipelines"][0]["gpus"], spec["pipelines"][1]["gpus"] = 4, 8
    sim = Simulation(parse_workload(spec), get_policy("jigsaw"), seed=0)
    pol, state = sim.policy, sim.world.snapshot()
    home, owner = pol._homes(state)
    rnd = Round(state, home, owner)
    big = state.pipelines["big"]
    assert pol._node_group(rnd, big, list(range(12)), 4) == (0, 1, 2, 3)
    assert pol._node_group(rnd, big, list(range(4, 12)), 4) == (4, 5, 6, 7)
    fast, slow_cost = state.cost_of((0, 1, 2, 3)), state.cost_of((4, 5, 6, 7))
    assert fast is state.classes[0].cost and slow_cost is state.classes[1].cost
    assert slow_cost.decode_step_s(big.model, 4, 1, 0.0) > fast.decode_step_s(big.model, 4, 1, 0.0)
    assert state.class_costs() == (fast, slow_cost)


def _home_left_over(spare: int):
    """Nodes of 4 A100s: a 0.5B on devices 0-1, then a 32B of 8 requests whose tp4 home
    (devices 2-9) holds one node-local group (4-7) and two leftovers (2-3 on node 0, 8-9
    on node 2); ``spare`` devices more after it (10, 11, ...: node 2's rest)."""
    def pipe(name, model, gpus, tp, n):
        return {"name": name, "model": model, "algorithm": "grpo", "mode": "sync", "prompts_per_step": n,
                "samples_per_prompt": 4, "max_response_len": 512, "gpus": gpus, "rollout_tp": tp,
                "prompt_len": {"dist": "const", "value": 200},
                "response_len": {"dist": "lognormal", "median": 200, "sigma": 0.4, "min": 1}, "steps": 1}
    return parse_workload({"version": 1, "cluster": {"gpus": 10 + spare, "gpu": "a100", "gpus_per_node": 4},
                           "pipelines": [pipe("small", "qwen2.5-0.5b", 2, 2, 8), pipe("big", "qwen2.5-32b", 8, 4, 2)]})


def test_jigsaw_borrows_a_nodes_spare_devices_before_it_cuts_its_home_across_nodes():
    # the home's 8-9 and the spare 10-11 of their node make a node-local tp4 (odd_workloads
    # seed 393); the home's own leftovers 2-3 and 8-9 would straddle nodes 0 and 2
    sim = Simulation(_home_left_over(spare=4), get_policy("jigsaw"), seed=0)
    sim.run()
    big = [devs for name, devs in _rollouts(sim) if name.startswith("big")]
    assert (8, 9, 10, 11) in big and (2, 3, 8, 9) not in big
    assert not any(sim.world.snapshot().cross_node(d) for d in big)


def test_jigsaw_cuts_its_home_across_nodes_where_no_node_has_spare_devices():
    # no spare device: the straddling group is the only second replica the home holds
    sim = Simulation(_home_left_over(spare=0), get_policy("jigsaw"), seed=0)
    sim.run()
    big = [devs for name, devs in _rollouts(sim) if name.startswith("big")]
    assert (4, 5, 6, 7) in big and (2, 3, 8, 9) in big


def test_the_state_says_which_device_sets_straddle_nodes():
    state = Simulation(_home_left_over(spare=4), get_policy("jigsaw"), seed=0).world.snapshot()
    assert state.cross_node((2, 3, 8, 9)) and state.cross_node((3, 4))
    assert not state.cross_node((8, 9, 10, 11)) and not state.cross_node((5,))
    assert not state.cross_node(tuple(range(0, 8)))  # two whole nodes: as few as 8 can span


def test_the_state_counts_a_replicas_nodes_against_their_own_size_as_the_pricer_does():
    # 4 devices in nodes of 2 (nodes 0-1), then 8 in a node of 8: a tp4 on 0-3 spans the
    # two nodes a width of 4 needs there (not over the NICs beyond need); 2-5 spans three
    spec = _mixed_nodes().to_dict()
    spec["cluster"] = {"classes": [{"name": "pairs", "gpu": "h100", "count": 4, "gpus_per_node": 2},
                                   {"name": "eight", "gpu": "h100", "count": 8, "gpus_per_node": 8}]}
    spec["pipelines"][0]["gpus"] = 4
    sim = Simulation(parse_workload(spec), get_policy("jigsaw"), seed=0)
    state, pricer = sim.world.snapshot(), sim.world.pricer
    model, kv = sim.world.pipelines["big"].model, 64 * 600.0
    for devices in ((0, 1, 2, 3), (2, 3, 4, 5), (4, 5, 6, 7), (4, 5, 6, 7, 8, 9, 10, 11)):
        priced = pricer.decode_step_s("big", devices, 64, kv)
        across = state.cross_node(devices)
        assert priced == state.cost_of(devices).decode_step_s(model, len(devices), 64, kv, cross_node=across)
    assert not state.cross_node((0, 1, 2, 3)) and state.cross_node((2, 3, 4, 5))
