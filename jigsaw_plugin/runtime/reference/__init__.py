"""The reference GRPO pipeline's training side: what ``LiveWorld`` runs for the training
stages of a real (CPU) run (docs/reference_pipeline.md).

- ``reward``: deterministic rule rewards on token ids (the model is random and has no
  tokenizer, so the rule is on ids): the fraction of generated
  tokens in a target set (ids below 1024 for the pipeline);
- ``grpo``: group-normalised advantages and the clipped token-level policy-gradient loss;
- ``trainer``: ``ReferenceTrainer``, the tiny Qwen2 policy + frozen reference + AdamW, and
  ``make_trainer_actor``, its Ray actor;
- ``stage_runner``: ``ReferenceStageRunner``, the async ``stage_runner`` of ``LiveWorld``;
- ``microbatch`` / ``micro_stage``: training stages as micro-batch sub-stages, resized or
  paused between micro-batches by a grant callback, with updates that do not depend on it;
- ``bench_microbatch``: ``python -m`` it to time micro-batches at width 1 and 2.

Importing this package imports neither torch, transformers nor Ray: they are imported when
a trainer, a loss or an actor is made.
"""

from jigsaw_plugin.runtime.reference.grpo import grpo_advantages, policy_loss
from jigsaw_plugin.runtime.reference.microbatch import (
    DeviceGrant,
    GrantRequest,
    MicroBatch,
    MicroBatchPlan,
    MicroBatchRecord,
    forward_plan,
    stage_devices_grant,
    update_plan,
)
from jigsaw_plugin.runtime.reference.reward import TokenSetReward, low_id_reward
from jigsaw_plugin.runtime.reference.stage_runner import ReferenceStageRunner, StageRecord
from jigsaw_plugin.runtime.reference.trainer import ReferenceTrainer, collate, make_trainer_actor

__all__ = [
    "DeviceGrant",
    "GrantRequest",
    "MicroBatch",
    "MicroBatchPlan",
    "MicroBatchRecord",
    "ReferenceStageRunner",
    "ReferenceTrainer",
    "StageRecord",
    "TokenSetReward",
    "collate",
    "forward_plan",
    "grpo_advantages",
    "low_id_reward",
    "make_trainer_actor",
    "policy_loss",
    "stage_devices_grant",
    "update_plan",
]
