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
