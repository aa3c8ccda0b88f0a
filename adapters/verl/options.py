"""The ``+jigsaw.*`` options of a verl run, validated eagerly (no verl import).

verl's Hydra config is in struct mode, so the options ride in a new top-level key that the
user adds with ``+``: ``+jigsaw.policy=jigsaw +jigsaw.pipeline=grpo-a``. A bad value is a
:class:`~jigsaw_plugin.errors.SpecError` naming the option, the value and what is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Mapping

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.liveness import LOSS_MODES

__all__ = ["JigsawOptions", "parse_options", "algorithm_of", "train_offload_of", "resolve_staleness", "TRAINER_MODES",
           "OPTION_PREFIX", "OFF_POLICY_THRESHOLD_KEY"]

OPTION_PREFIX = "+jigsaw"
#: verl ``trainer.v1.trainer_mode`` values this adapter registers -> the verl mode it extends.
TRAINER_MODES = {"jigsaw": "sync", "jigsaw_colocate_async": "colocate_async"}
_POLICIES = ("jigsaw", "observe")
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: verl 0.9.1's bound on an async trainer's samples (``trainer/ppo/v1/replay_buffer.py:119``): the
#: model versions a trajectory may span, so a lag of at most ``threshold - 1`` versions.
OFF_POLICY_THRESHOLD_KEY = "trainer.v1.sampler.max_off_policy_threshold"
_VERL_DEFAULT_THRESHOLD = 8  # ppo_trainer.yaml:298


@dataclass(frozen=True)
class JigsawOptions:
    """What a user sets under ``+jigsaw.*`` (all optional).

    :param policy: ``jigsaw`` (record, report to the coordinator, accept its leases) or
        ``observe`` (record the hooks only; verl runs exactly as it would).
    :param pipeline: The pipeline's name, unique among the trainers sharing a coordinator
        (default: ``trainer.experiment_name``).
    :param coordinator: Name of the jigsaw coordinator's Ray actor to join, or ``None`` to run
        without one. Trainers in separate driver processes that name the same coordinator (and
        Ray namespace) share its device pool.
    :param namespace: Ray namespace of the coordinator actor.
    :param address: Ray cluster address of the coordinator (``ray.init(address=...)``) when the
        trainer's own driver starts Ray; ``None`` keeps verl's ``ray_kwargs.ray_init``.
    :param lookahead_s: Look-ahead horizon of the scheduler, seconds (> 0).
    :param events_path: Write every recorded hook event here as JSON lines at the end of the run.
    :param on_coordinator_loss: What the trainer does when its coordinator dies or stops
        answering: ``stop`` (default: the next call raises ``CoordinatorDied`` naming it) or
        ``fallback`` (warn once, then go on with verl's own scheduling on its own devices).
    :param scheduler: The coordinator's policy when this trainer creates it: ``jigsaw``
        (default; ``lookahead_s`` is its look-ahead horizon), ``fifo-lease`` (first-come
        leases) or another registered policy (``verl-sync``: static shares).
    :param pool_devices: Devices in the coordinator's pool when this trainer creates it
        (default: this trainer's own devices).
    :param model_profile: The cost-model profile the policy prices this trainer's stages
        with (default: inferred from the model path, e.g. ``qwen2.5-0.5b``).
    :param staleness: Bounded staleness: how many policy versions a trained sample may lag
        (ECHO-2 / AReaL's bound). ``0`` is on-policy, verl's sync trainer
        (``trainer_mode=jigsaw``); a bound > 0 needs verl's async trainer
        (``trainer_mode=jigsaw_colocate_async``), where it sets verl's own
        ``trainer.v1.sampler.max_off_policy_threshold`` to ``staleness + 1``. ``None``: the
        mode's own (0; or verl's threshold - 1). The pipeline registers with it, so the
        coordinator's policy plans under it (``resolve_staleness``).
    """

    policy: str = "jigsaw"
    pipeline: str | None = None
    coordinator: str | None = None
    namespace: str = "jigsaw"
    address: str | None = None
    lookahead_s: float = 30.0
    events_path: str | None = None
    on_coordinator_loss: str = "stop"
    scheduler: str = "jigsaw"
    pool_devices: int | None = None
    model_profile: str | None = None
    staleness: int | None = None


def _allowed_keys() -> str:
    return ", ".join(f"{OPTION_PREFIX}.{f.name}" for f in fields(JigsawOptions))


def parse_options(raw: Mapping[str, Any] | None, default_pipeline: str | None = None) -> JigsawOptions:
    """Validate the ``jigsaw`` section of a verl config (a plain mapping; ``None`` = empty)."""
    raw = dict(raw or {})
    known = {f.name for f in fields(JigsawOptions)}
    for key in raw:
        if key not in known:
            # a key that would break the one-line message (a newline, not a string) is quoted
            name = f"{OPTION_PREFIX}.{key}" if isinstance(key, str) and key.isprintable() else f"{OPTION_PREFIX}[{key!r}]"
            raise SpecError(name, raw[key], f"one of {_allowed_keys()}")
    policy = raw.get("policy", "jigsaw")
    if policy not in _POLICIES:
        raise SpecError(f"{OPTION_PREFIX}.policy", policy, " | ".join(_POLICIES))
    pipeline = raw.get("pipeline") or default_pipeline
    if pipeline is not None and (not isinstance(pipeline, str) or not _NAME.match(pipeline)):
        raise SpecError(f"{OPTION_PREFIX}.pipeline", pipeline, "1-64 characters of [A-Za-z0-9_.:-]")
    for key in ("coordinator", "namespace", "address", "events_path"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise SpecError(f"{OPTION_PREFIX}.{key}", value, "a non-empty string")
    lookahead = raw.get("lookahead_s", 30.0)
    if isinstance(lookahead, bool) or not isinstance(lookahead, (int, float)) or not 0 < lookahead < float("inf"):
        raise SpecError(f"{OPTION_PREFIX}.lookahead_s", lookahead, "a number of seconds > 0, finite")
    on_loss = raw.get("on_coordinator_loss", "stop")
    if on_loss not in LOSS_MODES:
        raise SpecError(f"{OPTION_PREFIX}.on_coordinator_loss", on_loss, " | ".join(LOSS_MODES))
    scheduler = raw.get("scheduler", "jigsaw")
    _check_scheduler(scheduler)
    pool = raw.get("pool_devices")
    if pool is not None and (isinstance(pool, bool) or not isinstance(pool, int) or pool < 1):
        raise SpecError(f"{OPTION_PREFIX}.pool_devices", pool, "an integer >= 1")
    profile = raw.get("model_profile")
    if profile is not None:
        from jigsaw_plugin.workload.spec import KNOWN_MODELS

        if profile not in KNOWN_MODELS:
            raise SpecError(f"{OPTION_PREFIX}.model_profile", profile, " | ".join(KNOWN_MODELS))
    staleness = raw.get("staleness")
    if staleness is not None and (isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0):
        raise SpecError(f"{OPTION_PREFIX}.staleness", staleness,
                        "an integer >= 0 (policy versions a trained sample may lag; > 0 needs "
                        "trainer.v1.trainer_mode=jigsaw_colocate_async)")
    return JigsawOptions(
        policy=policy,
        pipeline=pipeline,
        coordinator=raw.get("coordinator"),
        namespace=raw.get("namespace") or "jigsaw",  # null (Hydra's ~ or null) = the default
        address=raw.get("address"),
        lookahead_s=float(lookahead),
        events_path=raw.get("events_path"),
        on_coordinator_loss=on_loss,
        scheduler=scheduler,
        pool_devices=pool,
        model_profile=profile,
        staleness=staleness,
    )


def resolve_staleness(options: JigsawOptions, base_mode: str, sampler=None) -> int:
    """The staleness bound this verl run honours, checked against its trainer mode.

    :param base_mode: The verl mode the trainer extends (``TRAINER_MODES``' values; the v0
        trainer is ``sync``).
    :param sampler: verl's ``trainer.v1.sampler`` config node (an async trainer's bound lives
        there). With ``options.staleness`` set, its ``max_off_policy_threshold`` is set to
        ``staleness + 1`` (verl drops, or with ``max_off_policy_strategy=wait`` awaits, every
        trajectory spanning more versions: ``replay_buffer.py:521-552``).
    :raises SpecError: a bound > 0 on verl's sync trainer (on-policy by construction), a
        threshold the user set that disagrees with the option, or an async run without any bound.
    """
    field = f"{OPTION_PREFIX}.staleness"
    wanted = options.staleness
    if base_mode == "sync":
        if wanted not in (None, 0):
            raise SpecError(field, wanted,
                            "0 with trainer.v1.trainer_mode=jigsaw (verl's sync trainer trains on-policy); a bound > 0 "
                            "runs with trainer.v1.trainer_mode=jigsaw_colocate_async (verl's colocate_async trainer "
                            f"honours it through {OFF_POLICY_THRESHOLD_KEY} = staleness + 1)")
        return 0
    threshold = None if sampler is None else sampler.get("max_off_policy_threshold", None)
    if wanted is None:
        if threshold is None:
            raise SpecError(field, None, f"an integer >= 0: {OFF_POLICY_THRESHOLD_KEY} is null (verl bounds "
                                         "nothing), and the coordinator's policy plans with a bound")
        return int(threshold) - 1
    if threshold not in (None, _VERL_DEFAULT_THRESHOLD, wanted + 1):
        raise SpecError(field, wanted, f"{int(threshold) - 1}, or drop {OFF_POLICY_THRESHOLD_KEY}={threshold} "
                                       f"(it bounds the lag at {int(threshold) - 1}; the option sets it to staleness + 1)")
    if sampler is None:
        raise SpecError(field, wanted, f"a bound on a verl config that has {OFF_POLICY_THRESHOLD_KEY}")
    sampler.max_off_policy_threshold = wanted + 1
    return wanted


def _check_scheduler(name) -> None:
    from jigsaw_plugin.runtime.lease_schedulers import FIFO_LEASE
    from jigsaw_plugin.scheduler.base import policy_names

    allowed = (FIFO_LEASE, *policy_names())
    if name not in allowed:
        raise SpecError(f"{OPTION_PREFIX}.scheduler", name, " | ".join(allowed))


def train_offload_of(actor) -> str:
    """Where verl's actor keeps its training state (``workload.TRAIN_OFFLOAD``), from
    ``actor_rollout_ref.actor``: ``fsdp_config.offload_policy`` (FSDP2's CPUOffloadPolicy:
    weights, gradients and optimizer on the host) is ``full``. ``param_offload`` and
    ``optimizer_offload`` are not: verl loads the state back onto the devices for each pass
    (docs/calibration.md)."""
    fsdp = actor.get("fsdp_config") or {}
    return "full" if bool(fsdp.get("offload_policy", False)) else "none"


def algorithm_of(adv_estimator: str, use_critic: bool, use_reference: bool) -> str:
    """The jigsaw algorithm (``jigsaw_plugin.algorithms``) whose stage set a verl run has.

    The stage set is what the sub-stage graph needs: a critic means ``ppo`` (values,
    update_critic), a reference pass without one ``grpo`` (``reinforce`` for verl's
    REINFORCE-family estimators), neither ``dapo``.
    """
    if use_critic:
        return "ppo"
    if not use_reference:
        return "dapo"
    return "reinforce" if str(adv_estimator).startswith(("reinforce", "rloo")) else "grpo"
