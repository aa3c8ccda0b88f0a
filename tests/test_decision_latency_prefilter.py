"""The tail pricing's pre-filters (scheduler/jigsaw/tails.py, ``_price_move``; ``round.Ends``) turn
away only what the full pricing turns away: a width on which even the tail's own longest
request at its own batch ends past the bound takes no destination, and the bound and the
latest ends are computed once per pipeline a round (again only after a move)."""

import random
from types import SimpleNamespace

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
    def __init__(self, work, left):
        self.work, self.left = work, left

    def work_and_left(self, replica=None):
        return self.work, self.left


def _replica(i, running, kv, left, tp=1, step_s=0.02, max_seqs=256):
    return ReplicaView.build(i, "p", tuple(range(10 * i, 10 * i + tp)), running, 0, kv, 400_000.0, max_seqs, False,
                             step_s, 0.0, _Source(left * running, left))


class _CountingCost:
    """The cost model, counting the decode steps priced (what the pre-filter saves)."""

    def __init__(self):
        self.steps = 0

    def decode_step_s(self, *a):
        self.steps += 1
        return COST.decode_step_s(*a)

    def migration_s(self, *a):
        return COST.migration_s(*a)


def test_a_hopeless_width_prices_no_destination_but_another_width_still_takes_the_tail():
    """The tail's own end at its own batch on a tp1 sibling is past the bound (the tp1
    siblings end sooner than it could there); on tp2 it is not: the move goes to the tp2
    sibling, and no tp1 sibling's step times are priced (one floor step for the width)."""
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    p = SimpleNamespace(model=MODEL)
    # the tail ends last (300 tokens at 6.8 ms: 2.04 s); on tp1 its re-prefill and its own
    # step alone end at 2.28 s, past the bound (2.14 s); on tp2 at 1.51 s
    tail = _replica(1, 4, 8_000.0, 300.0, step_s=0.0068)
    narrow = [_replica(i, 40, 40_000.0, 200.0, step_s=0.00737) for i in (2, 3, 4)]
    wide = _replica(5, 40, 40_000.0, 200.0, tp=2, step_s=0.00497)
    live = [tail, *narrow, wide]
    cost = _CountingCost()
    state = one_class_state(cost)
    ends = Ends(0.05)
    got = policy._price_move(state, p, tail, live, ends, {}, set(), {1, 2})
    drains = {r.id: r.predicted_drain_s() for r in live}
    assert COST.migration_s(MODEL, 1, 8_000.0) + 300.0 * COST.decode_step_s(MODEL, 1, 4, 8_000.0) \
        > max(drains.values()) * 1.05  # tp1 is hopeless ...
    want = full_tail_pricing(policy, one_class_state(COST), p, tail, live, drains, {}, set(), 0.05)
    assert want is not None and want[0] is wide  # ... and the full pricing moves the tail onto tp2
    assert got is not None and got[0] is wide and got[1] == want[1]
    assert cost.steps == 1 + 1 + 2  # the tp1 floor, the tp2 floor, the tp2 sibling's two steps


def test_when_every_width_is_hopeless_the_siblings_are_not_priced():
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    p = SimpleNamespace(model=MODEL)
    tail = _replica(1, 4, 8_000.0, 300.0, step_s=0.0068)
    live = [tail] + [_replica(i, 40, 40_000.0, 200.0, step_s=0.00737) for i in range(2, 30)]
    cost = _CountingCost()
    got = policy._price_move(one_class_state(cost), p, tail, live, Ends(0.05), {}, set(), {1})
    drains = {r.id: r.predicted_drain_s() for r in live}
    assert got is None and full_tail_pricing(policy, one_class_state(COST), p, tail, live, drains, {}, set(), 0.05) is None
    assert cost.steps == 1  # the width's floor step only, not 28 siblings' two steps each


def test_a_move_ending_just_inside_the_bound_is_still_made():
    """The pre-filter's edge: the tail's own longest request at its own batch ends 0.5%
    inside the bound, and a near-empty sibling's step is barely slower than that floor:
    the move is made (a pre-filter that turned a width away a little early would drop it)."""
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    p = SimpleNamespace(model=MODEL)
    tail = _replica(1, 4, 8_000.0, 300.0, step_s=0.0068)  # 2.04 s
    empty = _replica(2, 1, 500.0, 10.0, step_s=0.006)  # nearly drained
    latest = _replica(3, 100, 90_000.0, 200.0, step_s=0.010892)  # ends last: 2.178 s
    live = [tail, empty, latest]
    drains = {r.id: r.predicted_drain_s() for r in live}
    bound = max(drains.values()) * 1.05
    floor_end = COST.migration_s(MODEL, 1, 8_000.0) + 300.0 * COST.decode_step_s(MODEL, 1, 4, 8_000.0)
    assert 0.99 * bound < floor_end < bound
    want = full_tail_pricing(policy, one_class_state(COST), p, tail, live, drains, {}, set(), 0.05)
    got = policy._price_move(one_class_state(COST), p, tail, live, Ends(0.05), {}, set(), {1})
    assert want is not None and want[0] is empty
    assert got is not None and got[0] is empty and got[1] == want[1]


def _case(rng, n):
    """A pipeline's replicas near the pre-filter's edge: tails whose own longest request,
    at their own batch, ends about when the latest sibling does; widths 1, 2 and 4 mixed."""
    out, tps = [], rng.choice(((1,), (2,), (1, 2), (1, 2, 4)))
    for i in range(n):
        tp = rng.choice(tps)
        running = rng.randint(1, 32) if rng.random() < 0.6 else rng.randint(33, 200)
        kv = running * rng.uniform(300, 8000)
        step = COST.decode_step_s(MODEL, tp, running, kv)
        out.append(_replica(i, running, kv, rng.uniform(20, 2000), tp=tp, step_s=step * rng.uniform(0.9, 1.2),
                            max_seqs=rng.choice((64, 256))))
    return out


def test_the_pre_filtered_pricing_makes_every_move_the_full_pricing_makes():
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    rng = random.Random(7)
    p = SimpleNamespace(model=MODEL)
    state = one_class_state(COST)
    moves = hopeless_all = hopeless_some = 0
    for _ in range(400):
        live = _case(rng, rng.randint(2, 12))
        drains = {r.id: r.predicted_drain_s() for r in live}
        extra = {r.id: (rng.randint(0, 20), rng.uniform(0.0, 4000.0)) for r in live if rng.random() < 0.3}
        slack = rng.choice((0.0, 0.05, 0.25))
        widths = {r.tp for r in live}
        bound = max(drains.values()) * (1 + slack)
        for src in live:
            if src.load > 32:
                continue
            got = policy._price_move(state, p, src, live, Ends(slack, dict(drains)), extra, set(), widths)
            want = full_tail_pricing(policy, one_class_state(COST), p, src, live, drains, extra, set(), slack)
            assert (got is None) == (want is None)
            if got is not None:
                moves += 1
                assert got[0] is want[0] and got[1] == want[1]
            own = {w: COST.migration_s(MODEL, w, src.kv_tokens)
                   + src.predicted_tokens_left * COST.decode_step_s(MODEL, w, src.load, src.kv_tokens) > bound
                   for w in widths}
            hopeless_all += all(own.values())
            hopeless_some += any(own.values()) and not all(own.values()) and got is not None
    # every path is exercised: moves made, every width hopeless, a move beside a hopeless width
    assert moves > 200 and hopeless_all > 20 and hopeless_some > 20


def _round(replicas):
    step = SimpleNamespace(samples=64, gen_done=60)
    # requests_changed: its engines' counts changed since last read, so the consolidation
    # prices it (``reprice_on_change``, on by default)
    p = SimpleNamespace(name="p", model=MODEL, replicas=tuple(replicas), next_stage=None, steps={0: step},
                        lengths=SimpleNamespace(turns=1.0), requests_changed=True)
    # spread=None: no pipeline critical_spread serves (its cap on merges is not in play)
    return SimpleNamespace(state=one_class_state(COST, order=(p,)), gone=set(), free=set(), spread=None,
                           moved_in={}), p


def _full_consolidation(policy, p, slack):
    """The consolidation with the full pricing, every drain read up front and the bound
    computed again for every tail (the pricing before ``Ends``)."""
    cfg = policy.config
    live = [r for r in p.replicas if r.load]
    tails = [r for r in live if not r.queued and r.load <= cfg.tail_requests
             and any(d.running + r.load <= d.max_seqs and d.kv_tokens + r.kv_tokens <= 0.9 * d.kv_capacity
                     for d in live if d is not r)]
    if len(live) < 2 or not tails:
        return []
    ends = {r.id: r.predicted_drain_s() for r in live}
    extra, used, out = {}, set(), []
    for src in sorted(tails, key=lambda r: r.load):
        if src.id in used:
            continue
        move = full_tail_pricing(policy, one_class_state(COST), p, src, live, ends, extra, used, slack)
        if move is None:
            continue
        dst, end = move
        out += [RetireReplica(src.id), Migrate(src.id, dst.id)]
        n_in, kv_in = extra.get(dst.id, (0, 0.0))
        extra[dst.id] = (n_in + src.load, kv_in + src.kv_tokens)
        ends[dst.id], ends[src.id] = end, 0.0
        used.update((src.id, dst.id))
    return out


def test_the_consolidation_makes_the_moves_of_the_full_pricing_round_after_round():
    """Several moves in one pipeline's round change the bound and the latest ends: what
    ``Ends`` keeps is computed again after each, as the full pricing does per tail."""
    policy = Jigsaw(idle_spread=False)  # the hand-built pipeline is alone: see idle_spread below
    rng = random.Random(11)
    several = 0
    for _ in range(300):
        rnd, p = _round(_case(rng, rng.randint(2, 16)))
        out = []
        policy._consolidate_tails(rnd, out)
        assert out == _full_consolidation(policy, p, policy.config.latency_slack)
        several += len(out) >= 4
    assert several > 10


def test_the_last_synchronous_pipelines_tail_moves_may_not_stretch_its_generation():
    # idle_spread: a pipeline alone in the run frees devices only for its own widened tails,
    # so a move is priced with no slack; an asynchronous one keeps latency_slack
    rng = random.Random(13)
    differ = 0
    for _ in range(200):
        replicas = _case(rng, rng.randint(2, 16))
        for mode, slack in (("sync", 0.0), ("async", Jigsaw().config.latency_slack)):
            rnd, p = _round(replicas)
            p.spec = SimpleNamespace(mode=mode)
            out = []
            Jigsaw()._consolidate_tails(rnd, out)
            assert out == _full_consolidation(Jigsaw(), p, slack)
        differ += _full_consolidation(Jigsaw(), p, 0.0) != _full_consolidation(Jigsaw(), p, 0.05)
    assert differ > 5
