"""The v0 trainer (``trainer.use_v1=false``): ``RayPPOTrainer`` observed through verl's timers.

verl's own ``RayPPOTrainer.__init__`` runs with the jigsaw flag; the patch attaches the
observer, which replaces ``ray_trainer.marked_timer`` (the global ``fit`` looks up at every
stage, ``ray_trainer.py:1508-1715``). The stage bodies below are worker-group calls on a real
CPU ``RayWorkerGroup`` (verl's dispatch, through the patched ``func_generator``) wrapped in
that global exactly as ``fit`` wraps them; ``fit`` itself is not run here: its rollout needs
``AgentLoopManager`` with vLLM replicas (GPU-only, see test_router.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import compose_verl


@pytest.fixture(scope="module")
def v0(ray_tq, tiny_model):
    import ray
    import torch
    from tensordict import TensorDict
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.utils import Role

    import cpu_standins as cs

    cfg = compose_verl("trainer.use_v1=false", "trainer.v1.trainer_mode=jigsaw", "+jigsaw.pipeline=verl-v0",
                       "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true", model_path=tiny_model)
    rows = [{"prompt": i} for i in range(4)]
    trainer = ray_trainer.RayPPOTrainer(
        config=cfg, tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=1),
        role_worker_mapping={Role.ActorRollout: cs.ActorStandIn},
        resource_pool_manager=ResourcePoolManager(resource_pool_spec={"global_pool": [2]}, mapping={}),
        train_dataset=rows, val_dataset=rows, collate_fn=lambda b: b)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(
        cls=ray.remote(cs.ActorStandIn), model_path=tiny_model), device_name="cpu")
    wg.init_model()
    ids = torch.randint(2, 2000, (4, 12))
    data = TensorDict({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, batch_size=[4])
    timing = {}
    timer = ray_trainer.marked_timer  # what fit() looks up at each stage
    with timer("step", timing):
        with timer("gen", timing):
            pass  # the agent loop's rollout (vLLM replicas: GPU-only)
        with timer("old_log_prob", timing):
            wg.compute_log_prob(data)
        with timer("ref", timing):
            wg.compute_ref_log_prob(data)
        with timer("adv", timing):
            pass
        with timer("update_weights", timing):
            pass
    yield trainer, timing
    trainer.jigsaw_v0.uninstall()


def test_v0_trainer_gets_the_observer_from_verls_own_constructor(v0):
    from verl.trainer.ppo import ray_trainer

    trainer, _ = v0
    assert trainer.jigsaw_v0.session.pipeline == "verl-v0"
    assert ray_trainer.marked_timer == trainer.jigsaw_v0.timer


def test_v0_stages_fire_with_sizes_from_the_worker_group_calls(v0):
    trainer, timing = v0
    events = trainer.jigsaw_v0.session.reporter.recorder.events
    hooks = [(e["hook"], e.get("stage")) for e in events if e["hook"] != "jigsaw_register_pipeline"]
    assert hooks == [("jigsaw_pipeline_start", None), ("jigsaw_step_start", None),
                     ("jigsaw_stage_start", "gen"), ("jigsaw_stage_end", "gen"),
                     ("jigsaw_stage_start", "old_log_prob"), ("jigsaw_stage_end", "old_log_prob"),
                     ("jigsaw_stage_start", "ref"), ("jigsaw_stage_end", "ref"),
                     ("jigsaw_stage_start", "adv"), ("jigsaw_stage_end", "adv"),
                     ("jigsaw_stage_start", "weight_sync"), ("jigsaw_stage_end", "weight_sync"),
                     ("jigsaw_step_end", None)]
    ends = {e["stage"]: e for e in events if e["hook"] == "jigsaw_stage_end"}
    assert (ends["old_log_prob"]["samples"], ends["old_log_prob"]["tokens"]) == (4, 48)
    assert ends["gen"]["samples"] == 0  # gen does not go through a worker group in v0
    assert {"step", "old_log_prob", "ref", "update_weights"} <= set(timing)  # verl's own timer still runs
