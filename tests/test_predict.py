"""predict/: the length history, the history predictor, the oracle ablation, the accuracy log."""

from __future__ import annotations

import math

import numpy as np
import pluggy
import pytest

from jigsaw_plugin import hookspecs
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.ids import RequestId
from jigsaw_plugin.predict import (
    HistoryPredictor,
    LengthHistory,
    OraclePredictor,
    PredictionLog,
    PredictorFeatures,
    PriorConfig,
    RequestBatch,
    spearman,
)
from jigsaw_plugin.predict.lognormal import expected_remaining
from jigsaw_plugin.predict.normal import inv_mills, log_sf, ppf
from jigsaw_plugin.scheduler.state import RequestView

CAP = 20480


def req(step=9, group=0, sample=0, generated=0, turn=0, max_tokens=CAP, key=None):
    return RequestView(RequestId("p", step, sample, turn), group, key, 100, generated, max_tokens, 1.0, 0, False,
                       0.0)


def trained(mu=6.0, sigma=0.9, rho=0.3, steps=4, groups=128, spp=8, cap=CAP, seed=0):
    """A history of `steps` finished steps of log-normal lengths with a GRPO group effect."""
    rng = np.random.default_rng(seed)
    h = LengthHistory(cap)
    for step in range(steps):
        b = rng.normal(0.0, math.sqrt(rho) * sigma, groups)
        e = rng.normal(0.0, math.sqrt(1 - rho) * sigma, (groups, spp))
        lengths = np.clip(np.rint(np.exp(mu + b[:, None] + e)), 1, cap).astype(int)
        for g in range(groups):
            for k in range(spp):
                h.record_finished(step, g, 0, int(lengths[g, k]))
    return h


# --------------------------------------------------------------------------- normal functions


def test_normal_functions_match_math_erfc():
    x = np.linspace(-8, 25, 200)
    ref = np.array([math.log(0.5 * math.erfc(v / math.sqrt(2))) for v in x])
    assert np.allclose(log_sf(x), ref, atol=1e-6, rtol=1e-6)
    y = np.linspace(-8, 8, 100)
    mills = np.array([math.exp(-v * v / 2) / math.sqrt(2 * math.pi) / (0.5 * math.erfc(v / math.sqrt(2))) for v in y])
    assert np.allclose(inv_mills(y), mills, rtol=1e-6)
    assert log_sf(np.array([np.inf]))[0] == -np.inf and log_sf(np.array([-np.inf]))[0] == 0.0
    assert np.allclose(ppf(np.array([0.025, 0.5, 0.975])), [-1.959964, 0.0, 1.959964], atol=1e-6)


def test_truncated_mean_matches_monte_carlo():
    rng = np.random.default_rng(1)
    draws = np.exp(rng.normal(6.0, 0.9, 1_000_000))
    capped = np.minimum(draws, 2000.0)
    for g in (0.0, 300.0, 1500.0):
        mc = (capped[draws > g] - g).mean()
        got = expected_remaining(np.array([6.0]), np.array([0.81]), np.array([g]), np.array([2000.0]))[0]
        assert abs(got - mc) / mc < 0.01, (g, got, mc)


# --------------------------------------------------------------------------- history


def test_history_records_and_bounds():
    h = LengthHistory(1000, window_steps=2, max_prompt_keys=2, recent_max=3)
    for step in range(5):
        h.record_finished(step, 1, 0, 100 + step, prompt_key=f"k{step}")
    h.record_finished(4, 1, 1, 1000)  # capped
    assert h.count == 6 and h.newest_step == 4
    assert h.window() == (3, 4)  # older group tables dropped
    assert h.group_table(0) is None
    tab = h.group_table(4)
    assert tab.count[1, 0] == 1 and tab.capped[1, 1] == 1 and tab.sum_log[1, 0] == pytest.approx(math.log(104))
    with pytest.raises(ValueError):
        tab.count[0, 0] = 5  # read-only
    assert h.siblings(4, 1) == ((0, 104), (1, 1000))
    assert h.recent_lengths().tolist() == [103, 104, 1000]
    assert h.prompt_lengths_before("k0", 9) is None  # evicted (at most 2 keys)
    m = h.marginal()
    assert m.weight[0] > 0 and m.capped[1] == 1
    # older steps are decayed (half-life 4 steps), the newest counts fully
    assert m.weight[0] < 5


def test_the_recent_lengths_are_whole_steps_not_the_last_turns_to_finish():
    # a step's turns finish short first; the ring takes a step's turns when its
    # generation ends, in an order drawn at random: a uniform sample of the step where
    # it holds fewer than the step has, not the step's longest (the last to finish)
    rng = np.random.default_rng(0)
    h = LengthHistory(100_000, recent_max=500)
    step0 = np.sort(rng.lognormal(5.0, 1.0, 2_000).astype(int) + 1)
    for i, n in enumerate(step0):
        h.record_finished(0, i // 8, 0, int(n))
    # before any step closed: the turns finished so far
    assert h.recent_lengths().tolist() == step0[-500:].tolist()
    h.close_step(0)
    ring = h.recent_lengths()
    assert len(ring) == 500 and set(ring.tolist()) <= set(step0.tolist())
    assert abs(np.median(ring) / np.median(step0) - 1.0) < 0.15  # the last 500 to finish: 3x the median
    # the next step's first (short) turns do not enter until it closes
    step1 = np.sort(rng.lognormal(5.0, 1.0, 300).astype(int) + 1)
    for n in step1[:200]:
        h.record_finished(1, 0, 0, int(n))
    assert h.recent_lengths().tolist() == ring.tolist()
    for n in step1[200:]:
        h.record_finished(1, 0, 0, int(n))
    h.close_step(1)
    h.close_step(1)  # once only
    both = h.recent_lengths()
    assert sorted(both[-300:].tolist()) == step1.tolist()  # the whole step, newest last
    assert both[:200].tolist() == ring[300:].tolist()  # step 0's older part gone: still a uniform sample of it
    h.record_finished(1, 0, 0, 7)  # a late turn of a closed step
    assert h.recent_lengths()[-1] == 7
    with pytest.raises(SpecError, match="LengthHistory.close_step.step"):
        h.close_step(-1)


def test_an_executor_closes_each_step_when_its_generation_ends():
    # a simulated run: while step 1 generates, the recent lengths are step 0's turns, all
    # of them, not step 1's first finishers
    from jigsaw_plugin.scheduler import get_policy
    from jigsaw_plugin.sim import Simulation
    from sim_helpers import small_workload

    wl = small_workload(gpus=4, pipelines=1, prompts=16, samples=4, steps=2)
    pol = get_policy("jigsaw")
    seen = []
    real = pol.decide

    def decide(state):
        p = state.order[0]
        s1 = p.steps.get(1)
        if s1 is not None and 0 < s1.gen_done < s1.samples:
            seen.append(p.history.recent_lengths().tolist())
        return real(state)

    pol.decide = decide
    sim = Simulation(wl, pol, seed=0)
    sim.run()
    smp = sim.world.pipelines["p0"].steps[0].samples
    step0 = sorted(min(int(n), wl.pipelines[0].max_response_len) for n in smp.gen_tokens[:int(smp.turns.sum())])
    assert seen and all(sorted(r) == step0 for r in seen)


def test_history_prompt_evidence_reads_earlier_steps_only():
    h = LengthHistory(CAP)
    h.record_finished(0, 3, 0, 100, prompt_key="q")
    h.record_finished(1, 5, 0, 400, prompt_key="q")
    ev = h.prompt_evidence(["q", "q", None], np.array([1, 2, 2]))
    assert ev.count[0].sum() == 1 and ev.sum_log[0, 0] == pytest.approx(math.log(100))  # step 1 sees step 0
    assert ev.count[1].sum() == 2  # step 2 sees steps 0 and 1
    assert ev.count[2].sum() == 0


@pytest.mark.parametrize("field,args", [
    ("length", (0, 0, 0, -1)), ("step", (-1, 0, 0, 5)), ("turn", (0, 0, 1.5, 5)), ("group", (0, True, 0, 5)),
])
def test_history_rejects_bad_records(field, args):
    with pytest.raises(SpecError) as e:
        LengthHistory(100).record_finished(*args)
    assert e.value.field == f"LengthHistory.record_finished.{field}"


def test_bad_configs_are_spec_errors():
    with pytest.raises(SpecError) as e:
        LengthHistory(0)
    assert e.value.field == "LengthHistory.max_tokens"
    with pytest.raises(SpecError) as e:
        PriorConfig(group_icc=1.0)
    assert e.value.field == "PriorConfig.group_icc"
    with pytest.raises(SpecError) as e:
        PriorConfig(sigma="wide")
    assert e.value.field == "PriorConfig.sigma"
    with pytest.raises(SpecError):
        PredictorFeatures(em_iterations=0)


# --------------------------------------------------------------------------- the predictor


def test_prior_before_anything_finished():
    p = HistoryPredictor(PriorConfig(median_fraction=0.05, sigma=1.0))
    got = p.predict([req(generated=0)], LengthHistory(CAP))[0]
    mean = math.exp(math.log(0.05 * CAP) + 0.5)  # the prior log-normal's mean (the cap hardly bites)
    assert abs(got - mean) / mean < 0.05


def test_learns_the_mean():
    mu, sigma = 6.0, 0.9
    h = trained(mu, sigma)
    got = HistoryPredictor().predict([req(step=9, generated=0)], h)[0]  # a step with no siblings yet
    true_mean = math.exp(mu + sigma**2 / 2)
    assert abs(got - true_mean) / true_mean < 0.05, (got, true_mean)
    model = HistoryPredictor().model(h)
    assert abs(model.mu[0] - mu) < 0.05 and abs(model.sigma[0] - sigma) < 0.05
    assert abs(model.rho - 0.3) < 0.08


def test_conditioning_on_generated_raises_and_respects_the_cap():
    h = trained()
    p = HistoryPredictor()
    gens = [0, 100, 400, 1000, 3000, 10000, CAP - 10, CAP - 1, CAP]
    rem = p.predict([req(step=9, group=i, generated=g) for i, g in enumerate(gens)], h)
    total = np.array(gens) + rem
    assert np.all(np.diff(total[:-1]) > 0)  # E[L | L > g] grows with g
    assert np.all(rem <= CAP - np.array(gens)) and np.all(total <= CAP)
    assert np.all(rem[:-1] >= 1) and rem[-1] == 0  # in flight: at least 1, nothing left at the cap
    # conditioning matters: the unconditioned marginal ignores what was generated
    flat = HistoryPredictor(features=PredictorFeatures(condition_on_generated=False))
    assert flat.predict([req(generated=3000)], h)[0] < rem[4]


def test_siblings_shift_the_prediction():
    h = trained(rho=0.3)
    p = HistoryPredictor()
    base = p.predict([req(step=4, group=0, sample=7)], h)[0]
    for length in (3000, 4000, 5000):
        h.record_finished(4, 0, 0, length)  # long siblings in group 0
    for length in (40, 50, 60):
        h.record_finished(4, 1, 0, length)  # short siblings in group 1
    long_group, short_group = p.predict([req(step=4, group=0, sample=7), req(step=4, group=1, sample=15)], h)
    assert long_group > 1.5 * base and short_group < 0.7 * base
    blind = HistoryPredictor(features=PredictorFeatures(siblings=False))
    assert blind.predict([req(step=4, group=0, sample=7)], h)[0] == pytest.approx(base, rel=0.05)


def test_running_siblings_counter_the_short_first_bias():
    h = trained(rho=0.3)
    for length in (80, 90):
        h.record_finished(4, 0, 0, length)  # the two that finished first were short ...
    p = HistoryPredictor()
    alone = p.predict([req(step=4, group=0, sample=0, generated=0)], h)[0]
    # ... but five siblings are still running after 2,500 tokens
    running = [req(step=4, group=0, sample=i, generated=2500) for i in range(1, 6)]
    with_running = p.predict([req(step=4, group=0, sample=0, generated=0)] + running, h)[0]
    assert with_running > 1.3 * alone


def test_earlier_epochs_of_the_prompt_count():
    h = trained(rho=0.3)
    for length in (4000, 5000, 6000, 4500):
        h.record_finished(2, 7, 0, length, prompt_key="hard")
    p = HistoryPredictor()
    fresh, repeat = p.predict([req(step=9, group=0, key="easy"), req(step=9, group=1, key="hard")], h)
    assert repeat > 1.3 * fresh


def test_turns_have_their_own_marginals():
    rng = np.random.default_rng(0)
    h = LengthHistory(4096)
    for step in range(3):
        for g in range(64):
            for k in range(4):
                h.record_finished(step, g, 0, int(np.exp(rng.normal(3.5, 0.3))))  # ~33 tokens
                h.record_finished(step, g, 1, int(np.exp(rng.normal(6.0, 0.3))))  # ~400 tokens
    t0, t1 = HistoryPredictor().predict([req(step=9, group=0, turn=0, max_tokens=4096),
                                         req(step=9, group=1, turn=1, max_tokens=4096)], h)
    assert 25 < t0 < 45 and 300 < t1 < 550


def test_dapo_point_mass_at_the_cap():
    cap = 2000
    h = trained(mu=7.0, sigma=0.8, rho=0.01, cap=cap)  # about a quarter of lengths hit the cap
    rng = np.random.default_rng(5)
    truth = np.minimum(np.exp(rng.normal(7.0, 0.8, 400_000)), cap).mean()
    model = HistoryPredictor().model(h)
    assert abs(model.mu[0] - 7.0) < 0.07  # the censored fit sees through the truncation
    got = HistoryPredictor().predict([req(step=9, generated=0, max_tokens=cap)], h)[0]
    assert abs(got - truth) / truth < 0.05


def test_batch_and_views_agree_and_empty():
    h = trained(steps=2)
    views = [req(step=2, group=g % 5, sample=g, generated=50 * g) for g in range(20)]
    p = HistoryPredictor()
    assert np.allclose(p.predict(views, h), p.predict(RequestBatch.of(views), h))
    assert p.predict([], h).shape == (0,)


# --------------------------------------------------------------------------- plugins


def _manager(*plugins):
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm


def test_oracle_answers_truth_minus_generated_and_goes_first():
    truth = {RequestId("p", 9, 0, 0): 700, RequestId("p", 9, 1, 0): 50}
    oracle = OraclePredictor(truth.__getitem__)
    views = [req(sample=0, generated=200), req(sample=1, generated=50)]
    assert oracle.predict(views).tolist() == [500.0, 0.0]
    pm = _manager(HistoryPredictor(), oracle)  # registered last, but tryfirst
    out = pm.hook.jigsaw_predict_remaining(pipeline="p", requests=tuple(views), history=trained(steps=1))
    assert list(out) == [500.0, 0.0]
    with pytest.raises(SpecError):
        OraclePredictor(42)


def test_default_plugin_module_answers_the_hook():
    from jigsaw_plugin.predict import DEFAULT_PLUGIN
    import importlib

    pm = _manager(importlib.import_module(DEFAULT_PLUGIN))
    h = trained(steps=2)
    out = pm.hook.jigsaw_predict_remaining(pipeline="p", requests=(req(step=2, generated=10),), history=h)
    assert len(out) == 1 and 1 <= out[0] <= CAP - 10
    assert pm.hook.jigsaw_predict_remaining(pipeline="p", requests=(req(),), history=None) is None


# --------------------------------------------------------------------------- accuracy log


def test_prediction_log_metrics_by_hand():
    log = PredictionLog()
    a, b, c = (RequestId("p", 0, i, 0) for i in range(3))
    log.note(a, 10, 100.0, 0.01, t=0.0)  # true remaining 70: error 30
    log.note(a, 15, 60.0, 0.01, t=1.0)  # generated did not double: not kept
    log.note(a, 40, 60.0, 0.02, t=2.0)  # true 40: error 20
    log.note(b, 10, 10.0, 0.01, t=0.0)  # true 190: error 180
    log.note(c, 0, 5.0, 0.01, t=0.0)  # never finishes: not scored
    log.finish(a, 80)
    log.finish(b, 200)
    s = log.summary("history")
    assert s["notes"] == 3 and s["name"] == "history"
    assert s["remaining_tokens_mae"] == pytest.approx((30 + 20 + 180) / 3)
    assert s["remaining_tokens_rel_error"] == pytest.approx(230 / (70 + 40 + 190))
    assert s["remaining_s_mae"] == pytest.approx((30 * 0.01 + 20 * 0.02 + 180 * 0.01) / 3)
    # predicted (100, 60, 10) vs true (70, 40, 190): ranks (3, 2, 1) vs (2, 1, 3)
    assert s["rank_corr"] == pytest.approx(-0.5)
    assert PredictionLog().summary("x")["remaining_tokens_mae"] is None


def test_prediction_log_is_bounded():
    log = PredictionLog(max_notes_per_request=3, max_pending=10, max_pairs=5)
    for i in range(50):
        rid = RequestId("p", 0, i, 0)
        for g in range(0, 1000, 7):
            log.note(rid, g, 1.0, 0.01, t=0.0)
    for i in range(50):
        log.finish(RequestId("p", 0, i, 0), 2000)
    assert log.notes == 10 * 3  # 10 pending requests kept, 3 notes each
    assert spearman(np.arange(5.0), np.arange(5.0) ** 2) == pytest.approx(1.0)
