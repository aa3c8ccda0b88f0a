"""What the jigsaw policy's tail consolidation reads (scheduler/jigsaw/tails.py, ``_consolidate_tails``
and ``_price_move``): the engines' reports before any prediction, no request views, and
a pricing that skips work without changing its answer."""

import random
from types import SimpleNamespace

import pytest

from jigsaw_plugin.costmodel import CostModel
from jigsaw_plugin.costmodel.profiles import hardware_profile, model_profile
from jigsaw_plugin.scheduler.decisions import Migrate, RetireReplica
from jigsaw_plugin.scheduler.jigsaw import Jigsaw
from jigsaw_plugin.scheduler.jigsaw.round import Ends
from jigsaw_plugin.scheduler.state import ReplicaView
from sim_helpers import full_tail_pricing, one_class_state

COST = CostModel(hardware_profile("h100"))
MODEL = model_profile("qwen2.5-7b")


class _Source:
    """A replica's predictions (what the executor's lazy source gives); request views are
    never to be read by the consolidation."""

    def __init__(self, work, left):
        self.work, self.left, self.reads = work, left, 0

    def work_and_left(self, replica=None):
        self.reads += 1
        return self.work, self.left

    def views(self, replica=None):
        raise AssertionError("the consolidation read a replica's request views")

    def predicted(self, replica=None):
        raise AssertionError("work_and_left is there")


def _replica(i, running, kv, left, tp=1, max_seqs=256, work=None, step_s=0.02):
    src = _Source(left * running if work is None else work, left)
    return ReplicaView.build(i, "p", tuple(range(10 * i, 10 * i + tp)), running, 0, kv, 400_000.0, max_seqs, False,
                             step_s, 0.0, src)


def test_price_move_skips_work_but_answers_as_the_full_pricing():
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    rng = random.Random(0)
    state = one_class_state(COST)
    p = SimpleNamespace(model=MODEL)
    moves = 0
    for _ in range(300):
        live = [_replica(i, rng.randint(1, 200), rng.uniform(1e3, 3e5), rng.uniform(1, 4000),
                         tp=rng.choice((1, 2, 4)), step_s=rng.uniform(0.01, 0.05)) for i in range(rng.randint(2, 8))]
        ends = {r.id: r.predicted_drain_s() for r in live}
        src = min(live, key=lambda r: r.load)
        extra = {r.id: (rng.randint(0, 20), rng.uniform(0.0, 4000.0)) for r in live if rng.random() < 0.3}
        slack = rng.choice((0.05, 0.2, 1.0))
        # the drains read as the pricing needs them (the consolidation's way), or all given
        lazy = Ends(slack, {} if rng.random() < 0.5 else dict(ends))
        got = policy._price_move(state, p, src, live, lazy, extra, set(), {r.tp for r in live})
        want = full_tail_pricing(policy, state, p, src, live, ends, extra, set(), slack)
        assert (got is None) == (want is None)
        if got is not None:
            moves += 1
            assert got[0] is want[0] and got[1] == pytest.approx(want[1], rel=1e-12)
    assert 10 < moves < 290  # both answers are exercised


def test_a_destination_straddling_nodes_is_priced_with_its_all_reduces_over_the_nics():
    # two tp2 siblings alike but for placement: devices 11-12 straddle nodes of 4, 16-17 do
    # not; the straddler's steps are slower (as the executor prices them), so the tail goes
    # to the other one, where on one node's price the two tie and the first would take it
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    p = SimpleNamespace(model=MODEL)

    def rep(i, devices, running, kv, left, step_s):
        return ReplicaView.build(i, "p", devices, running, 0, kv, 400_000.0, 256, False, step_s, 0.0,
                                 _Source(left * running, left))

    tail = rep(1, (20, 21), 2, 4_000.0, 300.0, 0.0060)
    across, inside = (rep(i, devs, 40, 40_000.0, 400.0, 0.0062) for i, devs in ((2, (11, 12)), (3, (16, 17))))
    live = [tail, across, inside]
    drains = {r.id: r.predicted_drain_s() for r in live}
    state = one_class_state(COST, gpus_per_node=4)
    got = policy._price_move(state, p, tail, live, Ends(0.2), {}, set(), {2})
    want = full_tail_pricing(policy, state, p, tail, live, drains, {}, set(), 0.2)
    assert want is not None and want[0] is inside and got[0] is inside and got[1] == want[1]
    flat = full_tail_pricing(policy, one_class_state(COST), p, tail, live, drains, {}, set(), 0.2)
    assert flat[0] is across and flat[1] == got[1]  # on one node's price: a tie, the first sibling takes it


def _round(replicas, t, done=60, samples=64, turns=1.0, changed=True):
    step = SimpleNamespace(samples=samples, gen_done=done)  # a StepView's progress
    p = SimpleNamespace(name="p", model=MODEL, replicas=tuple(replicas), next_stage=None, steps={0: step},
                        lengths=SimpleNamespace(turns=turns),  # mean turns of its finished trajectories
                        requests_changed=changed)
    state = one_class_state(COST, t, order=(p,))
    return SimpleNamespace(state=state, gone=set(), free=set(), spread=None,  # spread: no pipeline critical_spread serves
                           moved_in={})  # moves this round sent each replica: none yet


def test_a_tail_that_pays_moves_and_no_request_view_is_read():
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    # a long tail (4 requests, 3,000 tokens left at batch 4) beside a sibling that ends later
    tail, other = _replica(1, 4, 8_000.0, 3000.0), _replica(2, 20, 40_000.0, 3500.0)
    out = []
    policy._consolidate_tails(_round([tail, other], 5.0), out)
    assert out == [RetireReplica(1), Migrate(1, 2)]


def test_a_tail_no_sibling_can_take_is_not_read():
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    tail, full = _replica(1, 4, 8_000.0, 3000.0), _replica(2, 254, 40_000.0, 3500.0, max_seqs=256)
    out = []
    policy._consolidate_tails(_round([tail, full], 5.0), out)
    assert out == [] and tail._source.reads == 0 and full._source.reads == 0


def test_a_multi_turn_pipeline_whose_samples_are_mostly_still_generating_is_not_read():
    """Few requests on a replica of a multi-turn pipeline while most of the step's samples
    generate (waiting on a tool, between turns) is not a rollout tail: nothing is priced or
    predicted. A single-turn pipeline's small replica is a tail from the start."""
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    tail, other = _replica(1, 4, 8_000.0, 3000.0), _replica(2, 20, 40_000.0, 3500.0)
    out = []
    policy._consolidate_tails(_round([tail, other], 5.0, done=31, samples=64, turns=2.4), out)
    assert out == [] and tail._source.reads == 0 and other._source.reads == 0
    policy._consolidate_tails(_round([tail, other], 5.0, done=32, samples=64, turns=2.4), out)
    assert out == [RetireReplica(1), Migrate(1, 2)]
    out.clear()
    policy._consolidate_tails(_round([tail, other], 5.0, done=0, samples=64, turns=1.0), out)
    assert out == [RetireReplica(1), Migrate(1, 2)]


def test_a_tail_too_short_to_pay_for_any_move_reads_only_its_own_drain():
    """A tail whose freed device-seconds do not cover min_gain x the re-prefill onto any
    sibling's width is turned away on its own prediction: its siblings' drains are not read
    (they are once a sibling passes that check, for the bound and the latest ends)."""
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    # the siblings hold more than tail_requests (32): they are not tails themselves
    short, a, b = _replica(1, 4, 8_000.0, 2.0), _replica(2, 40, 40_000.0, 3500.0), _replica(3, 60, 60_000.0, 900.0)
    out = []
    policy._consolidate_tails(_round([short, a, b], 5.0), out)
    assert out == [] and short._source.reads == 1 and a._source.reads == 0 and b._source.reads == 0
    long_tail, a, b = _replica(1, 4, 8_000.0, 3000.0), _replica(2, 40, 40_000.0, 3500.0), _replica(3, 60, 6e4, 900.0)
    policy._consolidate_tails(_round([long_tail, a, b], 5.0), out)
    assert out[:1] == [RetireReplica(1)] and a._source.reads == 1 and b._source.reads == 1


def test_reprice_on_change_prices_only_pipelines_whose_requests_changed_since_read():
    """``reprice_on_change``: a pipeline whose engines report the request counts they did
    when its requests were last read, and no finished trajectory since, is not priced
    again (no drain read); once they change it is (on: the default). Off, it is priced."""
    tail, other = _replica(1, 4, 8_000.0, 3000.0), _replica(2, 20, 40_000.0, 3500.0)
    out = []
    Jigsaw(idle_spread=False, reprice_on_change=True)._consolidate_tails(_round([tail, other], 5.0, changed=False), out)
    assert out == [] and tail._source.reads == 0 and other._source.reads == 0
    Jigsaw(idle_spread=False, reprice_on_change=True)._consolidate_tails(_round([tail, other], 5.0), out)
    assert out == [RetireReplica(1), Migrate(1, 2)]
    out.clear()
    Jigsaw(idle_spread=False, reprice_on_change=False)._consolidate_tails(_round([tail, other], 5.0, changed=False), out)
    assert out == [RetireReplica(1), Migrate(1, 2)]
