"""Co-location: pricing on the cost model's figures, the policy on hand-built states, the
simulator carrying out a co-located launch, and the clear errors of bad ones."""

from __future__ import annotations

import pytest

from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.scheduler import LaunchReplica, get_policy
from jigsaw_plugin.scheduler.colocation import colocated_step_s, plan_colocations, split_kv
from jigsaw_plugin.scheduler.jigsaw import Jigsaw, JigsawMemo
from jigsaw_plugin.scheduler.state import (
    DeviceTask,
    DeviceView,
    LengthSummary,
    PipelineView,
    ReplicaView,
    SchedulerState,
    StepView,
)
from jigsaw_plugin.sim import Simulation
from jigsaw_plugin.sim.world import PolicyViolation
from sim_helpers import device_overlaps, small_workload
from test_jigsaw_decide import _Requests

COST = CostModel(hardware_profile("h100"))
SMALL = model_profile("qwen2.5-1.5b")  # a tail's step is mostly fixed overhead: sharing is nearly free
BIG = model_profile("qwen2.5-7b")  # a tp1 tail's step is mostly weight reads: sharing stretches it
OVERHEAD = COST.f.decode_step_overhead_s


# ---- pricing -------------------------------------------------------------------------------
def test_interference_slows_each_replica_of_a_pair():
    a = COST.decode_step_s(BIG, 1, 8, 8 * 3000)
    b = COST.decode_step_s(BIG, 1, 16, 16 * 2000)
    both = colocated_step_s(a, b, OVERHEAD)
    assert both > a and both > b
    # the GPU work of both steps, the fixed host-side part once
    assert both == pytest.approx(a + b - 2 * OVERHEAD)
    assert colocated_step_s(a, 0.0, OVERHEAD) == a  # alone when the other is idle


def test_two_tails_cost_fewer_device_seconds_together_than_apart():
    for model, tp in ((BIG, 1), (BIG, 4), (SMALL, 1)):
        steps = 4000
        a = COST.decode_step_s(model, tp, 8, 8 * 3000)
        b = COST.decode_step_s(model, tp, 8, 8 * 3000)
        apart = (a + b) * steps * tp  # each on its own devices
        together = colocated_step_s(a, b, OVERHEAD) * steps * tp  # both on one group
        assert together < apart


def test_kv_split_shares_the_room_both_weights_leave():
    for tp in (1, 4):
        alone = COST.kv_capacity_tokens(BIG, tp)
        split = split_kv(COST, BIG, SMALL, tp, 0.3)
        room = COST.kv_capacity_tokens(BIG, tp, SMALL.weight_bytes / tp) * BIG.kv_bytes_per_token
        assert 0 < split.host_tokens < alone
        got = split.host_tokens * BIG.kv_bytes_per_token + split.guest_tokens * SMALL.kv_bytes_per_token
        assert got == pytest.approx(room, rel=1e-4)
        assert split.guest_tokens * SMALL.kv_bytes_per_token == pytest.approx(0.3 * room, rel=1e-4)


# ---- the policy on hand-built states ---------------------------------------------------------
SPECS = small_workload(gpus=12, pipelines=3, prompts=8, samples=4, algorithms=("grpo",) * 3,
                       agentic=(False,), modes=("sync",) * 3, staleness=(0,) * 3).pipelines


def _replica(model, name, rid, devices, n, left):
    generated, predicted = [300] * n, [left] * n
    kv = float(sum(200 + g for g in generated))
    step_s = COST.decode_step_s(model, len(devices), max(1, n), kv)
    return ReplicaView(rid, name, tuple(devices), n, 0, kv, float(COST.kv_capacity_tokens(model, len(devices))),
                       1024, False, step_s, 0.0, _Requests(name, rid, generated, predicted))


def _pipeline(model, i, share, replicas=(), generating=True, ready_stage=False):
    spec = SPECS[i]
    steps = {0: StepView(0, 32, 32, 32 if ready_stage else 0, 0, 0.0, {}, {}, 0)}
    return PipelineView(
        name=spec.name, index=i, spec=spec, model=model, stages=("old_log_prob", "update_actor", "weight_sync"),
        static_devices=tuple(share), gen_next=1, train_next=0, stage_next=0, stage_running=False, version=0,
        rollout_version=0, done=False, generating=generating, pending=0, replicas=tuple(replicas), steps=steps,
        history=None, lengths=LengthSummary(100, 150.0, 600.0, 750.0, 1.0, 3000.0), stage_history_s={},
        running_stage_end_t=None, running_stage=None)


def _state(pipes, colocation=True):
    owner = {d: p.name for p in pipes for d in p.static_devices}
    home = {p.name: (p.static_devices, p.static_devices) for p in pipes}
    busy = {d: DeviceTask("replica", p.name, replica=r.id) for p in pipes for r in p.replicas for d in r.devices}
    devices = tuple(DeviceView(d, d // 8, busy.get(d), (owner[d],), owner[d]) for d in range(12))
    return SchedulerState(t=100.0, gpus=12, gpus_per_node=8, devices=devices,
                          free=frozenset(d for d in range(12) if d not in busy), order=tuple(pipes), cost=COST,
                          max_num_seqs=1024, memo=JigsawMemo(home, owner), classes=(), colocation=colocation)


def _two_tails(model, src_left, sibling_left, host_left, host_n=4):
    """p0 (A): a tail on device 0 and a full sibling on device 1 (no room to consolidate
    into); p1 (B): a tail on device 4; p2 has a training stage ready (it wants the devices a
    co-location frees)."""
    p0 = _pipeline(model, 0, range(4), [_replica(model, "p0", 1, (0,), 4, src_left),
                                        _replica(model, "p0", 2, (1,), 1022, sibling_left)])
    p1 = _pipeline(model, 1, range(4, 8), [_replica(model, "p1", 3, (4,), host_n, host_left)])
    p2 = _pipeline(model, 2, range(8, 12), generating=False, ready_stage=True)
    return [p0, p1, p2]


def test_proposes_a_co_location_where_it_pays():
    state = _state(_two_tails(SMALL, 2000, 3000, 3000))
    plans = plan_colocations(state, state.free, frozenset())
    assert len(plans) == 1
    c = plans[0]
    assert (c.pipeline, c.src, c.host, c.devices) == ("p0", 1, 3, (4,))
    assert c.freed_device_s >= 2.0 * c.cost_device_s and 0.0 < c.kv_share < 1.0
    d = c.decision()
    assert d == LaunchReplica("p0", (4,), absorb=(1,), colocate_with=3, kv_share=c.kv_share)
    # through the policy: the one call after tail consolidation emits it
    out = get_policy("jigsaw", colocate=True).decide(state)
    assert d in out
    assert d not in get_policy("jigsaw", colocate=False).decide(state)


def test_no_co_location_when_the_host_runs_a_large_batch():
    state = _state(_two_tails(SMALL, 2000, 3000, 3000, host_n=200))
    assert plan_colocations(state, state.free, frozenset()) == ()


def test_no_co_location_beyond_the_slack():
    # a 7B tp1 tail shares its step's weight reads: the moved tail, A's longest, would end
    # ~1.5x later: beyond a 5% slack, within a 100% one
    state = _state(_two_tails(BIG, 3000, 1000, 3000))
    assert plan_colocations(state, state.free, frozenset(), slack=0.05) == ()
    assert plan_colocations(state, state.free, frozenset(), slack=1.0, min_gain=0.5) != ()


def test_no_co_location_where_the_executor_cannot():
    state = _state(_two_tails(SMALL, 2000, 3000, 3000), colocation=False)
    assert plan_colocations(state, state.free, frozenset()) == ()
    assert not any(d.colocate_with is not None for d in get_policy("jigsaw", colocate=True).decide(state)
                   if isinstance(d, LaunchReplica))


def test_no_co_location_when_nobody_wants_the_freed_devices():
    pipes = _two_tails(SMALL, 2000, 3000, 3000)
    pipes[2] = _pipeline(SMALL, 2, range(8, 12), generating=False, ready_stage=False)
    state = _state(pipes)
    assert plan_colocations(state, state.free, frozenset()) == ()


# ---- the simulator ---------------------------------------------------------------------------
class ForcedColocation(Jigsaw):
    """Jigsaw, plus one co-location forced at the first quiet round where two pipelines each
    have a replica with requests: the simulator's mechanics under test, whatever the pricing."""

    def __init__(self, kv_share=0.3, **options):
        super().__init__(**{"colocate": True, **options})  # the round keeps a pair's devices held
        self.kv_share = kv_share
        self.done_once = False

    def decide(self, state):
        out = super().decide(state)
        if out or self.done_once:
            return out
        live = [r for r in state.replicas.values() if not r.retiring and r.load > 0]
        for src in live:
            for host in live:
                if host.pipeline != src.pipeline and host.tp >= src.tp:
                    self.done_once = True
                    return [LaunchReplica(src.pipeline, host.devices, absorb=(src.id,), colocate_with=host.id,
                                          kv_share=self.kv_share)]
        return out


def _wl():
    return small_workload(gpus=4, pipelines=2, prompts=4, samples=4, steps=2, median=1500,
                          agentic=(False, True))


def test_simulator_runs_a_co_located_pair_and_counts_each_device_once():
    sim = Simulation(_wl(), ForcedColocation(), seed=1)
    res = sim.run()
    w = sim.world
    assert w.colocations  # the forced pair, and any that the policy's own `colocate` pricing makes
    for rec in w.colocations:
        assert rec["host_pipeline"] != rec["guest_pipeline"] and rec["end_t"] is not None
        assert rec["guest_kv_tokens"] > 0 and rec["host_kv_tokens"] > 0
    for p in _wl().pipelines:
        assert res["pipelines"][p.name]["samples"] == p.steps * p.samples_per_step
    assert device_overlaps(w.trace) == []  # the pair's shared time is the host's record alone
    gb = res["gap_breakdown"]
    assert gb["idle_device_s"] >= -1e-6
    assert sum(v for k, v in gb.items() if k.endswith("_device_s") and k != "gap_device_s") == \
        pytest.approx(gb["gap_device_s"])


def test_a_pair_decodes_slower_than_alone_in_the_simulator():
    wl = small_workload(gpus=4, pipelines=2, prompts=4, samples=4, steps=1, median=1500, agentic=(False,),
                        models=("qwen2.5-7b",))  # tp1 7B tails: a step is mostly weight reads
    sim = Simulation(wl, ForcedColocation(), seed=1)
    w = sim.world
    seen = []
    orig = w._migrate

    def spy(d):
        orig(d)
        dst = w.replicas.get(d.dst)
        if dst is not None and dst.partner is not None and dst.n and dst.partner.n:
            for r in (dst, dst.partner):
                seen.append((r.step_s, r.alone_step_s()))

    w._migrate = spy
    sim.run()
    assert seen
    for shared, alone in seen:
        assert shared > 1.2 * alone  # the other engine's weight reads are in every step


# ---- bad decisions ---------------------------------------------------------------------------
def test_kv_share_outside_zero_one_is_a_clear_error():
    with pytest.raises(SpecError, match="LaunchReplica.kv_share.*strictly between 0 and 1"):
        LaunchReplica("p0", (0,), colocate_with=3, kv_share=1.5)
    with pytest.raises(SpecError, match="LaunchReplica.kv_share.*unless colocate_with"):
        LaunchReplica("p0", (0,), kv_share=0.5)
    with pytest.raises(SpecError, match="LaunchReplica.colocate_with"):
        LaunchReplica("p0", (0,), colocate_with="r3", kv_share=0.5)


def _world_with_two_replicas():
    """A world whose two pipelines each run one replica (after the first decide round)."""
    sim = Simulation(_wl(), get_policy("jigsaw"), seed=1)
    w = sim.world
    w.decide_and_apply()
    reps = {}
    for r in w.replicas.values():
        reps.setdefault(r.pipeline, r)
    assert set(reps) == {"p0", "p1"}
    return w, reps["p0"], reps["p1"]


def test_bad_co_locations_are_refused_with_the_rule_they_break():
    w, a, b = _world_with_two_replicas()
    free = sorted(w.free)
    cases = [
        (LaunchReplica("p0", b.devices, colocate_with=999, kv_share=0.3), "replica 999 does not exist"),
        (LaunchReplica("p1", b.devices, colocate_with=b.id, kv_share=0.3), "belongs to p1 itself"),
        (LaunchReplica("p0", tuple(free[:len(b.devices)]) or (99,), colocate_with=b.id, kv_share=0.3),
         "exactly the host replica's devices"),
    ]
    for d, msg in cases:
        with pytest.raises(PolicyViolation, match=msg):
            w.apply(d)
    w.apply(LaunchReplica("p0", b.devices, colocate_with=b.id, kv_share=0.3))
    with pytest.raises(PolicyViolation, match="at most two"):
        w.apply(LaunchReplica("p0", b.devices, colocate_with=b.id, kv_share=0.3))


def test_a_split_the_host_cannot_fit_is_refused():
    w, a, b = _world_with_two_replicas()
    b.sync(w.t)
    b._base += b.cap  # the host holds more KV than a 1% share leaves it (the memory check, isolated)
    with pytest.raises(PolicyViolation, match="memory does not fit"):
        w.apply(LaunchReplica("p0", b.devices, colocate_with=b.id, kv_share=0.99))


def test_an_executor_without_co_location_refuses_it_naming_the_capability():
    w, a, b = _world_with_two_replicas()
    w.supports_colocation = False  # as the live runtime and host executors declare
    with pytest.raises(PolicyViolation, match="capability 'colocation'"):
        w.apply(LaunchReplica("p0", b.devices, colocate_with=b.id, kv_share=0.3))
    assert not w.snapshot().colocation


def test_the_round_keeps_a_pair_device_held_when_one_replica_retires():
    from types import SimpleNamespace

    from jigsaw_plugin.scheduler.colocation import colocate_tails
    from jigsaw_plugin.scheduler.jigsaw import JigsawConfig

    pipes = _two_tails(SMALL, 2000, 3000, 3000)
    guest = _replica(SMALL, "p0", 5, (4,), 2, 500)  # p0's replica sharing p1's device 4
    pipes[0] = _pipeline(SMALL, 0, range(4), list(pipes[0].replicas) + [guest])
    state = _state(pipes)
    # earlier in the round the guest was retired and its device counted free, as
    # _retire_drained / _consolidate_tails do
    rnd = SimpleNamespace(state=state, free=set(state.free) | {4}, gone={5})
    out: list = []
    colocate_tails(rnd, out, JigsawConfig())
    assert 4 not in rnd.free  # the host (replica 3) still holds it
    assert 3 in rnd.gone  # and the rest of the round leaves the pair alone


def test_a_co_located_run_is_deterministic():
    runs = []
    for _ in range(2):
        sim = Simulation(_wl(), ForcedColocation(), seed=2)
        res = sim.run()
        res.pop("scheduler")  # wall-clock decision latencies
        runs.append((res, sim.world.colocations))
    assert runs[0] == runs[1]
