"""The hook contract: every ``jigsaw_*`` hook, grouped by phase.

Hosts (the verl and OpenRLHF adapters, the simulator, the Ray runtime) *call* these hooks;
plugins *implement* them. Conventions that hold for every hook:

- Callers pass keyword arguments only; an implementation may accept any subset of a hook's
  parameters, by name.
- ``t`` is seconds on the caller's clock: simulated time in the simulator, wall time since
  the run started in a real run.
- ``devices`` is a tuple of device ids (ints, indices into the caller's device pool).
- ``pipeline`` is the pipeline's name, unique within a run; ``step`` counts from 0.
- Unless a hook says otherwise, results are collected into a list that the caller ignores
  (observation hooks); ``firstresult`` hooks stop at the first non-``None`` result.
"""

from __future__ import annotations

from typing import Any

import pluggy

__all__ = ["hookspec", "hookimpl", "PROJECT", "STAGES", "ABORT_REASONS", "HOOK_NAMES"]

PROJECT = "jigsaw_plugin"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Stage kinds of an RL step, in the order a synchronous step runs them, plus weight sync.
STAGES = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "weight_sync",
)

#: Why a rollout request was aborted (``jigsaw_request_aborted``'s ``reason``).
ABORT_REASONS = ("migrate", "preempt", "fault", "weight_update")


# --------------------------------------------------------------------------------------
# Pipeline lifecycle
# --------------------------------------------------------------------------------------


@hookspec(historic=True)
def jigsaw_register_pipeline(pipeline: str, spec: dict) -> None:
    """Announce a pipeline, once, before its first step.

    Historic: pluggy remembers the call and replays it to every plugin registered later,
    so a late plugin still learns of every pipeline. Callers must use
    ``pm.hook.jigsaw_register_pipeline.call_historic(kwargs=...)`` (or
    :func:`jigsaw_plugin.manager.call`, which does this).

    :param pipeline: The pipeline's name, unique within a run.
    :param spec: The pipeline's description as a plain, JSON-serialisable dict (at least
        ``name``; usually the workload spec's fields such as ``algorithm``, ``model``).

    Return values are ignored.
    """


@hookspec
def jigsaw_pipeline_start(pipeline: str, t: float) -> None:
    """Called when a pipeline starts running (before its first ``jigsaw_step_start``).

    :param pipeline: The pipeline's name.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_pipeline_end(pipeline: str, t: float) -> None:
    """Called when a pipeline has finished its last step (after its last ``jigsaw_step_end``).

    :param pipeline: The pipeline's name.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


# --------------------------------------------------------------------------------------
# Steps and stages
# --------------------------------------------------------------------------------------


@hookspec
def jigsaw_step_start(pipeline: str, step: int, t: float) -> None:
    """Called when a pipeline's step begins (before its first stage starts).

    :param pipeline: The pipeline's name.
    :param step: The step index, from 0.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_step_end(pipeline: str, step: int, t: float) -> None:
    """Called when a pipeline's step is complete (after its last stage ends).

    :param pipeline: The pipeline's name.
    :param step: The step index, from 0.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_stage_start(
    pipeline: str,
    step: int,
    stage: str,
    devices: tuple[int, ...],
    samples: int,
    tokens: int,
    t: float,
) -> None:
    """Called when a stage of a step starts on its devices.

    :param pipeline: The pipeline's name.
    :param step: The step index, from 0.
    :param stage: One of :data:`STAGES`.
    :param devices: The device ids the stage runs on; empty for host-only stages (``adv``).
    :param samples: Number of samples (responses) the stage processes.
    :param tokens: Number of tokens the stage processes, as known at the start (for
        ``gen``: prompt tokens). A forward stage may start more than once in a step: early
        passes over the trajectories finished so far, then its own pass over the rest
        (``RunStage.early``, simulator only); each reports the tokens it reads.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_stage_end(
    pipeline: str,
    step: int,
    stage: str,
    devices: tuple[int, ...],
    samples: int,
    tokens: int,
    t: float,
) -> None:
    """Called when a stage of a step has finished and its devices are free.

    :param pipeline: The pipeline's name.
    :param step: The step index, from 0.
    :param stage: One of :data:`STAGES`.
    :param devices: The device ids the stage ran on.
    :param samples: Number of samples (responses) the stage processed.
    :param tokens: Number of tokens the stage processed (for ``gen``: generated tokens).
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


# --------------------------------------------------------------------------------------
# Rollout requests (one request = one turn of one sample)
# --------------------------------------------------------------------------------------


@hookspec
def jigsaw_request_submitted(
    pipeline: str,
    step: int,
    request_id: Any,
    turn: int,
    replica: Any,
    prompt_tokens: int,
    max_tokens: int,
    t: float,
) -> None:
    """Called when a generation request is submitted to a rollout replica.

    Also called when a request is resubmitted after an abort or a migration (with the
    generated prefix counted in ``prompt_tokens``).

    :param pipeline: The pipeline's name.
    :param step: The step the request belongs to.
    :param request_id: The request's id, unique within (pipeline, step).
    :param turn: The turn index within its sample, from 0 (always 0 when not agentic).
    :param replica: The id of the replica (inference engine) it was sent to.
    :param prompt_tokens: Tokens of context sent with the request.
    :param max_tokens: The most tokens the request may still generate.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_request_progress(
    pipeline: str, step: int, request_id: Any, generated_tokens: int, t: float
) -> None:
    """Called as a request streams tokens (high volume; callers may sample it).

    :param pipeline: The pipeline's name.
    :param step: The step the request belongs to.
    :param request_id: The request's id.
    :param generated_tokens: Tokens generated so far by this request (this turn).
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_request_finished(
    pipeline: str,
    step: int,
    request_id: Any,
    turn: int,
    replica: Any,
    generated_tokens: int,
    t: float,
) -> None:
    """Called when a request has finished generating (EOS or ``max_tokens``).

    :param pipeline: The pipeline's name.
    :param step: The step the request belongs to.
    :param request_id: The request's id.
    :param turn: The turn index within its sample.
    :param replica: The id of the replica that finished it.
    :param generated_tokens: Tokens generated by this request (this turn), in total.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_request_aborted(
    pipeline: str,
    step: int,
    request_id: Any,
    turn: int,
    replica: Any,
    generated_tokens: int,
    reason: str,
    t: float,
) -> None:
    """Called when a request is aborted on a replica before it finished.

    :param pipeline: The pipeline's name.
    :param step: The step the request belongs to.
    :param request_id: The request's id.
    :param turn: The turn index within its sample.
    :param replica: The id of the replica it was aborted on.
    :param generated_tokens: Tokens it had generated (this turn) when aborted.
    :param reason: One of :data:`ABORT_REASONS` (migrate, preempt, fault, weight_update).
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_request_migrated(
    pipeline: str,
    step: int,
    request_id: Any,
    turn: int,
    src_replica: Any,
    dst_replica: Any,
    generated_tokens: int,
    t: float,
) -> None:
    """Called when a request has been moved from one replica to another.

    :param pipeline: The pipeline's name.
    :param step: The step the request belongs to.
    :param request_id: The request's id.
    :param turn: The turn index within its sample.
    :param src_replica: The id of the replica it left.
    :param dst_replica: The id of the replica it now runs on.
    :param generated_tokens: Tokens generated (this turn) before the move; they are kept.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_tool_call_start(pipeline: str, step: int, request_id: Any, turn: int, t: float) -> None:
    """Called when an agentic sample's turn ends in a tool call that starts now.

    :param pipeline: The pipeline's name.
    :param step: The step the request belongs to.
    :param request_id: The id of the request whose turn produced the call.
    :param turn: The turn that produced the call.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_tool_call_end(
    pipeline: str, step: int, request_id: Any, turn: int, observation_tokens: int, t: float
) -> None:
    """Called when a tool call has returned its observation (the next turn may start).

    :param pipeline: The pipeline's name.
    :param step: The step the request belongs to.
    :param request_id: The id of the request whose turn produced the call.
    :param turn: The turn that produced the call (the same as in ``jigsaw_tool_call_start``).
    :param observation_tokens: Tokens of the observation appended to the context.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


# --------------------------------------------------------------------------------------
# Scheduling and device leases
# --------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def jigsaw_schedule(state: Any) -> list | None:
    """Decide what to do next; called whenever the caller's state changed enough to act.

    :param state: A read-only view of the cluster and the pipelines (the scheduler's state
        object); implementations must not mutate it.

    firstresult: the first plugin returning a non-``None`` value wins; its value is the
    list of decisions (``jigsaw_plugin.scheduler.decisions``), possibly empty (= wait).
    Return ``None`` to let the next plugin decide.
    """


@hookspec(firstresult=True)
def jigsaw_predict_duration(
    kind: str, pipeline: str, sizes: dict, devices: tuple[int, ...]
) -> float | None:
    """Predict how long a sub-stage will take.

    :param kind: The sub-stage kind (a stage of :data:`STAGES`, or a finer kind such as a
        decode step or a context switch).
    :param pipeline: The pipeline's name.
    :param sizes: What the sub-stage processes, e.g. ``{"samples": 64, "tokens": 81920}``.
    :param devices: The device ids it would run on.

    firstresult: the first plugin returning a non-``None`` value wins; the value is the
    duration in seconds (float). Return ``None`` for kinds you do not price.
    """


@hookspec(firstresult=True)
def jigsaw_predict_remaining(pipeline: str, requests: tuple, history: Any) -> Any:
    """Predict how many tokens each in-flight request still has to generate.

    Called by an executor while it builds the scheduler's state, once per pipeline and
    round, for all of the pipeline's in-flight requests at once. A live engine does not know
    when a response ends, so this is the only way remaining work enters a policy.

    :param pipeline: The pipeline's name.
    :param requests: ``scheduler.state.RequestView``-like records (``id``, ``group``,
        ``prompt_key``, ``turn``, ``generated``, ``max_tokens``, ``in_flight_s``), without
        ``predicted_remaining``.
    :param history: The pipeline's ``predict.LengthHistory``: lengths of finished turns,
        by step and GRPO group (read-only for implementations).

    firstresult: the first plugin returning a non-``None`` value wins; the value is a
    sequence of floats (predicted remaining tokens, one per request, each at most the
    request's ``max_tokens - generated``). The built-in ``predict`` plugin answers it; an
    oracle reading true lengths exists only as a labelled ablation.
    """


@hookspec
def jigsaw_lease_granted(pipeline: str, devices: tuple[int, ...], purpose: str, t: float) -> None:
    """Called when devices are handed to a pipeline.

    :param pipeline: The pipeline's name.
    :param devices: The device ids granted.
    :param purpose: What they are for, e.g. ``"rollout"`` or ``"train"``.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_lease_released(pipeline: str, devices: tuple[int, ...], t: float) -> None:
    """Called when a pipeline gives devices back to the pool.

    :param pipeline: The pipeline's name.
    :param devices: The device ids released.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_context_switch(
    devices: tuple[int, ...],
    from_pipeline: str | None,
    to_pipeline: str,
    duration_s: float,
    t: float,
) -> None:
    """Called when devices switch to another pipeline's state (weights, optimizer, KV).

    :param devices: The device ids that switch.
    :param from_pipeline: The pipeline whose state leaves, or ``None`` if unknown/none.
    :param to_pipeline: The pipeline whose state is brought in.
    :param duration_s: How long the switch takes (or is predicted to take), seconds.
    :param t: Seconds on the caller's clock when the switch starts.

    Return values are ignored.
    """


# --------------------------------------------------------------------------------------
# Weight sync (trainer -> rollout replicas)
# --------------------------------------------------------------------------------------


@hookspec
def jigsaw_weight_sync_start(
    pipeline: str, step: int, version: int, devices: tuple[int, ...], bytes: int, t: float
) -> None:
    """Called when new policy weights start moving from the trainer to rollout replicas.

    :param pipeline: The pipeline's name.
    :param step: The step whose update produced the weights.
    :param version: The policy version being published.
    :param devices: The device ids taking part.
    :param bytes: Size of the weights moved, in bytes.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


@hookspec
def jigsaw_weight_sync_end(
    pipeline: str, step: int, version: int, devices: tuple[int, ...], t: float
) -> None:
    """Called when the replicas serve the new weights (``version`` is live).

    :param pipeline: The pipeline's name.
    :param step: The step whose update produced the weights.
    :param version: The policy version now live.
    :param devices: The device ids that took part.
    :param t: Seconds on the caller's clock.

    Return values are ignored.
    """


#: Every hook name, in the order of this file.
HOOK_NAMES = tuple(name for name in list(globals()) if name.startswith("jigsaw_"))
