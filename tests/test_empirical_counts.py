"""``Empirical.of`` counts whole-token lengths from a histogram and its running sum (a
model refit inside a decide round spent most of its time in two binary searches of
``max_tokens + 1`` points); the counts must be the integers the searches give, for
lengths within the budget, past it, fractional and infinite."""

from __future__ import annotations

import numpy as np

from jigsaw_plugin.predict.model import Empirical


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


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
