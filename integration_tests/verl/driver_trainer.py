"""One verl trainer driver process for test_coordinator.py (run as a script).

It builds verl 0.9.1's jigsaw trainer from verl's own config (``get_trainer_cls("jigsaw")``,
verl's ``PPOTrainer.__init__``) with ``+jigsaw.coordinator``, so the trainer joins the
coordinator's Ray cluster and pool; then it runs the trainer's lifecycle and stage
boundaries (the jigsaw mixin's code: leases, hooks) for a few steps. The stage *bodies* are
sleeps here: verl's real step needs the CPU stack of test_trainer_step.py, whose
TransferQueue is one per cluster. Prints one JSON line: the leases it held (wall clock).
"""

from __future__ import annotations

import json
import sys
import time
import types


def main(address: str, coordinator: str, pipeline: str, steps: int, stage_s: float) -> None:
    from conftest import compose_verl
    from verl.trainer.ppo.v1 import get_trainer_cls

    cfg = compose_verl("trainer.v1.trainer_mode=jigsaw", f"+jigsaw.pipeline={pipeline}",
                       f"+jigsaw.coordinator={coordinator}", f"+jigsaw.address={address}",
                       "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true")
    trainer = get_trainer_cls("jigsaw")(config=cfg)
    client = trainer.jigsaw.client
    leases = []
    acquire, release = client.acquire, client.release

    def timed_acquire(pipeline, purpose, n, timeout_s=None):
        devices = acquire(pipeline, purpose, n, timeout_s)
        leases.append({"purpose": purpose, "devices": list(devices), "start": time.time()})
        return devices

    def timed_release(pipeline, devices):
        leases[-1]["end"] = time.time()
        release(pipeline, devices)

    client.acquire, client.release = timed_acquire, timed_release
    # CPU stand-ins for what PPOTrainer._setup builds on GPUs (see cpu_standins.py)
    trainer.checkpoint_manager = types.SimpleNamespace(update_weights=lambda s: None, sleep_replicas=lambda: None)
    trainer.curr_step_profile = False
    trainer.total_training_steps = steps
    batch = types.SimpleNamespace(tags=[{"seq_len": 10, "response_len": 6}] * 4)

    def body(b, metrics=None):
        time.sleep(stage_s)
        return b

    trainer.on_train_begin()
    for step in range(1, steps + 1):
        trainer.global_steps = step
        trainer.on_step_begin()
        trainer.on_sample_begin()
        time.sleep(stage_s)
        trainer._jigsaw_batch = batch
        trainer.on_sample_end()
        for stage in ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"):
            trainer._jigsaw_stage(stage, body, batch)
        trainer.timing_raw = {}
        trainer.on_step_end()  # weight sync; the last step also ends the pipeline
    print(json.dumps({"pipeline": pipeline, "leases": leases}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
