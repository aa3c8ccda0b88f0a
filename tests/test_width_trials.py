"""``width_trials``: the run's last synchronous pipeline tries wider rollout widths, one
step each, and keeps the one whose steps ended soonest (``scheduler/jigsaw/trials.py``),
on hand-built step records; what it learns lives in the state (``StartGen.width``,
``StepView.width``, ``PipelineView.step_widths``), not in the policy."""

from __future__ import annotations

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler.decisions import StartGen
from jigsaw_plugin.scheduler.jigsaw.trials import TRIAL_STEPS_LEFT, best_width, launch_width, running_width
from jigsaw_plugin.scheduler.state import StepView

WIDTHS = [1, 2, 4]


def _run(record: list, k: int, seconds: float, projected: int = 1, steps: int = 10) -> int:
    """Step ``k`` starts (at the width chosen from the steps trained before it) and is
    trained ``seconds`` later: the executor records it as ``PipelineView.step_widths``."""
    w, _ = launch_width(tuple(record), steps - k, WIDTHS, projected)
    record.append((w, seconds))
    return w


def test_the_projection_first_then_wider_widths_while_they_end_sooner():
    r: list = []
    assert _run(r, 1, 40.0) == 1  # the projection, not yet seen
    assert _run(r, 2, 38.0) == 2  # one step at the next width up
    assert _run(r, 3, 36.0) == 4  # faster: the next again
    assert [_run(r, k, 36.5) for k in range(4, 8)] == [4, 4, 4, 4]  # no wider width: the best
    assert best_width(r) == 4


def test_a_slower_trial_goes_back_to_the_best():
    r: list = []
    assert _run(r, 1, 40.0) == 1 and _run(r, 2, 41.0) == 2
    assert [_run(r, k, 40.0) for k in range(3, 6)] == [1, 1, 1]  # tp2 was slower: no tp4 either


def test_no_trial_without_steps_left_to_use_it():
    r: list = []
    steps = 4
    assert _run(r, 1, 40.0, steps=steps) == 1
    assert steps - 2 < TRIAL_STEPS_LEFT and _run(r, 2, 40.0, steps=steps) == 1


def test_only_widths_at_or_above_the_projection_are_tried():
    r: list = []
    assert _run(r, 1, 30.0, projected=4) == 4
    assert _run(r, 2, 30.0, projected=4) == 4  # nothing wider: never a narrower trial


def test_a_trial_step_keeps_its_width_and_a_projected_one_follows_the_projection():
    assert launch_width(((1, 40.0),), 8, WIDTHS, 1) == (2, True)  # a trial: kept through the step
    assert launch_width((), 9, WIDTHS, 1) == (1, False)  # at the projection: follows it
    trial = StepView(2, 8, 3, 0, 0, 100.0, {}, {}, 0, width=2, keep_width=True)
    at_projection = StepView(1, 8, 3, 0, 0, 0.0, {}, {}, 0, width=1)
    before_trials = StepView(5, 8, 3, 0, 0, 500.0, {}, {}, 0)  # started before the trials chose
    assert running_width(trial, 4) == 2
    assert running_width(at_projection, 2) == 2 and running_width(before_trials, 2) == 2
    assert running_width(None, 4) == 4


@pytest.mark.parametrize("width, keep, field", [(0, False, "StartGen.width"), (True, False, "StartGen.width"),
                                                (2.0, False, "StartGen.width"), (None, True, "StartGen.keep_width"),
                                                (2, 1, "StartGen.keep_width")])
def test_start_gen_refuses_a_bad_width(width, keep, field):
    with pytest.raises(SpecError, match=field):
        StartGen("p0", 0, width, keep)


def test_a_lone_agent_tries_a_wider_width_on_a_run():
    # the policy's glue (``_cheapest_width`` chooses at each step's start, the StartGen
    # records it, the executor keeps each trained step's time) on a run: a lone multi-turn
    # 14B agent on 8 devices tries a width above its projection on one step, and every
    # sample is trained
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from sim_helpers import small_workload

    wl = small_workload(gpus=8, pipelines=1, prompts=256, samples=8, steps=5, agentic=(True,),
                        models=("qwen2.5-14b",), algorithms=("grpo",))
    sim = Simulation(wl, get_policy("jigsaw", width_trials=True), seed=1)
    result = sim.run()
    p = sim.world.pipelines["p0"]
    assert len({w for w, _ in p.step_widths}) >= 2  # a trial at another width than the projection
    assert len(p.step_widths) >= 3  # steps recorded once trained
    assert any(s.keep_width for s in p.steps.values())  # the trial step kept its width
    step = p.steps[max(p.steps)]
    assert all(s > 0 for _, s in p.step_widths) and step.gen_end_t is not None
    assert result["samples"] == 256 * 8 * 5
    # the same run on a policy object rebuilt every round chooses the same: nothing is
    # kept in the policy
    fresh = Simulation(wl, get_policy("jigsaw", width_trials=True), seed=1)
    real_decide, rounds = type(fresh.policy).decide, []

    def decide_anew(state):
        rounds.append(1)
        return real_decide(get_policy("jigsaw", width_trials=True), state)

    fresh.policy.decide = decide_anew
    assert fresh.run()["makespan_s"] == result["makespan_s"] and len(rounds) > 100
    assert fresh.world.pipelines["p0"].step_widths == p.step_widths
