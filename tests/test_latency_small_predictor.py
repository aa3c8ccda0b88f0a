"""The predictor's latency fast paths give the vectorised code's answers, bit for bit.

* ``predict.small``: a batch of a few requests predicted in Python floats (numpy only for
  exp / log / expm1 / log1p) against the vectorised path, over random histories and
  batches with the edge cases a rollout tail holds (nothing generated yet, at or past the
  budget, turns past the last bin, groups and steps the history has not seen, capped
  siblings, bins without recent lengths);
* its pieces: ``_reduce_sum`` against ``np.add.reduce``, ``inv_mills`` / ``log_sf``
  against ``normal``'s, including infinities and NaN;
* ``Empirical.of``'s counts from a histogram against the binary searches it replaced.

The decisions themselves are checked by hashing every decide round's decisions over the
decision-latency benchmark's 64 / 8 run and workload (a) (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from jigsaw_plugin.predict import HistoryPredictor, LengthHistory, PredictorFeatures, RequestBatch, small
from jigsaw_plugin.predict.model import Empirical
from jigsaw_plugin.predict.normal import inv_mills, log_sf

CAP = 4096


def _history(seed: int, steps: int = 3, groups: int = 40, turns: int = 5, long_tail: bool = False) -> LengthHistory:
    rng = np.random.default_rng(seed)
    h = LengthHistory(CAP)
    for step in range(steps):
        for group in range(groups):
            for _ in range(8):
                for turn in range(int(rng.integers(1, turns))):
                    mean = 7.5 if long_tail else 6.0  # long_tail: many at the cap
                    h.record_finished(step, group, turn, int(min(CAP, rng.lognormal(mean, 1.0))))
    return h


def _batch(rng, n: int, steps: int, groups: int) -> RequestBatch:
    step = rng.integers(max(0, steps - 2), steps + 1, n)  # the newest steps and one not seen yet
    group = rng.integers(0, groups + 70, n)  # past the table's rows too
    turn = rng.integers(0, 11, n)  # past the last turn bin too
    generated = np.floor(rng.choice([0.0, 1.0, 37.0, 900.0, 4095.0, 4096.0, 5000.0], n)
                         * rng.choice([1.0, rng.uniform(0.3, 1.0)], n))
    max_tokens = rng.choice([0.0, 1.0, 512.0, float(CAP), 8192.0], n)
    return RequestBatch(step, group, turn, generated, max_tokens)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _vectorised(p: HistoryPredictor, batch, h: LengthHistory, monkeypatch) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(small, "SMALL_BATCH", 0)
        return p.predict(batch, h)


@pytest.mark.parametrize("seed", range(6))
def test_small_batches_equal_the_vectorised_path(seed, monkeypatch):
    h = _history(seed, long_tail=seed % 2 == 1)
    rng = np.random.default_rng(100 + seed)
    for features in (PredictorFeatures(), PredictorFeatures(em_iterations=1), PredictorFeatures(em_iterations=5)):
        p = HistoryPredictor(features=features)
        for n in list(range(1, small.SMALL_BATCH + 1)) * 4:
            batch = _batch(rng, n, 3, 40)
            assert small.small_path_applies(n, h.turn_bins, True, True, False, True)
            want = _vectorised(p, batch, h, monkeypatch)
            assert _same(p.predict(batch, h), want), (n, batch)


def test_siblings_in_one_group_and_a_history_without_groups(monkeypatch):
    p = HistoryPredictor()
    rng = np.random.default_rng(7)
    for h in (_history(8), LengthHistory(CAP)):  # a history with nothing finished too
        for n in (1, 2, 8, small.SMALL_BATCH):
            batch = RequestBatch(np.full(n, 2), np.full(n, 5), rng.integers(0, 3, n),
                                 np.floor(rng.uniform(0, 3000, n)), np.full(n, float(CAP)))
            assert _same(p.predict(batch, h), _vectorised(p, batch, h, monkeypatch))


def test_shared_constants_agree():
    from jigsaw_plugin.predict import history_predictor

    assert small._TAIL_SHRINK == history_predictor._TAIL_SHRINK


def test_what_the_small_path_leaves_to_the_vectorised_one():
    assert not small.small_path_applies(small.SMALL_BATCH + 1, 8, True, True, False, True)
    assert not small.small_path_applies(0, 8, True, True, False, True)
    assert not small.small_path_applies(3, 8, False, True, False, True)  # unconditioned (ablation)
    assert not small.small_path_applies(3, 8, True, False, False, True)  # no siblings (ablation)
    assert not small.small_path_applies(3, 8, True, True, True, True)  # prompt keys: earlier epochs
    assert small.small_path_applies(3, 8, True, True, True, False)  # ... unless not used
    assert not small.small_path_applies(3, 200, True, True, False, True)  # rows past one pairwise block


def test_prompt_keys_and_ablations_still_answered(monkeypatch):
    h = _history(9)
    rng = np.random.default_rng(10)
    batch = _batch(rng, 4, 3, 40)
    keyed = RequestBatch(batch.step, batch.group, batch.turn, batch.generated, batch.max_tokens,
                         ("a", None, "b", "a"))
    for features in (PredictorFeatures(), PredictorFeatures(earlier_epochs=False), PredictorFeatures(siblings=False),
                     PredictorFeatures(condition_on_generated=False)):
        p = HistoryPredictor(features=features)
        assert _same(p.predict(keyed, h), _vectorised(p, keyed, h, monkeypatch))
        assert _same(p.predict(batch, h), _vectorised(p, batch, h, monkeypatch))


@pytest.mark.parametrize("width", [1, 2, 3, 7, 8, 9, 15, 16, 17, 64, 128])
def test_reduce_sum_is_numpys(width):
    rng = np.random.default_rng(width)
    x = rng.normal(0, 1, (300, width)) * 10.0 ** rng.integers(-6, 6, (300, width))
    x[0] = -0.0  # an all negative-zero row sums to +0.0
    want = np.add.reduce(x, axis=1)
    got = np.array([small._reduce_sum(row) for row in x.tolist()])
    assert _same(got, want)


def test_scalar_normal_functions_are_numpys():
    rng = np.random.default_rng(11)
    xs = np.concatenate([rng.normal(0, 6, 4000), [0.0, -0.0, 29.9, 30.0, 30.1, 45.0, -45.0, np.inf, -np.inf, np.nan]])
    assert _same(np.array(small.inv_mills(xs.tolist())), inv_mills(xs))
    assert _same(np.array(small.log_sf(xs.tolist())), log_sf(xs))


def test_empirical_counts_equal_the_binary_searches():
    rng = np.random.default_rng(12)
    for trial in range(400):
        top = int(rng.integers(1, 3000))
        n = int(rng.integers(1, 500))
        lengths = [rng.integers(0, top + 1, n),  # whole tokens within the budget
                   rng.integers(0, 2 * top + 5, n),  # past it too
                   rng.uniform(0, 1.2 * top, n),  # fractional: the searches themselves
                   np.concatenate([rng.integers(0, top + 1, n).astype(float), [np.inf, top, 0.0]])][trial % 4]
        e = Empirical.of(lengths, top)
        x = np.sort(np.asarray(lengths, dtype=np.float64))
        grid = np.arange(top + 1, dtype=np.float64)
        assert _same(e.count_le, np.searchsorted(x, grid, side="right").astype(np.int32))
        assert _same(e.count_lt, np.searchsorted(x, grid, side="left").astype(np.int32))
