"""Where each pipeline's chain went (``chain_split`` in every result JSON): its time to its
finish split into generation, training, weight syncs and waiting, beside its floor (the
parts of ``critical_path_s``, ``Bounds.chains``)."""

from types import SimpleNamespace

import pytest

from jigsaw_plugin.core.bounds import Bounds, ChainFloor, chain_split
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim.engine import Simulation
from sim_helpers import small_workload

PARTS = ("generation_s", "training_s", "weight_sync_s", "waiting_s")


def _executor(mode: str, trace: list, name: str = "my pipe", finish: float = 10.0):
    """A finished executor as ``chain_split`` reads it: its record and its pipelines (a
    hand-built state, as a policy's unit tests build theirs)."""
    p = SimpleNamespace(name=name, spec=SimpleNamespace(mode=mode), finished_t=finish)
    return SimpleNamespace(trace=trace, order=[p])


# a rollout 0-4, an early log-prob pass 3-5 beside its tail, the update 5-7, a weight sync
# 8-9, another pipeline's pass (not counted) and a pass past the finish (clipped)
TRACE = [("my pipe rollout r0", "rollout", (0, 1), 0.0, 4.0),
         ("my pipe old_log_prob s0", "old_log_prob", (2,), 3.0, 5.0),
         ("my pipe update_actor s0", "update_actor", (0, 1, 2), 5.0, 7.0),
         ("my pipe weight_sync s0", "weight_sync", (0,), 8.0, 9.0),
         ("other update_actor s0", "update_actor", (3,), 0.0, 10.0),
         ("my pipe rollout r1", "rollout", (3,), 9.5, 12.0)]
BOUNDS = Bounds(1.0, 1.0, 6.0, 6.0, chains=(ChainFloor("my pipe", 2.0, 3.0, 1.0),))


def test_a_synchronous_pipelines_rollout_is_its_chain_where_a_pass_runs_beside_it():
    got = chain_split(_executor("sync", TRACE), BOUNDS)["my pipe"]
    assert {k: got[k] for k in PARTS} == pytest.approx(
        {"generation_s": 4.5, "training_s": 3.0, "weight_sync_s": 1.0, "waiting_s": 1.5})
    assert got["finish_s"] == 10.0
    assert (got["floor_s"], got["generation_floor_s"], got["training_floor_s"], got["weight_sync_floor_s"]) == \
        pytest.approx((6.0, 2.0, 3.0, 1.0))


def test_an_asynchronous_pipelines_training_is_its_chain_where_a_rollout_runs_beside_it():
    got = chain_split(_executor("async", TRACE), BOUNDS)["my pipe"]
    assert {k: got[k] for k in PARTS} == pytest.approx(
        {"generation_s": 3.5, "training_s": 4.0, "weight_sync_s": 1.0, "waiting_s": 1.5})


def test_zero_length_records_count_for_nothing_and_a_pipeline_with_no_floor_has_zeros():
    ex = _executor("sync", [("my pipe update_actor s0", "update_actor", (0,), 2.0, 2.0)], finish=3.0)
    got = chain_split(ex, Bounds(1.0, 1.0, 1.0, 1.0))["my pipe"]
    assert got["waiting_s"] == 3.0 and got["training_s"] == 0.0 and got["floor_s"] == 0.0


@pytest.mark.parametrize("modes", [("sync", "sync"), ("sync", "async")])
def test_a_simulated_runs_parts_sum_to_each_finish_and_no_chain_beats_its_floor(modes):
    wl = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=3, agentic=(False, True),
                        algorithms=("grpo", "ppo"), modes=modes, staleness=tuple(int(m == "async") for m in modes),
                        median=200)
    for policy in ("verl-sync", "jigsaw"):
        r = Simulation(wl, get_policy(policy), seed=0).run()
        chains = r["chain_split"]
        assert set(chains) == set(r["pipelines"])
        for name, c in chains.items():
            assert all(c[k] >= -1e-6 for k in PARTS), (policy, name, c)
            assert sum(c[k] for k in PARTS) == pytest.approx(c["finish_s"]), (policy, name)
            assert c["finish_s"] >= c["floor_s"] - 1e-6, (policy, name, c)
            assert c["floor_s"] == pytest.approx(c["generation_floor_s"] + c["training_floor_s"]
                                                 + c["weight_sync_floor_s"])
        assert max(c["floor_s"] for c in chains.values()) == pytest.approx(r["bounds"]["critical_path_s"])
        assert max(c["finish_s"] for c in chains.values()) == pytest.approx(r["makespan_s"])
