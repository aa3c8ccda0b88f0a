"""Tail widening that re-shards in place and spreads over several replicas.

Policy half on hand-built states (``Jigsaw._widen_tails`` / ``_widen_plan``); executor half
on the simulator's world (``LaunchReplica`` whose devices include the absorbed replicas').
"""

from __future__ import annotations

import dataclasses

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import LaunchReplica, Migrate, RetireReplica, RunStage, get_policy
from jigsaw_plugin.scheduler.state import StepView
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.sim.world import PolicyViolation
from sim_helpers import device_overlaps, small_workload
from test_jigsaw_decide import _busy_with_replicas, _paced, pipeline, replica, state, step

LONG = [20000, 18000]  # predicted tokens left: a tail worth re-sharding


def _tail_on_whole_home(paced=None):
    """p0's tail fills its home (devices 0-3) with two tp2 replicas; p1's home (4-7) is busy
    with its own rollout, so nothing is free or lendable: only an in-place re-shard widens.
    ``paced``: (p0, p1) start times of their step 1, one step done each (a pace observed);
    None: both in their first step (no pace yet)."""
    k = 0 if paced is None else 1
    reps = [replica("p0", i + 1, (2 * i, 2 * i + 1), generated=[3000, 2500], predicted=LONG) for i in range(2)]
    p1_reps = [replica("p1", 9, (4, 5, 6, 7), generated=[100] * 4, predicted=[30000] * 4)]
    pipes = []
    for i, (share, rs, done) in enumerate(((range(4), reps, 28), (range(4, 8), p1_reps, 0))):
        st = step(k, done=done)
        if paced is not None:
            st = _paced(st, paced[i])
        pipes.append(pipeline(i, share, replicas=rs, gen_next=k + 1, train_next=k, version=k, generating=True,
                              steps={k: st}))
    return state(pipes, busy=_busy_with_replicas(pipes), t=100.0 if paced is None else max(paced) + 50.0)


def _widened(out):
    return [d for d in out if isinstance(d, LaunchReplica) and d.absorb]


def _absorbed(out):
    """Replicas whose requests end on a new replica: absorbed, or migrated (consolidation in
    the same round) into an absorbed one."""
    got = {r for d in _widened(out) for r in d.absorb}
    return got | {m.src for m in out if isinstance(m, Migrate) and m.dst in got}


def test_a_tail_filling_its_home_is_re_sharded_in_place_onto_its_own_devices():
    st = dataclasses.replace(_tail_on_whole_home(), reshard_in_place=True)
    out = get_policy("jigsaw").decide(st)
    wide = _widened(out)
    assert len(wide) == 1, "the two tp2 replicas' long tail should move onto one tp4 replica"
    assert _absorbed(out) == {1, 2} and sorted(wide[0].devices) == [0, 1, 2, 3]


def test_without_the_capability_or_the_switch_the_tail_stays_where_it_is():
    st = _tail_on_whole_home()
    assert not st.reshard_in_place  # hand-built states (like the live runtime) lack it
    assert not _widened(get_policy("jigsaw").decide(st))
    st = dataclasses.replace(st, reshard_in_place=True)
    assert not _widened(get_policy("jigsaw", reshard_in_place=False).decide(st))


def test_only_a_pipeline_near_the_critical_path_re_shards_in_place():
    # at the observed paces p0 (a step in 100 s) is far ahead of p1 (300 s): its tail keeps
    # its devices for consolidation to free; behind p1 (p0 300 s, p1 100 s) it re-shards
    ahead = dataclasses.replace(_tail_on_whole_home(paced=(100.0, 300.0)), reshard_in_place=True)
    assert not _widened(get_policy("jigsaw").decide(ahead))
    behind = dataclasses.replace(_tail_on_whole_home(paced=(300.0, 100.0)), reshard_in_place=True)
    assert _absorbed(get_policy("jigsaw").decide(behind)) == {1, 2}


def test_a_tail_spreads_over_several_replicas_when_one_wide_replica_would_be_slower():
    # three tp1 replicas of 40 requests each on a home of 8 devices, widened at most to tp4
    # (``max_widen``): one tp4 replica would decode all 120 at batch 120; two tp4 replicas
    # (the tail's three devices and five free ones) split them and finish sooner
    reps = [replica("p0", i + 1, (i,), generated=[3000] * 40, predicted=[2000] * 40) for i in range(3)]
    p0 = pipeline(0, range(8), replicas=reps, gen_next=1, generating=True, steps={0: step(0, samples=200, done=80)})
    st = dataclasses.replace(state([p0], busy=_busy_with_replicas([p0])), reshard_in_place=True)
    out = get_policy("jigsaw", max_widen=4).decide(st)
    wide = _widened(out)
    assert len(wide) == 2 and all(len(d.devices) == 4 for d in wide), out
    absorbed = [r for d in wide for r in d.absorb]
    assert sorted(absorbed) == [1, 2, 3]  # each old replica absorbed exactly once
    devs = [x for d in wide for x in d.devices]
    assert len(devs) == len(set(devs)) == 8
    # each new replica takes only free devices and those of the replicas it or an earlier one absorbs
    gone = set()
    for d in wide:
        gone |= {x for r in reps if r.id in d.absorb for x in r.devices}
        assert set(d.devices) <= gone | {3, 4, 5, 6, 7}


def _tail_beside_finished(predicted: int, done: int = 160):
    """Three tp1 replicas of 40 requests each (``predicted`` tokens left) on a home of 8
    devices; ``done`` of the step's 200 trajectories finished, 3M tokens for its log-prob
    pass to read: the tail's re-shard and an early pass compete for the devices."""
    reps = [replica("p0", i + 1, (i,), generated=[3000] * 40, predicted=[predicted] * 40) for i in range(3)]
    st0 = StepView(0, 200, done, done, 3_000_000, 0.0, {}, {}, 0, finished_tokens=3_000_000)
    p0 = pipeline(0, range(8), replicas=reps, gen_next=1, generating=True, steps={0: st0})
    return dataclasses.replace(state([p0], busy=_busy_with_replicas([p0])), reshard_in_place=True, early_passes=True)


def _launched_and_early(out):
    return ([sorted(d.devices) for d in _widened(out)],
            [sorted(d.devices) for d in out if isinstance(d, RunStage) and d.early])


def test_widen_for_early_leaves_a_long_tails_spare_devices_to_an_early_pass():
    # the fastest re-shard, two tp4 replicas on all 8 devices, ends the tail a little
    # sooner; one tp4 replica ends it later but leaves 4 devices to read most of the
    # finished trajectories' log-probs meanwhile: the chain after the tail is shorter
    st = _tail_beside_finished(2000)
    assert _launched_and_early(get_policy("jigsaw", max_widen=4, widen_for_early=False).decide(st)) == (
        [[0, 2, 3, 4], [1, 5, 6, 7]], [])
    assert _launched_and_early(get_policy("jigsaw", max_widen=4).decide(st)) == ([[0, 1, 2, 3]], [[4, 5, 6, 7]])


def test_widen_for_early_keeps_the_fastest_re_shard_where_the_pass_would_read_little():
    # a short tail: 4 devices would read little of the pass by its end; and a step with
    # under ``early_from`` of its trajectories finished runs no early pass at all
    for st in (_tail_beside_finished(1000), _tail_beside_finished(2000, done=80)):
        on = _launched_and_early(get_policy("jigsaw", max_widen=4).decide(st))
        assert on[0] == [[0, 2, 3, 4], [1, 5, 6, 7]] and not on[1]


# ---- the executor -------------------------------------------------------------------------
def _world():
    wl = small_workload(gpus=4, pipelines=1, prompts=8, samples=4, steps=1, median=3000, agentic=(False,))
    sim = Simulation(wl, get_policy("jigsaw", resize=False, migration=False), seed=3)  # four tp1 replicas, left alone
    w = sim.world
    w.decide_and_apply()
    return sim, w


def _generated(rep, r):
    """Tokens of ``r``'s turn generated so far (before its admission to ``rep``, and since)."""
    return r.done + (int(rep.p - r.admit_p) if r in rep.running() else 0)


def test_the_simulator_re_shards_in_place_without_losing_a_request():
    sim, w = _world()
    reps = [r for r in w.replicas.values() if r.pipeline == "p0"]
    assert len(reps) >= 2
    w.t += 5.0
    for r in reps:
        r.sync(w.t)
    held = {r.rid for rep in reps for r in list(rep.queue) + rep.running()}
    tokens = {r.rid: _generated(rep, r) for rep in reps for r in list(rep.queue) + rep.running()}
    assert sum(tokens.values()) > 0
    devices = tuple(d for rep in reps for d in rep.devices)
    w.apply(LaunchReplica("p0", devices, absorb=tuple(r.id for r in reps)))
    new = [r for r in w.replicas.values() if r.pipeline == "p0"]
    assert len(new) == 1 and sorted(new[0].devices) == sorted(devices)
    moved = {r.rid for r in list(new[0].queue) + new[0].running()}
    assert moved == held
    assert all(_generated(new[0], r) == tokens[r.rid] for r in list(new[0].queue) + new[0].running())  # tokens kept
    assert new[0].switch_s > 0  # the weights are loaded again at the new width
    res = sim.run()
    assert res["pipelines"]["p0"]["samples"] == 8 * 4
    assert device_overlaps(w.trace) == []


def test_an_executor_without_the_capability_refuses_an_in_place_re_shard():
    _, w = _world()
    w.supports_reshard_in_place = False  # as the live runtime and host executors declare
    reps = [r for r in w.replicas.values() if r.pipeline == "p0"]
    devices = tuple(d for rep in reps for d in rep.devices)
    with pytest.raises(PolicyViolation, match="capability 'reshard_in_place'"):
        w.apply(LaunchReplica("p0", devices, absorb=tuple(r.id for r in reps)))
    assert not w.snapshot().reshard_in_place


def test_a_refused_re_shard_stops_nothing():
    # the new replica would take all four devices but absorbs only two replicas: the other
    # two replicas' devices are busy, so it is refused before any replica stops
    _, w = _world()
    reps = sorted((r for r in w.replicas.values() if r.pipeline == "p0"), key=lambda r: r.id)
    before = {r.id: {q.rid for q in list(r.queue) + r.running()} for r in reps}
    devices = tuple(d for rep in reps for d in rep.devices)
    with pytest.raises(PolicyViolation, match="busy"):
        w.apply(LaunchReplica("p0", devices, absorb=(reps[0].id, reps[1].id)))
    after = {r.id: {q.rid for q in list(r.queue) + r.running()} for r in w.replicas.values() if r.pipeline == "p0"}
    assert after == before


def test_a_spread_replica_takes_running_requests_to_the_average_keeping_their_tokens():
    # one of four replicas hands its requests to a sibling and retires; a replica launched
    # on its device with ``spread`` takes requests from the most loaded until it holds the
    # average load: running ones resume with the tokens they have; nothing is lost
    sim, w = _world()
    reps = sorted((r for r in w.replicas.values() if r.pipeline == "p0"), key=lambda r: r.id)
    w.t += 5.0
    w.apply(RetireReplica(reps[0].id))
    w.apply(Migrate(reps[0].id, reps[1].id))
    assert reps[0].id not in w.replicas
    for r in reps[1:]:
        r.sync(w.t)
    tokens = {r.rid: _generated(rep, r) for rep in reps[1:] for r in list(rep.queue) + rep.running()}
    total = len(tokens)
    w.apply(LaunchReplica("p0", reps[0].devices, spread=True))
    new = next(r for r in w.replicas.values() if r.pipeline == "p0" and r.id not in {x.id for x in reps})
    held = list(new.queue) + new.running()
    assert len(held) == total // 4
    assert all(_generated(new, r) == tokens[r.rid] for r in held)  # tokens kept
    assert any(tokens[r.rid] > 0 for r in held)  # running requests moved, not only queued ones
    assert {r.rid for rep in w.replicas.values() if rep.pipeline == "p0" for r in list(rep.queue) + rep.running()} == set(tokens)
    res = sim.run()
    assert res["pipelines"]["p0"]["samples"] == 8 * 4
    assert device_overlaps(w.trace) == []


def test_a_spread_replica_absorbs_nothing():
    with pytest.raises(SpecError, match="LaunchReplica.spread"):
        LaunchReplica("p0", (0,), absorb=(1,), spread=True)


def test_a_migrate_of_named_requests_moves_those_trajectories_however_they_are_named():
    # a policy names the requests to move by the ids its request views carry (a turn's
    # RequestId) or by trajectory id strings: both move exactly those, keeping their tokens
    _, w = _world()
    reps = sorted((r for r in w.replicas.values() if r.pipeline == "p0"), key=lambda r: r.id)
    src, dst = reps[0], reps[1]
    w.t += 5.0
    src.sync(w.t)
    first, second, *rest = list(src.queue) + src.running()
    tokens = _generated(src, first)
    w.apply(Migrate(src.id, dst.id, (first.id,)))  # a turn's RequestId
    w.apply(Migrate(src.id, dst.id, (second.rid,)))  # a trajectory id string
    moved = {r.rid for r in list(dst.queue) + dst.running()}
    assert {first.rid, second.rid} <= moved
    assert {r.rid for r in list(src.queue) + src.running()} == {r.rid for r in rest}
    assert first.done == tokens  # resumes with the tokens it had
    with pytest.raises(SpecError, match="Migrate.requests"):
        Migrate(src.id, dst.id, first.rid)  # a bare string, not a tuple of ids
