"""The incremental ``SchedulerState`` (core.snapshot) against a from-scratch build.

At every decide round of short simulated runs, the state the policy receives (rows kept
across rounds, predictions cached and refreshed when stale, only the groups of new
requests asked) is compared with a state built from scratch at the same moment (every row
read again, the predictor asked again): the same replicas with the same loads and KV use,
the same requests with the same observations, and the same predicted remaining tokens
within the refresh policy's tolerance. The paths under it are tested on their own: the
per-replica running sums against the arrays, a group subset against a whole-pipeline
predictor call, rows matched by key and by id, the GC held off for a decide round.
"""

import numpy as np
import pytest

from jigsaw_plugin.core.snapshot import EXACT, RefreshPolicy, build_state
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.manager import get_plugin_manager, register
from jigsaw_plugin.scheduler import get_policy
from jigsaw_plugin.sim import Simulation
from sim_helpers import small_workload


class _Compare:
    """Before each policy round: the state it gets against a from-scratch one (defers to the policy)."""

    def __init__(self, policy):
        self.policy, self.sim = policy, None
        self.rounds = 0
        self.requests = 0
        self.rel_err: list[float] = []
        self.work_err: list[float] = []  # per replica: predicted work tokens, read before its views

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        ex = self.sim.world
        fresh = build_state(ex, state.memo, refresh=EXACT, caches={})
        assert [p.name for p in state.order] == [p.name for p in fresh.order]
        for p, q in zip(state.order, fresh.order):
            assert p.lengths == q.lengths  # the kept summary follows every finished trajectory and tool call
            assert [r.id for r in p.replicas] == [r.id for r in q.replicas]
            for r, s in zip(p.replicas, q.replicas):
                assert (r.running, r.queued, r.load, r.kv_tokens) == (s.running, s.queued, s.load, s.kv_tokens)
                self.work_err.append(abs(r.predicted_work_tokens - s.predicted_work_tokens)
                                     / max(s.predicted_work_tokens, 64.0))
                a, b = r.requests, s.requests
                assert [x.id for x in a] == [x.id for x in b]
                for x, y in zip(a, b):
                    assert (x.group, x.context_tokens, x.max_tokens, x.queued, x.replica) == \
                        (y.group, y.context_tokens, y.max_tokens, y.queued, y.replica)
                    assert abs(x.generated - y.generated) <= 1  # decode steps inferred from KV growth
                    assert x.in_flight_s == pytest.approx(y.in_flight_s, abs=1e-9)
                    assert 0 <= x.predicted_remaining <= x.max_tokens - x.generated or x.max_tokens <= x.generated
                    self.rel_err.append(abs(x.predicted_remaining - y.predicted_remaining)
                                        / max(y.predicted_remaining, 16.0))
                self.requests += len(a)
        self.rounds += 1
        return self.policy.decide(state)


def _run(wl, refresh=None, seed=3):
    pm = get_plugin_manager(load_entrypoints=False)
    policy = get_policy("jigsaw")
    cmp = _Compare(policy)
    register(pm, cmp, "compare")
    sim = Simulation(wl, policy, seed=seed, pm=pm)
    if refresh is not None:
        sim.world.prediction_refresh = refresh
    cmp.sim = sim
    sim.run()
    return cmp


@pytest.mark.parametrize("agentic,carry_min_rows", [((False, True), 64), ((False, True), 4)])
def test_incremental_state_matches_a_from_scratch_build(agentic, carry_min_rows):
    """carry_min_rows=4: replicas of this small run keep their rows across version changes."""
    wl = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=2, agentic=agentic, median=600)
    cmp = _run(wl, refresh=RefreshPolicy(carry_min_rows=carry_min_rows))
    assert cmp.rounds > 10 and cmp.requests > 500
    err = np.asarray(cmp.rel_err)
    # cached predictions move with the tokens generated since; the predictor's own answer
    # moves with its refits and siblings: close, not equal (docs/predictor.md)
    assert np.median(err) < 0.05
    assert np.percentile(err, 95) < 0.2 and err.max() < 0.5
    work = np.asarray(cmp.work_err)
    assert np.median(work) < 0.05 and np.percentile(work, 95) < 0.25


def test_exact_refresh_equals_the_from_scratch_build():
    wl = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=1, agentic=(False, True), median=600)
    cmp = _run(wl, refresh=EXACT)
    assert cmp.rounds > 5 and cmp.requests > 100
    assert max(cmp.rel_err) == 0.0


@pytest.mark.parametrize("field,value", [("history_fraction", -0.1), ("progress_fraction", 2.0),
                                         ("progress_fraction", float("nan")), ("carry_drift", "x"),
                                         ("carry_min_rows", 0), ("exact", "yes")])
def test_refresh_policy_names_the_bad_field(field, value):
    with pytest.raises(SpecError, match=f"RefreshPolicy.{field}"):
        RefreshPolicy(**{field: value})


class _Sums:
    """Each round: a replica's predicted work and longest remaining (kept as running sums,
    O(1) per round) against the same figures summed over its request views (the arrays)."""

    def __init__(self, policy):
        self.policy, self.replicas = policy, 0

    @hookimpl(tryfirst=True)
    def jigsaw_schedule(self, state):
        for p in state.order:
            for r in p.replicas:
                work, left = r.predicted_work_tokens, r.predicted_tokens_left
                pred = [x.predicted_remaining for x in r.requests]
                assert work == pytest.approx(sum(pred), rel=1e-9, abs=1e-6)
                assert left == pytest.approx(max(pred, default=0.0), rel=1e-9, abs=1e-6)
                self.replicas += 1
        return self.policy.decide(state)


def test_running_sums_equal_the_sums_over_request_views():
    """Rows never carried (carry_min_rows above any replica): the views are read from the
    same rows the sums were kept for, so both must agree to rounding."""
    wl = small_workload(gpus=8, pipelines=2, prompts=8, samples=4, steps=2, agentic=(False, True), median=600)
    pm = get_plugin_manager(load_entrypoints=False)
    policy = get_policy("jigsaw")
    sums = _Sums(policy)
    register(pm, sums, "sums")
    sim = Simulation(wl, policy, seed=5, pm=pm)
    sim.world.prediction_refresh = RefreshPolicy(carry_min_rows=10**6)
    sim.run()
    assert sums.replicas > 200


def test_a_group_subset_is_predicted_as_in_the_whole_pipeline():
    """New turns and migrated requests have only their GRPO groups asked (with their
    siblings): the built-in predictor must answer those rows as a whole-pipeline call does."""
    from jigsaw_plugin.predict import HistoryPredictor, LengthHistory
    from jigsaw_plugin.predict.batch import RequestBatch

    rng = np.random.default_rng(1)
    history = LengthHistory(8192)
    for step in range(3):
        for group in range(64):
            for _ in range(4 if step < 2 else int(rng.integers(0, 4))):
                history.record_finished(step, group, 0, int(min(8192, rng.lognormal(6.0, 0.8))))
    n = 64 * 8
    group = np.repeat(np.arange(64), 8)
    batch = RequestBatch(np.full(n, 2), group, rng.integers(0, 2, n), rng.integers(0, 900, n).astype(float),
                         np.full(n, 8192.0))
    predictor = HistoryPredictor()
    whole = predictor.predict(batch, history)
    rows = np.isin(group, [3, 17, 40])
    part = RequestBatch(batch.step[rows], batch.group[rows], batch.turn[rows], batch.generated[rows],
                        batch.max_tokens[rows])
    np.testing.assert_allclose(predictor.predict(part, history), whole[rows], rtol=1e-12)


class _Engine:
    """An engine whose rows are given (only ``request_rows`` and ``version`` are read)."""

    def __init__(self, rows):
        self.rows, self.version = rows, 0

    def request_rows(self, t):
        return list(self.rows)


def _row(sample, turn, generated, queued=False, step=1):
    from jigsaw_plugin.ids import RequestId

    return (RequestId("p", step, sample, turn), sample // 4, None, 100, generated, 4096, 1.0, queued)


@pytest.mark.parametrize("big", [False, True])
def test_carried_rows_drop_the_finished_ones_by_id(big):
    """Rows are matched by packed (step, sample, turn) keys; ids whose fields do not fit
    them (a turn of None, a huge sample index) are matched one by one: same answer. The
    kept sums move with the decoding and agree with the arrays."""
    from jigsaw_plugin.core.snapshot import ReplicaObs, _id_keys, _ReplicaRows

    base = 1 << 40 if big else 0
    rows = [_row(base + i, None if big else 0, 10 + i, queued=i >= 80) for i in range(100)]
    obs = ReplicaObs(80, 20, 0.0, 1e6, 256, 0.01, 0.0)
    r = _ReplicaRows(_Engine(rows), obs, 0.0, None)
    assert (r.key is None) == big and r.unseen
    r.predicted_now(np.full(100, 50.0))
    finished = [rows[3][0], rows[7][0], _row(base + 999, 0, 0)[0]]  # the last one is not here
    gone = r.rows_of(finished, _id_keys(finished))
    assert sorted(gone.tolist()) == [3, 7]
    # 0.2 s at 0.01 s a step: the 78 running rows left decoded 20 tokens each, queued ones none
    assert r.carry(ReplicaObs(78, 20, 0.0, 1e6, 256, 0.01, 0.0), 0.2, 1, gone, RefreshPolicy())
    assert r.work_and_left() == pytest.approx((78 * 30 + 20 * 50, 50.0))
    pred = r.pred
    assert pred[3] == pred[7] == 0.0 and pred[0] == pytest.approx(30.0) and pred[90] == 50.0
    assert r.work_and_left() == pytest.approx((pred.sum(), pred.max())) and not r.outlived()
    r.advance(ReplicaObs(78, 20, 78 * 40.0, 1e6, 256, 0.01, 0.0), 0.6)  # KV grew 40 a row: past 50
    assert r.work_and_left() is None and r.outlived()  # a row within a token of its final: the arrays
    assert r.work_and_left_of() == pytest.approx((78 * 1 + 20 * 50, 50.0))  # one token while budget lasts
    again = _ReplicaRows(_Engine(rows[:3] + rows[4:7] + rows[8:]), obs, 1.0, r)
    assert not again.unseen  # every row it holds was asked before


def test_decide_holds_the_garbage_collector_off_for_the_round():
    import gc

    seen = []

    class Probe:
        @hookimpl(tryfirst=True)
        def jigsaw_schedule(self, state):
            seen.append(gc.isenabled())
            return None

    wl = small_workload(gpus=8, pipelines=2, prompts=4, samples=4, steps=1, agentic=(False, False), median=200)
    pm = get_plugin_manager(load_entrypoints=False)
    register(pm, Probe(), "probe")
    sim = Simulation(wl, get_policy("jigsaw"), seed=0, pm=pm)
    assert gc.isenabled()
    sim.run()
    assert seen and not any(seen) and gc.isenabled()
