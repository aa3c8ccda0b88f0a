"""``width_trials``: the run's last synchronous pipeline tries wider rollout widths, one
step each, and keeps the one whose steps ended soonest (``scheduler/jigsaw/trials.py``),
on hand-built step views."""

from __future__ import annotations

from jigsaw_plugin.scheduler.jigsaw.trials import TRIAL_STEPS_LEFT, WidthTrials
from jigsaw_plugin.scheduler.state import StepView

WIDTHS = [1, 2, 4]


def _step(k: int, start: float, end: float | None, trained: float | None = None) -> StepView:
    ends = {"update_actor": trained} if trained is not None else {}
    return StepView(k, 8, 8 if end is not None else 3, 0, 0, start, {}, ends, 0, gen_end_t=end)


def _run(trials: WidthTrials, k: int, seconds: float, projected: int = 1, steps: int = 10) -> int:
    """Step ``k`` launched (the width asked before it generates), generated, trained
    ``seconds`` after its start, then gone from the steps (trained)."""
    w = trials.width_for(k, steps - k, WIDTHS, projected, launching=True)
    trials.observe({k: _step(k, 100.0 * k, 100.0 * k + seconds / 2)})
    trials.observe({k: _step(k, 100.0 * k, 100.0 * k + seconds / 2, 100.0 * k + seconds)})
    trials.observe({})
    return w


def test_the_projection_first_then_wider_widths_while_they_end_sooner():
    t = WidthTrials()
    assert _run(t, 1, 40.0) == 1  # the projection, not yet seen
    assert _run(t, 2, 38.0) == 2  # one step at the next width up
    assert _run(t, 3, 36.0) == 4  # faster: the next again
    assert [_run(t, k, 36.5) for k in range(4, 8)] == [4, 4, 4, 4]  # no wider width: the best
    assert t.seen == {1: [40.0], 2: [38.0], 4: [36.0, 36.5, 36.5, 36.5, 36.5]}


def test_a_slower_trial_goes_back_to_the_best():
    t = WidthTrials()
    assert _run(t, 1, 40.0) == 1 and _run(t, 2, 41.0) == 2
    assert [_run(t, k, 40.0) for k in range(3, 6)] == [1, 1, 1]  # tp2 was slower: no tp4 either


def test_no_trial_without_steps_left_to_use_it():
    t = WidthTrials()
    steps = 4
    assert _run(t, 1, 40.0, steps=steps) == 1
    assert steps - 2 < TRIAL_STEPS_LEFT and _run(t, 2, 40.0, steps=steps) == 1


def test_only_widths_at_or_above_the_projection_are_tried():
    t = WidthTrials()
    assert _run(t, 1, 30.0, projected=4) == 4
    assert _run(t, 2, 30.0, projected=4) == 4  # nothing wider: never a narrower trial


def test_a_trial_step_keeps_its_width_and_a_projected_one_follows_the_projection():
    t = WidthTrials()
    _run(t, 1, 40.0)
    assert t.width_for(2, 8, WIDTHS, 1, launching=True) == 2
    assert t.width_for(2, 8, WIDTHS, 4, launching=False) == 2  # mid-step: the trial's width
    assert t.width_for(5, 5, WIDTHS, 1, launching=False) == 1  # asked only once generating
    assert 5 not in t.chosen  # ... not counted: it launched before the trials chose
    t2 = WidthTrials()
    assert t2.width_for(1, 9, WIDTHS, 1, launching=True) == 1
    assert t2.width_for(1, 9, WIDTHS, 2, launching=False) == 2  # launched at the projection: follows it


def test_a_steps_time_is_its_generation_and_training_read_once_it_is_trained():
    t = WidthTrials()
    t.width_for(1, 9, WIDTHS, 1, launching=True)
    t.observe({1: _step(1, 10.0, None), 0: _step(0, 0.0, 5.0)})  # still generating; step 0 not chosen
    t.observe({1: _step(1, 10.0, 50.0, 80.0)})
    assert t.seen == {} and t.best() is None  # not trained yet
    t.observe({2: _step(2, 81.0, None)})  # step 1 trained: its view is gone
    t.observe({})
    assert t.seen == {1: [70.0]} and t.best() == 1


def test_a_lone_agent_tries_a_wider_width_on_a_run():
    # the policy's glue (``_cheapest_width`` asks the trials at each step's launch, ``decide``
    # reads each step's time once it is trained) on a run: a lone multi-turn 14B agent on 8
    # devices tries a width above its projection on one step, and every sample is trained
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from sim_helpers import small_workload

    wl = small_workload(gpus=8, pipelines=1, prompts=256, samples=8, steps=5, agentic=(True,),
                        models=("qwen2.5-14b",), algorithms=("grpo",))
    policy = get_policy("jigsaw", width_trials=True)
    result = Simulation(wl, policy, seed=1).run()
    trials = policy._trials["p0"]
    assert len(set(trials.chosen.values())) >= 2  # a trial at another width than the projection
    assert sum(len(v) for v in trials.seen.values()) >= 3  # steps read once trained
    assert result["samples"] == 256 * 8 * 5
