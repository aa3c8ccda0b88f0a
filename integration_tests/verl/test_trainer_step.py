"""verl's real ``fit`` with ``trainer.v1.trainer_mode=jigsaw``: the hooks fire in verl's order.

What runs is verl 0.9.1's own code: ``get_trainer_cls("jigsaw")`` -> ``JigsawTrainerSync.__init__``
(verl's ``PPOTrainer.__init__``, its ``ReplayBuffer``), ``fit`` -> ``step`` -> ``_step_once``
and every stage method (``_compute_reward_colocate``, ``_balance_batch``, ``_compute_old_log_prob``,
``_compute_ref_log_prob``, ``_compute_values``, ``_compute_advantage``, ``_update_critic``,
``_update_actor``, ``_compute_metrics``), TransferQueue, and a colocated
``RayWorkerGroup`` (``RayResourcePool(use_gpu=False)``, ``create_colocated_worker_cls``,
``spawn``) whose calls go through verl's dispatch and ``tqbridge`` into two Ray worker
processes. What is replaced, because it needs CUDA/NCCL or a vLLM server replica, is listed
in ``cpu_standins.py``; ``PPOTrainer.init()``/``_setup`` (``trainer_base.py:226``) is not run:
it builds the resource pool with ``use_gpu=True`` (``single_controller/ray/base.py:210``)
and fails with "Total available GPUs 0 is less than total desired GPUs" (``base.py:240``).
"""

from __future__ import annotations

import pytest

from conftest import compose_verl

STEP_ORDER = ["gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
              "weight_sync"]
WG_ORDER = ["actor_rollout_compute_log_prob", "actor_rollout_compute_ref_log_prob", "critic_infer_batch",
            "critic_train_mini_batch", "actor_rollout_update_actor"]


@pytest.fixture(scope="module")
def fitted(ray_tq, tiny_model):
    """Two steps of verl's fit on the jigsaw trainer; returns (trainer, agent, wg calls)."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    import cpu_standins as cs
    from jigsaw_plugin.patches import verl_func_generator

    cfg = compose_verl("trainer.v1.trainer_mode=jigsaw", "+jigsaw.pipeline=verl-a", "algorithm.adv_estimator=gae",
                       "actor_rollout_ref.actor.use_kl_loss=true", model_path=tiny_model)
    calls = []

    def observer(wg, method, phase, args, kwargs, output):
        if phase == "start":
            calls.append(method)

    trainer = get_trainer_cls("jigsaw")(config=cfg)
    agent = cs.prepare_trainer(trainer, tiny_model)
    verl_func_generator.add_observer(observer)
    try:
        trainer.fit(agent)
    finally:
        verl_func_generator.remove_observer(observer)
    return trainer, agent, calls


def _stage_events(events, step):
    return [e for e in events if e["hook"] in ("jigsaw_stage_start", "jigsaw_stage_end") and e["step"] == step]


def test_hooks_fire_in_verls_order_every_step(fitted):
    trainer, _, _ = fitted
    events = trainer.jigsaw.reporter.recorder.events
    hooks = [e["hook"] for e in events]
    assert hooks[:3] == ["jigsaw_register_pipeline", "jigsaw_pipeline_start", "jigsaw_step_start"]
    assert hooks[-1] == "jigsaw_pipeline_end"
    assert hooks.count("jigsaw_step_start") == hooks.count("jigsaw_step_end") == 2
    for step in (0, 1):
        stage_events = _stage_events(events, step)
        starts = [e["stage"] for e in stage_events if e["hook"] == "jigsaw_stage_start"]
        assert starts == STEP_ORDER
        # strictly nested: each stage ends before the next starts
        pairs = list(zip(stage_events[::2], stage_events[1::2], strict=True))
        assert all(a["hook"] == "jigsaw_stage_start" and b["hook"] == "jigsaw_stage_end" and a["stage"] == b["stage"]
                   and a["t"] <= b["t"] for a, b in pairs)
    syncs = [e["version"] for e in events if e["hook"] == "jigsaw_weight_sync_end"]
    assert syncs == [1, 2]  # verl's global_steps: the policy version published after each step
    assert trainer.checkpoint_manager.calls.count(("update_weights", 1)) == 1


def test_stage_sizes_are_the_batch_verl_processed(fitted):
    trainer, agent, _ = fitted
    events = trainer.jigsaw.reporter.recorder.events
    per_step = [agent.generated[:4], agent.generated[4:8]]  # 2 prompts x n=2 per step
    for step, generated in enumerate(per_step):
        ends = {e["stage"]: e for e in _stage_events(events, step) if e["hook"] == "jigsaw_stage_end"}
        assert ends["gen"]["samples"] == 4
        assert ends["gen"]["tokens"] == sum(r for _, _, r in generated)  # generated tokens
        seq = sum(p + r for _, p, r in generated)
        for stage in ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"):
            assert (ends[stage]["samples"], ends[stage]["tokens"]) == (4, seq), stage
        assert ends["adv"]["devices"] == []  # host-only stage
        assert ends["update_actor"]["devices"] == [0, 1]  # the worker group's two CPU workers


def test_worker_group_calls_pass_the_patched_choke_point_in_order(fitted):
    _, _, calls = fitted
    data_calls = [c for c in calls if c in WG_ORDER]
    assert data_calls == WG_ORDER * 2


def test_sub_stage_graph_is_built_from_the_run(fitted):
    from jigsaw_plugin.graph import build_from_events

    trainer, _, _ = fitted
    graph = build_from_events(trainer.jigsaw.reporter.recorder.events)
    graph.validate()
    kinds = {n.kind for n in graph.nodes()}
    assert {"old_log_prob_shard", "ref_shard", "values_shard", "adv", "update_critic", "update_actor",
            "weight_sync"} <= kinds
    assert {n.step for n in graph.nodes(kind="update_actor")} == {0, 1}
    assert len(graph.nodes(kind="old_log_prob_shard", step=0)) == 2  # one shard per device of the stage
