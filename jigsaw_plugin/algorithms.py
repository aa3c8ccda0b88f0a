"""Which training-side stages each RL algorithm runs after generation, in verl's order."""

__all__ = ["STAGES_BY_ALGORITHM", "FORWARD_STAGES", "UPDATE_STAGES", "HOST_STAGES", "ALONGSIDE", "early_stages",
           "may_run_alongside", "runs_on_gang", "waits_for_alongside"]

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
#: A stage that may run alongside the stage after it, on a gang of its own, neither reading
#: what the other writes: the actor's log-prob pass and the reference model's pass both
#: read the generated batch; the critic's update reads the values and returns the
#: advantage step wrote, the actor's update the advantages. OpenRLHF runs both pairs at
#: once (``make_experience`` dispatches the actor, critic and reference passes together;
#: ``PPOTrainer.ppo_train`` launches the critic's ``fit``, runs the actor's, then gathers
#: the critic's); verl runs each in turn (``RayPPOTrainer.fit``), so only an executor that
#: declares it (``SchedulerState.concurrent_stages``) takes such a stage.
ALONGSIDE = {"old_log_prob": "ref", "update_critic": "update_actor"}


def runs_on_gang(stage: str | None) -> bool:
    """``stage`` is a training-side pass on a gang of devices: not the host-side advantage
    step, not the weight sync (one device), not None (nothing next)."""
    return bool(stage) and stage not in HOST_STAGES and stage != "weight_sync"


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


def may_run_alongside(stage: str, stages, index: int) -> bool:
    """Whether ``stage``, at ``index`` of ``stages``, may run alongside the stage after it
    (``ALONGSIDE``): that one must be its partner."""
    partner = ALONGSIDE.get(stage)
    return partner is not None and index + 1 < len(stages) and stages[index + 1] == partner


def waits_for_alongside(stage: str, alongside: str | None) -> bool:
    """Whether ``stage``, next in the sequence, waits for the stage running ``alongside``
    it: every stage does but that one's partner."""
    return alongside is not None and stage != ALONGSIDE[alongside]
