"""A periodic decide round in the simulator (``Policy.decide_period_s``): with it, the
policy is called at the first event at least that many simulated seconds after its last
round, as the live executors' re-check (``LIVE_RECHECK_S``) calls it between events;
without it (0), on events only (docs/simulator.md, "Limits"). jigsaw and streamrl decide at the
live executors' cadence; the other baselines on events only."""

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.scheduler.base import LIVE_RECHECK_S
from jigsaw_plugin.sim import Simulation
from sim_helpers import small_workload


def _round_times(**options) -> list:
    sim = Simulation(small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=2, median=2000),
                     get_policy("jigsaw", **options), seed=0)
    times = []
    decide = sim.world.decide

    def timed():
        times.append(sim.world.t)
        return decide()

    sim.world.decide = timed
    result = sim.run()
    assert result["pipelines"]["p0"]["steps"] == 2 and result["pipelines"]["p1"]["steps"] == 2
    return times


def test_the_policy_is_woken_at_least_once_a_period_while_events_arrive():
    events_only = _round_times(decide_period_s=0.0)
    periodic = _round_times(decide_period_s=1.0)
    assert len(periodic) > len(events_only)

    def long_gaps(times):  # stretches of over a period and a half between two rounds
        return sorted(b - a for a, b in zip(times, times[1:]) if b - a > 1.5)

    # on events only, four or more such stretches while replicas decode (their events come
    # every few decode steps, none of them one the policy hears); with the period, only
    # the one stretch in which no event at all arrives
    assert len(long_gaps(events_only)) >= 4
    assert len(long_gaps(periodic)) == 1 and long_gaps(periodic) == long_gaps(events_only)[-1:]


def test_the_period_is_a_non_negative_number():
    with pytest.raises(SpecError, match="decide_period_s"):
        get_policy("jigsaw", decide_period_s=-1.0)


def test_jigsaw_decides_at_the_live_executors_cadence_by_default():
    assert get_policy("jigsaw").decide_period_s == LIVE_RECHECK_S > 0
    assert get_policy("streamrl").decide_period_s == LIVE_RECHECK_S
    assert get_policy("verl-sync").decide_period_s == 0.0
    default, once_a_second = _round_times(), _round_times(decide_period_s=1.0)
    assert len(default) > len(once_a_second)
    longest = lambda times: max(b - a for a, b in zip(times, times[1:]))
    assert longest(default) == longest(once_a_second)  # the stretch with no event at all
