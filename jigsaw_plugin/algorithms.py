"""Which training-side stages each RL algorithm runs after generation, in verl's order."""

__all__ = ["STAGES_BY_ALGORITHM", "FORWARD_STAGES", "UPDATE_STAGES", "HOST_STAGES", "early_stages"]

# weight_sync closes every step
STAGES_BY_ALGORITHM = {
    "grpo": ("old_log_prob", "ref", "adv", "update_actor", "weight_sync"),
    "dapo": ("old_log_prob", "adv", "update_actor", "weight_sync"),  # no KL: no reference pass
    "ppo": ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "weight_sync"),
    "reinforce": ("old_log_prob", "ref", "adv", "update_actor", "weight_sync"),
}
FORWARD_STAGES = ("old_log_prob", "ref", "values")
UPDATE_STAGES = ("update_critic", "update_actor")
HOST_STAGES = ("adv",)


def early_stages(stages) -> tuple[str, ...]:
    """The stages of ``stages`` an early pass may run (``RunStage.early``): the forward
    passes before the first stage that needs the whole batch (advantages, updates). None of
    them changes a weight."""
    out = []
    for stage in stages:
        if stage not in FORWARD_STAGES:
            break
        out.append(stage)
    return tuple(out)
