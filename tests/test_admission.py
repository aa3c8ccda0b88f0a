"""Admission limits (``scheduler/admission.py``, ``AdmissionLimit``): the KV-peak arithmetic,
the decision's validation, the simulator's engine honouring a limit, an executor without
the capability refusing it, and the jigsaw policy's rule on a hand-built state."""

import dataclasses

import numpy as np
import pytest

from jigsaw_plugin.costmodel import CostModel, hardware_profile, model_profile
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.scheduler import AdmissionLimit, LaunchReplica, get_policy
from jigsaw_plugin.scheduler.admission import HeldFit, fitting, launch_limit, peak_kv_tokens, spread_of, trade_count
from jigsaw_plugin.scheduler.jigsaw import JigsawMemo
from jigsaw_plugin.scheduler.state import (
    DeviceTask,
    DeviceView,
    LengthSummary,
    PipelineView,
    ReplicaView,
    RequestView,
    SchedulerState,
    StepView,
)
from jigsaw_plugin.sim.replica import Replica, Request
from sim_helpers import small_workload

COST = CostModel(hardware_profile("h100"))
MODEL = model_profile("qwen2.5-7b")


# ---- the arithmetic ------------------------------------------------------------------------
def test_peak_is_just_before_a_sequence_ends():
    # 10 tokens held, 5 to go; 20 held, 1 to go: just before the second ends both hold one
    # more token each (32); later only the first grows, to 15
    assert peak_kv_tokens(np.array([10.0, 20.0]), np.array([5.0, 1.0])) == 32.0
    assert peak_kv_tokens(np.array([10.0, 20.0]), np.array([50.0, 1.0])) == 60.0
    assert peak_kv_tokens(np.array([]), np.array([])) == 0.0


def _brute_peak(held, left):
    t_max = int(left.max()) if len(left) else 0
    return max(float(np.sum((held + t) * (left >= t))) for t in range(t_max + 1))


def test_peak_matches_stepping_the_cache():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 12))
        held = rng.integers(1, 100, n).astype(float)
        left = rng.integers(0, 60, n).astype(float)
        assert peak_kv_tokens(held, left) == pytest.approx(_brute_peak(held, left))


def test_fitting_is_the_longest_prefix_that_fits():
    # of all the sequences, running included; the waiting ones admissible after the running
    # ones are the rest of it
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(2, 30))
        held = rng.integers(50, 500, n).astype(float)
        left = rng.integers(10, 2000, n).astype(float)
        running = int(rng.integers(1, n))
        cap = float(rng.integers(200, 20000))
        fits = [k for k in range(n + 1) if peak_kv_tokens(held[:k], left[:k]) <= cap]
        assert fitting(held, left, cap) == max(fits)
        assert max(0, fitting(held, left, cap) - running) == max(0, max(fits) - running)


def test_fewer_than_the_running_ones_fit_where_they_alone_outgrow_the_cache():
    # 4 running that together outgrow the cache: fewer than the running ones fit
    held, left = np.full(6, 1000.0), np.full(6, 1000.0)
    assert fitting(held, left, 6_000.0) == 3
    assert max(0, fitting(held, left, 6_000.0) - 4) == 0  # no waiting one admissible
    shape = np.ones(10)
    assert fitting(held, left, 6_000.0, shape) == 3


def test_a_margin_above_the_expected_peak_admits_fewer_where_lengths_are_uncertain():
    # 100 waiting sequences of 200 tokens, 1,000 predicted each, lengths spread as a long tail
    shape = np.sort(np.array([0.2] * 6 + [1.0, 1.5, 2.5, 3.3]))
    shape = shape / shape.mean()
    held, left = np.full(100, 200.0), np.full(100, 1000.0)
    at_mean = fitting(held, left, 40_000.0, shape)
    assert fitting(held, left, 40_000.0, shape, margin_sd=2.0) < fitting(held, left, 40_000.0, shape, margin_sd=1.0) < at_mean
    # the margin is the standard deviation of the sum: by brute force over the draws of 3,
    # at the times the peak is evaluated (up to the longest prediction's longest draw)
    t = np.linspace(0.0, 1000.0 * shape[-1], 48)
    k = 3
    draws = np.array(np.meshgrid(*[shape] * k)).reshape(k, -1)  # every joint draw of 3 sequences
    kv = ((200.0 + t[None, None, :]) * (draws[:, :, None] * 1000.0 > t[None, None, :])).sum(axis=0)
    sd = kv.std(axis=0)
    peak = (kv.mean(axis=0) + sd).max()
    assert fitting(held[:k], left[:k], peak + 1e-6, shape, margin_sd=1.0) == k
    assert fitting(held[:k], left[:k], peak * 0.999, shape, margin_sd=1.0) < k
    # lengths known exactly (every draw the mean): no variance, no margin
    assert fitting(held, left, 40_000.0, np.ones(10), margin_sd=2.0) == fitting(held, left, 40_000.0, np.ones(10))



@pytest.mark.parametrize("margin", [0.0, 1.0])
def test_held_fit_counts_as_fitting_of_the_joined_sequences(margin):
    """``HeldFit``: a replica's held sequences summed once, each candidate set continuing
    the sums, gives ``fitting``'s count of the joined arrays, where the candidates stay within
    the held ones' longest prediction (the same grid), past it (``fitting`` itself), where
    the held ones already overflow, and without a spread."""
    rng = np.random.default_rng(7)
    shape = np.sort(rng.lognormal(0.0, 0.8, 400))
    shape /= shape.mean()
    for case in range(60):
        n = int(rng.integers(0, 40))
        held = rng.uniform(100, 4000, n)
        left = rng.uniform(10, 3000, n)
        capacity = float(rng.uniform(0.3, 1.5)) * float(held.sum() + left.sum() + 1)
        for spread in (shape, None):
            fit = HeldFit(held, left, capacity, spread, margin, running=n)
            for _ in range(4):
                m = int(rng.integers(0, 12))
                more_h = rng.uniform(100, 4000, m)
                more_r = rng.uniform(10, 5000 if case % 3 == 0 else 2500, m)
                want = fitting(np.concatenate((held, more_h)), np.concatenate((left, more_r)), capacity, spread,
                               margin, n)
                assert fit.count(more_h, more_r) == want, (case, n, m)


def test_launch_limit_from_observed_lengths():
    # every sequence ends at 900 tokens after a 100-token prompt: each peaks at 1000
    assert launch_limit(np.full(10, 900.0), 100.0, 10_500.0) == 10
    # half end at once: the peak per sequence is max(100 x 1, 1000 x 0.5) = 500
    assert launch_limit(np.array([0.0, 900.0]), 100.0, 10_000.0) == 20
    assert launch_limit(np.array([]), 100.0, 1e6) is None


# ---- the decision --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_admission_limit_rejects_a_bad_count(bad):
    with pytest.raises(SpecError, match="AdmissionLimit.max_seqs"):
        AdmissionLimit(1, bad)
    with pytest.raises(SpecError, match="LaunchReplica.max_seqs"):
        LaunchReplica("p0", (0,), max_seqs=bad)


def test_admission_limit_rejects_a_bad_replica():
    with pytest.raises(SpecError, match="AdmissionLimit.replica"):
        AdmissionLimit("r1", 4)


# ---- the simulator's engine ----------------------------------------------------------------
def _requests(n, context=100, target=50):
    return [Request("p0", 0, i, 0, context, target, 0) for i in range(n)]


def test_the_engine_admits_up_to_its_batch_limit():
    rep = Replica(0, "p0", (0,), MODEL, COST)
    rep.max_seqs = 3
    for r in _requests(8):
        rep.enqueue(r, 0.0)
    rep.admit(0.0)
    assert (rep.n, len(rep.queue)) == (3, 5)
    rep.max_seqs = 6
    rep.admit(0.0)
    assert (rep.n, len(rep.queue)) == (6, 2)


def _world(policy):
    from jigsaw_plugin.sim.engine import Simulation

    return Simulation(small_workload(gpus=4, pipelines=1, prompts=4, samples=4), policy, 0).world


def test_the_simulator_applies_a_limit_and_lifts_it():
    w = _world(get_policy("verl-sync"))
    w.decide_and_apply(4)  # verl-sync starts the rollout on its replicas
    rep = next(iter(w.replicas.values()))
    w.apply(AdmissionLimit(rep.id, 1))
    assert rep.max_seqs == 1
    w.apply(AdmissionLimit(rep.id, None))
    assert rep.max_seqs == COST.f.max_num_seqs


def test_an_executor_without_the_capability_refuses_it():
    from jigsaw_plugin.core.executor import PolicyViolation

    w = _world(get_policy("verl-sync"))
    w.decide_and_apply(4)
    rep = next(iter(w.replicas.values()))
    w.supports_admission_limits = False
    with pytest.raises(PolicyViolation, match="capability 'admission_limits'"):
        w.apply(AdmissionLimit(rep.id, 2))
    with pytest.raises(PolicyViolation, match="capability 'admission_limits'"):
        w.apply(LaunchReplica(rep.pipeline, (3,), max_seqs=2))


def test_a_limit_above_the_engines_own_is_refused():
    from jigsaw_plugin.core.executor import PolicyViolation

    w = _world(get_policy("verl-sync"))
    w.decide_and_apply(4)
    rep = next(iter(w.replicas.values()))
    with pytest.raises(PolicyViolation, match="AdmissionLimit.max_seqs"):
        w.apply(AdmissionLimit(rep.id, COST.f.max_num_seqs + 1))
    with pytest.raises(PolicyViolation, match="unknown replica"):
        w.apply(AdmissionLimit(10_000, 2))


# ---- the policy's rule on a hand-built state ----------------------------------------------
SPEC = small_workload(gpus=8, pipelines=1, prompts=8, samples=4).pipelines[0]


class _Views:
    def __init__(self, rows):
        self.rows = tuple(rows)

    def views(self, replica=None):
        return self.rows

    def predicted(self, replica=None):
        return np.array([r.predicted_remaining for r in self.rows])


def _replica(rid, running, queued, context, generated, left, capacity, max_seqs=256):
    rows = [RequestView(RequestId(SPEC.name, 0, i, 0), i, None, context, generated if i < running else 0, 8192,
                        1.0, rid, i >= running, left) for i in range(running + queued)]
    kv = float(running * (context + generated))
    return ReplicaView(rid, SPEC.name, (rid,), running, queued, kv, capacity, max_seqs, False, 0.02, 0.0,
                       _Views(rows))


def _state(replicas, final_context, admission_limits=True, history=None):
    p = PipelineView(
        name=SPEC.name, index=0, spec=SPEC, model=MODEL, stages=("old_log_prob", "adv", "update_actor", "weight_sync"),
        static_devices=tuple(range(8)), gen_next=1, train_next=0, stage_next=0, stage_running=False, version=0,
        rollout_version=0, done=False, generating=True, pending=0, replicas=tuple(replicas),
        steps={0: StepView(0, 64, 10, 10, 0, 0.0, {}, {}, 0)}, history=history,
        lengths=LengthSummary(10, 100.0, final_context - 100.0, final_context, 1.0, 8192.0), stage_history_s={},
        running_stage_end_t=None, running_stage=None)
    busy = {r.devices[0]: DeviceTask("replica", SPEC.name, replica=r.id) for r in replicas}
    devices = tuple(DeviceView(d, 0, busy.get(d), (SPEC.name,), SPEC.name) for d in range(8))
    home = {SPEC.name: (tuple(range(8)), tuple(range(8)))}
    return SchedulerState(t=50.0, gpus=8, gpus_per_node=8, devices=devices, free=frozenset(range(len(replicas), 8)),
                          order=(p,), cost=COST, max_num_seqs=256, memo=JigsawMemo(home, {d: SPEC.name for d in range(8)}),
                          admission_limits=admission_limits)


def _limits(out):
    return {d.replica: d.max_seqs for d in out if isinstance(d, AdmissionLimit)}


def test_a_replica_whose_waiting_requests_would_overflow_its_cache_is_limited():
    # 4 running at 1,100 tokens, each predicted 1,000 more (a peak of 8,400); 6 waiting
    # prompts of 100 tokens, 1,000 more each: a 12,000-token cache holds some of them
    rep = _replica(0, 4, 6, 100, 1000, 1000.0, 12_000.0)
    out = get_policy("jigsaw", multiplex=False, admission=True).decide(_state([rep], final_context=2000.0))
    views = rep.requests
    held = np.array([v.context_tokens + v.generated for v in views], float)
    left = np.array([v.predicted_remaining for v in views], float)
    assert _limits(out) == {0: fitting(held, left, 12_000.0)}  # no history: point predictions
    assert 4 < _limits(out)[0] < 10


def test_expected_peak_admits_more_than_point_predictions_of_long_tailed_lengths():
    # lengths spread as a long tail (most short, a few long): a sequence predicted to
    # generate 1,000 more tokens most likely ends sooner and frees its cache
    shape = np.sort(np.array([0.1] * 8 + [4.6, 4.6])) / np.mean([0.1] * 8 + [4.6, 4.6])
    held = np.full(40, 200.0)
    left = np.full(40, 1000.0)
    point = fitting(held, left, 20_000.0)
    spread = fitting(held, left, 20_000.0, shape)
    assert point < spread <= 40
    # every draw the mean: the expected peak is the point one
    assert abs(fitting(held, left, 20_000.0, np.ones(10)) - point) <= 1


def test_a_replica_whose_running_sequences_outgrow_its_cache_sheds_them():
    # 8 running at 1,100 tokens, each predicted 1,000 more (a peak of 16,800) in a
    # 12,000-token cache: the engine will preempt some whatever is admitted; the limit
    # falls to the 5 that fit (peak 10,500), so that what it preempts is not let back in
    # as each sequence ends, to be preempted and re-prefilled again
    rep = _replica(0, 8, 2, 100, 1000, 1000.0, 12_000.0)
    state = _state([rep], final_context=2000.0)
    assert _limits(get_policy("jigsaw", multiplex=False, admission=True).decide(state)) == {0: 5}
    # switched off: the limit holds at what runs (nothing more admitted, nothing shed)
    assert _limits(get_policy("jigsaw", multiplex=False, admission=True, shed_admission=False).decide(state)) == {0: 8}


def test_no_limit_where_everything_fits_at_the_mean_final_context():
    rep = _replica(0, 4, 6, 100, 1000, 1000.0, 1e6)
    assert _limits(get_policy("jigsaw", multiplex=False, admission=True).decide(_state([rep], final_context=2000.0))) == {}
    # ... and a limit set earlier is lifted
    limited = dataclasses.replace(rep, max_seqs=5)
    assert _limits(get_policy("jigsaw", multiplex=False, admission=True).decide(_state([limited], final_context=2000.0))) == {0: None}


def test_running_sequences_past_the_mean_final_context_are_read_not_assumed_to_fit():
    # the mean final context (1,200) is of the short trajectories finished so far; the 8
    # running ones already hold 3,100 tokens each and are predicted 1,000 more: 10 x 1,200
    # fits a 14,000-token cache, but the 8 alone peak at 32,800, so the rule reads them
    rep = _replica(0, 8, 2, 100, 3000, 1000.0, 14_000.0)
    limits = _limits(get_policy("jigsaw", multiplex=False, admission=True).decide(_state([rep], final_context=1200.0)))
    held = np.array([v.context_tokens + v.generated for v in rep.requests], float)
    left = np.array([v.predicted_remaining for v in rep.requests], float)
    assert limits == {0: fitting(held, left, 14_000.0)} and limits[0] < 8


def test_no_limit_on_an_executor_without_the_capability_or_with_the_switch_off():
    rep = _replica(0, 4, 6, 100, 1000, 1000.0, 12_000.0)
    assert _limits(get_policy("jigsaw", multiplex=False, admission=True).decide(
        _state([rep], final_context=2000.0, admission_limits=False))) == {}
    off = get_policy("jigsaw", multiplex=False, admission=False)
    assert _limits(off.decide(_state([rep], final_context=2000.0))) == {}
    # on by default (since stop 52)
    assert _limits(get_policy("jigsaw", multiplex=False).decide(_state([rep], final_context=2000.0))) == {0: 7}


# ---- the simulator's invariants with admission limits (hypothesis) -------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jigsaw_plugin.sim import Simulation  # noqa: E402
from sim_helpers import HookLog, assert_each_request_once, device_overlaps  # noqa: E402


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_invariants_hold_with_admission_limits(data):
    # long responses on CPU "devices" (4 GB each): caches overflow, the policy holds
    # admissions back, engines still preempt what outgrows them
    modes = data.draw(st.sampled_from([("sync",), ("async",), ("sync", "async")]))
    wl = small_workload(gpus=8, pipelines=2, prompts=data.draw(st.integers(2, 6)), samples=data.draw(st.integers(2, 4)),
                        steps=data.draw(st.integers(1, 3)), agentic=data.draw(st.sampled_from([(False,), (False, True)])),
                        modes=modes, staleness=tuple(0 if m == "sync" else 1 for m in modes), models=("qwen2.5-0.5b",),
                        max_len=8192, median=data.draw(st.sampled_from([1500, 4000])), gpu="cpu")
    log = HookLog()
    sim = Simulation(wl, get_policy("jigsaw", admission=True), seed=data.draw(st.integers(0, 3)), hooks=log,
                     record_requests=True)
    result = sim.run()
    assert_each_request_once(result, log, wl)
    for p in wl.pipelines:
        assert result["pipelines"][p.name]["max_staleness"] <= sim.policy.staleness_bound(sim.world.pipelines[p.name])
    assert device_overlaps(sim.world.trace) == []
    assert all(r.max_seqs >= 1 for r in sim.world.replicas.values())


def _fitting_all_at_once(held, left, cap, shape, margin_sd):
    """``fitting``'s count with a spread by its definition, over every sequence at once: the
    longest prefix whose summed expected KV (plus ``margin_sd`` of its deviation) stays
    within the cache at every evaluated time."""
    from jigsaw_plugin.scheduler.admission import _grid, kv_moments

    mean, var = kv_moments(held, left, shape, _grid(left, shape))
    total = np.cumsum(mean, axis=0) + margin_sd * np.sqrt(np.cumsum(var, axis=0))
    fits = np.maximum.accumulate(total.max(axis=1)) <= cap
    return int(np.argmin(fits)) if not fits.all() else len(held)


def test_fitting_with_a_spread_a_block_at_a_time_counts_as_over_all_sequences_at_once():
    # a queue of hundreds behind a full replica is evaluated only up to the first sequence
    # that does not fit, whatever the running count or the guess it is told
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 700))
        held = rng.integers(10, 30_000, n).astype(float)
        left = rng.lognormal(6, 1.2, n)
        shape = np.sort(rng.lognormal(6, 1.0, int(rng.integers(1, 300))))
        shape /= shape.mean()
        cap = float(rng.uniform(1e3, 3e6))
        margin = float(rng.choice([0.0, 1.0, 2.0]))
        want = _fitting_all_at_once(held, left, cap, shape, margin)
        assert fitting(held, left, cap, shape, margin) == want
        assert fitting(held, left, cap, shape, margin, running=int(rng.integers(0, n + 1))) == want
        # the memo's guess (a replica's last count) only moves where the first block ends
        assert fitting(held, left, cap, shape, margin, guess=int(rng.integers(0, n + 2))) == want


def _random_queue(rng, n: int) -> tuple:
    """``n`` sequences of a replica as the fitting tests draw them: KV held, predicted
    remaining tokens (lognormal) and a unit-mean spread of 50 finished lengths."""
    held = rng.integers(10, 30_000, n).astype(float)
    left = rng.lognormal(6, 1.2, n)
    shape = np.sort(rng.lognormal(6, 1.0, 50))
    return held, left, shape / shape.mean()


def test_the_memo_answers_as_fitting_and_asks_again_on_any_change():
    # a replica asking with the same arrays (rounds at one instant) gets the count back
    # without the evaluation; any element, the capacity or the spread changed is evaluated
    from jigsaw_plugin.scheduler import admission

    rng = np.random.default_rng(11)
    memo = admission.FittingMemo()
    calls = []
    real = admission.fitting

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    admission.fitting = counted
    try:
        for _ in range(200):
            held, left, shape = _random_queue(rng, int(rng.integers(2, 300)))
            n = len(held)
            cap = float(rng.uniform(1e4, 3e6))
            run = int(rng.integers(0, n + 1))
            memo.round()
            assert memo.fitting(5, held, left, cap, shape, 1.0, run) == real(held, left, cap, shape, 1.0, run)
            before = len(calls)
            memo.round()
            assert memo.fitting(5, held.copy(), left.copy(), cap, shape.copy(), 1.0, run) == \
                real(held, left, cap, shape, 1.0, run)
            assert len(calls) == before  # equal arrays: kept
            changed = [(held + np.eye(1, n, int(rng.integers(n)))[0] * 5_000, left, cap, shape),
                       (held, left * 1.5, cap, shape), (held, left, cap / 3, shape), (held, left, cap, shape[::2] / shape[::2].mean())]
            for h, lft, c, s in changed:
                memo.round()
                assert memo.fitting(5, h, lft, c, s, 1.0, run) == real(h, lft, c, s, 1.0, run)
            assert len(calls) == before + len(changed)
    finally:
        admission.fitting = real


def test_a_replica_starts_with_the_limit_its_own_class_holds():
    # a pool of 4 H100 and 4 devices of a third of the memory: a replica launched on the
    # small ones starts with a lower batch limit (its KV cache), not the first class's
    from jigsaw_plugin.scheduler.jigsaw.round import Round
    from jigsaw_plugin.scheduler.state import DeviceClassView

    class _History:  # what the rule reads of a pipeline's history: recent first-turn lengths
        def recent_lengths(self, turn):
            return np.full(64, 6000.0)

    small = CostModel(hardware_profile({"name": "small", "flops_tflops": 165.0, "hbm_tbps": 1.0,
                                         "memory_gb": 26.0, "link_gbps": 32.0}))
    classes = (DeviceClassView(0, "big", "h100", range(0, 4), COST, None, False, None),
               DeviceClassView(1, "small", "small", range(4, 8), small, None, False, None))
    state = dataclasses.replace(_state([], final_context=2000.0), classes=classes)
    p = dataclasses.replace(state.order[0], history=_History())
    pol = get_policy("jigsaw")
    home, owner = pol._homes(state)
    limits = pol._launch_limits_of(Round(state, home, owner), p, [(0,), (4,), (5,)])
    on_big, on_small = limits[(0,)], limits[(4,)]
    assert on_big == launch_limit(np.full(64, 6000.0), p.lengths.prompt_tokens, COST.kv_capacity_tokens(MODEL, 1))
    assert on_small == launch_limit(np.full(64, 6000.0), p.lengths.prompt_tokens, small.kv_capacity_tokens(MODEL, 1))
    assert on_small < on_big and limits[(5,)] == on_small


# ---- trading a full cache's overflows for a larger batch ---------------------------------
def _agent_queue(n=400, running=40, context=9_000.0, prompt=1_500.0, left=9_000.0):
    """``running`` sequences deep into long contexts, then a queue of fresh prompts, each
    predicted ``left`` more tokens, lengths spread as a long tail (lognormal, sigma 1)."""
    held = np.array([context] * running + [prompt] * (n - running))
    lens = np.random.default_rng(0).lognormal(0.0, 1.0, 400)
    return held, np.full(n, left), np.sort(lens) / lens.mean()


def test_trade_admits_past_the_fitting_count_where_recompute_is_cheap_against_a_decode_step():
    held, left, shape = _agent_queue()
    cap = 460_000.0
    first = fitting(held, left, cap, shape, 1.0, 40)
    flat = lambda b, kv: 0.03 + 0.0 * b  # every step costs the same whatever its batch
    assert trade_count(held, left, cap, shape, first, 256, flat, 0.0) > first  # recompute free
    assert trade_count(held, left, cap, shape, first, 256, flat, 1.0) == first  # a token's recompute: 33 steps


def test_trade_never_goes_below_the_fitting_count_nor_past_the_engines_limit():
    held, left, shape = _agent_queue()
    flat = lambda b, kv: 0.03 + 0.0 * b
    for first in (0, 10, 60):
        got = trade_count(held, left, 460_000.0, shape, first, 90, flat, 0.0)
        assert first <= got <= 90
    assert trade_count(held, left, 460_000.0, shape, 500, 256, flat, 0.0) == 500  # nothing past it to try
    assert trade_count(held, left, 460_000.0, None, 30, 256, flat, 0.0) == 30  # no spread observed: no trade


def test_trade_prices_the_hardware_a_bandwidth_bound_a100_overcommits_a_compute_poor_h20_does_not():
    # the same queue, scaled to each replica's cache: a 14B on 2 A100 (decode steps read a
    # full cache's KV, prefill is cheap) and a 32B on 4 H20 (a larger batch barely speeds a
    # step, prefill is dear): benchmarks/single_job.py's s23000 and s23006
    counts = {}
    for gpu, name, tp in (("a100", "qwen2.5-14b", 2), ("h20", "qwen3-32b", 4)):
        cost, m = CostModel(hardware_profile(gpu)), model_profile(name)
        cap = float(cost.kv_capacity_tokens(m, tp))
        held, left, shape = _agent_queue()
        held, left = held * cap / 460_000.0, left * cap / 460_000.0
        first = fitting(held, left, cap, shape, 1.0, 40)
        got = trade_count(held, left, cap, shape, first, 256, lambda b, kv: cost.decode_steps_s(m, tp, b, kv),
                          cost.prefill_s(m, tp, 1.0))
        counts[gpu] = (first, got)
    assert counts["a100"][1] > counts["a100"][0]
    assert counts["h20"][1] == counts["h20"][0]


def test_the_policy_limits_a_replica_at_the_traded_count_with_the_switch_on():
    # a 7B replica on one H100 with a 250,000-token cache (its share of a co-located
    # device), 32 sequences deep into long contexts and a queue of fresh prompts; the
    # pipeline's finished trajectories spread as a long tail (a real LengthHistory)
    from jigsaw_plugin.predict.history import LengthHistory

    hist = LengthHistory(32_768)
    for i, x in enumerate(np.random.default_rng(1).lognormal(np.log(4_000.0), 1.0, 200)):
        hist.record_finished(0, i, 0, int(min(x, 32_000)))
    cap = 250_000.0
    rep = _replica(0, 32, 240, 1_500, 6_000, 5_000.0, cap)
    state = _state([rep], final_context=6_000.0, history=hist)
    held, left, running = rep.kv_columns()
    shape = spread_of(hist.recent_lengths())
    first = fitting(held, left, cap, shape, 1.0, running)
    traded = trade_count(held, left, cap, shape, first, min(256, len(held)),
                         lambda b, kv: COST.decode_steps_s(MODEL, 1, b, kv), COST.prefill_s(MODEL, 1, 1.0))
    assert traded > first
    on = _limits(get_policy("jigsaw", multiplex=False, admission=True).decide(state))
    off = _limits(get_policy("jigsaw", multiplex=False, admission=True, admission_trade=False).decide(state))
    assert on == {0: traded} and off == {0: first}


def test_the_memo_keeps_a_traded_count_while_the_fitting_count_and_the_engines_limit_are_the_same():
    from jigsaw_plugin.scheduler.admission import FittingMemo

    memo, calls = FittingMemo(), []

    def price(n):
        calls.append(n)
        return n

    # (first, top, priced again): the same pair is kept round to round; either changed, or a
    # round that did not ask in between, prices again
    for first, top, skip_round, priced in ((40, 256, False, True), (40, 256, False, False), (41, 256, False, True),
                                           (41, 200, False, True), (41, 200, False, False), (41, 200, True, True)):
        memo.round()
        if skip_round:
            memo.round()
        before = len(calls)
        assert memo.traded(3, first, top, lambda: price(first + top)) == first + top
        assert len(calls) == before + priced


def test_a_count_capped_at_most_is_the_count_or_most_and_sums_no_further():
    # ``most``: the caller's engine runs at most that many sequences at once, so any count
    # from there on means the same; below it the count is the uncapped one (the grid is
    # still the whole set's), and the sums stop at ``most`` rows (a 64 / 8 replica holding
    # 4,000 requests, 2,300 of which fit, at a batch of 1,024)
    from jigsaw_plugin.scheduler import admission

    rng = np.random.default_rng(12)
    for _ in range(200):
        held, left, shape = _random_queue(rng, int(rng.integers(2, 600)))
        n = len(held)
        cap = float(rng.uniform(1e4, 6e6))
        run = int(rng.integers(0, n + 1))
        most = int(rng.integers(1, n + 1))
        whole = admission.fitting(held, left, cap, shape, 1.0, run)
        assert admission.fitting(held, left, cap, shape, 1.0, run, most=most) == min(whole, most)
        memo = admission.FittingMemo()
        memo.round()
        assert memo.fitting(7, held, left, cap, shape, 1.0, run, most) == min(whole, most)
    rows = []
    real = admission._block

    def counted(held, *a):
        rows.append(len(held))
        return real(held, *a)

    admission._block = counted
    try:
        n = 4_000
        held, left = np.full(n, 100.0), np.full(n, 100.0)
        shape = np.linspace(0.5, 1.5, 50)
        assert admission.fitting(held, left, 1e12, shape, 1.0, 100, most=1_024) == 1_024
    finally:
        admission._block = real
    assert sum(rows) == 1_024
