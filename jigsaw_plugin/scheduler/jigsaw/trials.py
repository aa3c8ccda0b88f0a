"""Width trials: the run's last synchronous pipeline tries wider rollout widths on its
steps and keeps the one whose steps ended soonest (``width_trials``).

``alone_width`` projects each width's bulk from the batch its KV cache holds (waves of a
full batch). For a multi-turn agent that projection is wrong: its trajectories spend part of
each turn in tool calls and in the prefill of their observations, so a narrow replica's
batch thins while a wide one, which queues more trajectories than it runs, refills from its
queue; the wide one also starts decoding after prefilling only what it admits (a search
agent alone on 8 H100, seed 0: projected tp1, whose steps' generation took 38.4-40.0 s,
where tp4's took 34.9-37.0 s). A user of verl tunes that width by running the job at
several; a job alone can measure it on its own steps instead: the width projected first,
then, while at least ``TRIAL_STEPS_LEFT`` steps remain, the next wider width on one step,
climbing while a wider width's step ends sooner than the best so far, and from then on the
width whose steps took least on average (a step's time: its generation and the training
after it). Only widths at or above the projection are tried (the projection's blind spot
is the thinning, which favours wider).

Pure functions of what the state holds: a step's width is chosen when it starts
(``StartGen.width``, ``keep_width``), the executor records it on the step
(``StepView.width``) and, once the step is trained, beside the step's time
(``PipelineView.step_widths``). Nothing is kept in the policy: a policy restarted mid-run,
or one per round, chooses the same."""

from __future__ import annotations

__all__ = ["TRIAL_STEPS_LEFT", "best_width", "launch_width", "running_width"]

#: a trial needs steps after it to use what it finds: the trial step and at least two more
TRIAL_STEPS_LEFT = 3


def best_width(step_widths) -> int | None:
    """The width whose trained steps took least on average (``step_widths``: (width,
    seconds) pairs, ``PipelineView.step_widths``); None: none trained."""
    seen: dict[int, list[float]] = {}
    for w, s in step_widths:
        seen.setdefault(w, []).append(s)
    if not seen:
        return None
    return min(seen, key=lambda w: (sum(seen[w]) / len(seen[w]), w))


def launch_width(step_widths, steps_left: int, widths: list[int], projected: int) -> tuple[int, bool]:
    """(width, keep) for a step about to start generating: the projection until it has
    been seen on a trained step; then the next width above the best so far, once, while
    ``steps_left`` (this step included) allow a trial; otherwise the best. ``keep``: the
    width is not the projection, so the step keeps it through its rollout (its spreads and
    re-launches too); a step at the projection follows the projection, as without trials.
    ``widths`` ascending."""
    best = best_width(step_widths)
    seen = {w for w, _ in step_widths}
    if best is None or projected not in seen:
        got = projected
    else:
        above = [w for w in widths if w > best and w >= projected]
        nxt = above[0] if above else None
        got = nxt if nxt is not None and nxt not in seen and steps_left >= TRIAL_STEPS_LEFT else best
    return got, got != projected


def running_width(step, projected: int) -> int:
    """The width of a step that generates (``step``: its ``StepView``, or None): the width
    its start kept (``StepView.keep_width``), else the projection (a step that started at
    the projection, or before the trials chose: not counted, its time not recorded)."""
    return step.width if step is not None and step.keep_width else projected
