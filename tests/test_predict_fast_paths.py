"""The predictor's per-call fast paths give what the plainer code gave, bit for bit.

* ``EmpiricalTable``: every turn bin's empirical lengths as one table, worked on at once
  for a batch that spans several bins, against each bin's own ``Empirical.remaining`` and
  the bin-by-bin loop the predictor ran before (bins without lengths keep the log-normal's);
* ``LengthHistory.group_stats``: the same numbers as ``group_table``'s columns;
* ``_log_sf_many``: rows joined without ``np.stack`` equal ``log_sf`` of each row;
* ``fit_censored`` stops its EM at a fixed point with the answer of all its iterations;
* the series are fitted in Python floats (``_fit_one``, ``inv_mills_float``) with the
  arrays' answer: bit for bit where numpy's float64 ``exp`` is the C library's (this
  machine's x86-64 without AVX-512; checked on a sample first), else within 1e-12.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jigsaw_plugin.predict import HistoryPredictor, LengthHistory, RequestBatch
from jigsaw_plugin.predict.history_predictor import _TAIL_SHRINK
from jigsaw_plugin.predict.lognormal import _log_sf_many
from jigsaw_plugin.predict.model import EmpiricalTable, fit_model
from jigsaw_plugin.predict.normal import log_sf

CAP = 4096


def _history(seed: int = 0) -> LengthHistory:
    """Turns 0-3 finished (bins 4-7 hold nothing), a few at the cap."""
    rng = np.random.default_rng(seed)
    h = LengthHistory(CAP)
    for step in range(3):
        for group in range(40):
            for sample in range(8):
                for turn in range(int(rng.integers(1, 5))):
                    h.record_finished(step, group, turn, int(min(CAP, rng.lognormal(6.0, 1.0))))
    return h


def _bin_by_bin(model, tb, g, cap, marginal):
    """The predictor's empirical step as it was: one bin at a time."""
    out = marginal.copy()
    bins = np.flatnonzero(np.bincount(tb)).tolist() if tb.max() > 0 else (0,)
    for b in bins:
        emp = model.empirical[b]
        if emp is None:
            continue
        sel = slice(None) if len(bins) == 1 else tb == b
        mean, k = emp.remaining(g[sel], cap[sel])
        w = k / (k + _TAIL_SHRINK)
        out[sel] = w * mean + (1.0 - w) * marginal[sel]
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_table_is_the_bins():
    model = fit_model(_history(), HistoryPredictor().prior)
    table = model.table
    assert table is not None and table.has.tolist()[:4] == [True] * 4 and not table.has[4:].any()
    assert all(a is b for a, b in zip(table.empirical, model.empirical))
    for b, emp in enumerate(model.empirical[:4]):
        assert table.n[b] == len(emp.lengths)
        assert _same(table.suffix[table.offset[b]:table.offset[b] + len(emp.suffix)], emp.suffix)
    # the same table from the bins (a model built without one)
    rebuilt = EmpiricalTable.of(model.empirical)
    for name in ("has", "n", "offset", "suffix"):
        assert _same(getattr(rebuilt, name), getattr(table, name)), name


def test_table_lookups_equal_each_bins_own_bit_for_bit():
    model = fit_model(_history(1), HistoryPredictor().prior)
    rng = np.random.default_rng(2)
    n = 500
    tb = rng.integers(0, 4, n)
    g = np.floor(rng.uniform(-3, CAP + 50, n))  # past both ends of the lookups too
    cap = np.maximum(np.floor(rng.uniform(0, CAP + 50, n)), 1.0)
    mean, k = model.table.remaining(tb, g, cap)
    for b in range(4):
        sel = tb == b
        m_b, k_b = model.empirical[b].remaining(g[sel], cap[sel])
        assert _same(mean[sel], m_b) and _same(k[sel], k_b)


def test_empirical_step_equals_the_bin_by_bin_loop():
    h = _history(3)
    p = HistoryPredictor()
    model = p.model(h)
    no_table = dataclasses.replace(model, table=None)  # stacked when read
    rng = np.random.default_rng(4)
    for n in (1, 3, 17, 400):
        for high in (1, 4, 8):  # one bin; bins with lengths; some without (4-7)
            tb = rng.integers(0, high, n)
            g = np.floor(rng.uniform(0, 3000, n))
            cap = np.full(n, float(CAP))
            marginal = rng.uniform(1, 2000, n)
            want = _bin_by_bin(model, tb, g, cap, marginal)
            assert _same(p._empirical(model, tb, g, cap, marginal), want)
            assert _same(p._empirical(no_table, tb, g, cap, marginal), want)


def test_predictions_unchanged_by_a_model_without_its_table():
    h = _history(5)
    p = HistoryPredictor()
    rng = np.random.default_rng(6)
    n = 60
    batch = RequestBatch(np.full(n, 2), rng.integers(0, 40, n), rng.integers(0, 6, n),
                         np.floor(rng.uniform(0, 3000, n)), np.full(n, float(CAP)))
    with_table = p.predict(batch, h)
    p._models[h] = dataclasses.replace(p.model(h), table=None)
    assert _same(p.predict(batch, h), with_table)


def test_group_stats_are_group_tables_columns():
    h = _history(7)
    assert h.group_stats(99) is None and h.group_table(99) is None
    stats, tab = h.group_stats(2), h.group_table(2)
    assert not stats.flags.writeable
    for col, name in enumerate(("count", "sum_log", "sumsq_log", "capped")):
        assert np.array_equal(stats[:, :, col], getattr(tab, name))


def test_log_sf_of_joined_rows_equals_each_rows():
    rng = np.random.default_rng(8)
    xs = [rng.normal(0, 4, 33) for _ in range(4)]
    xs[1][3] = np.inf
    got = _log_sf_many(*xs)
    assert all(_same(a, log_sf(x)) for a, x in zip(got, xs))
    scalar_rows = _log_sf_many(np.float64(0.5), np.float64(-2.0))  # 0-d: stacked as before
    assert [float(x) for x in scalar_rows] == log_sf(np.array([0.5, -2.0])).tolist()


def _fit_censored_every_iteration(weight, sum_log, sumsq_log, capped, log_cap, prior_mean, prior_var, prior_weight):
    """``fit_censored`` with all its EM iterations run (no stop at a fixed point)."""
    from jigsaw_plugin.predict.lognormal import _EM_ITERATIONS, SIGMA_FLOOR
    from jigsaw_plugin.predict.normal import inv_mills

    n = weight + capped + prior_weight
    base_sum = sum_log + prior_weight * prior_mean
    base_sq = sumsq_log + prior_weight * (prior_var + prior_mean**2)
    mu = (base_sum + capped * log_cap) / n
    var = np.maximum(base_sq / n - mu**2, SIGMA_FLOOR**2)
    for _ in range(_EM_ITERATIONS):
        sd = np.sqrt(var)
        a = (log_cap - mu) / sd
        lam = inv_mills(a)
        e_y = mu + sd * lam
        e_yy = var * (1.0 + a * lam - lam**2) + e_y**2
        mu = (base_sum + capped * e_y) / n
        var = np.maximum((base_sq + capped * e_yy) / n - mu**2, SIGMA_FLOOR**2)
    return mu, np.sqrt(var)


def test_the_censored_fit_stops_at_a_fixed_point_with_the_same_answer():
    # the EM stops once an iteration returns its input bit for bit; running on gives it again
    # (bit for bit where numpy's exp is the C library's; with AVX-512 kernels, whose last bit
    # may differ from the float path's, to rounding)
    from jigsaw_plugin.predict.lognormal import fit_censored

    exact = _exp_is_libm()
    rng = np.random.default_rng(5)
    for _ in range(300):
        k = int(rng.choice([1, 3, 8]))
        w = rng.integers(0, 400, k).astype(float)
        mu_true, sd_true = rng.uniform(4, 9, k), rng.uniform(0.3, 1.5, k)
        s = w * mu_true
        ss = w * (sd_true**2 + mu_true**2)
        capped = rng.integers(0, 60, k).astype(float) * rng.integers(0, 2, k)
        args = (w, s, ss, capped, float(rng.uniform(6, 10.5)), rng.uniform(4, 9, k), rng.uniform(0.1, 2, k), 4.0)
        got, want = fit_censored(*args), _fit_censored_every_iteration(*args)
        assert _close(got[0], want[0], exact) and _close(got[1], want[1], exact)


def _exp_is_libm() -> bool:
    """numpy's float64 ``exp`` and ``math.exp`` agree on a sample (numpy's AVX-512 kernels
    may differ in the last bit; then the float paths match the arrays to rounding only)."""
    import math

    x = np.random.default_rng(0).normal(0, 20, 20_000)
    return np.exp(x).tolist() == [math.exp(v) for v in x.tolist()]


def _close(a, b, exact: bool) -> bool:
    a, b = np.asarray(a, float), np.asarray(b, float)
    if exact:
        return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))
    return bool(np.allclose(a, b, rtol=1e-12, atol=0.0, equal_nan=True))


def test_inv_mills_of_one_float_is_the_arrays():
    from jigsaw_plugin.predict.normal import inv_mills, inv_mills_float

    rng = np.random.default_rng(2)
    x = np.concatenate((rng.normal(0, 6, 5_000), rng.uniform(-45, 45, 2_000),
                        [0.0, -0.0, 30.0, np.nextafter(30.0, 31.0), -38.7, 38.7, 1e300, -1e300,
                         np.inf, -np.inf, np.nan]))
    got = [inv_mills_float(v) for v in x.tolist()]
    with np.errstate(over="ignore"):  # 1e300 squared
        want = inv_mills(x)
    assert _close(got, want, _exp_is_libm())


def test_series_fitted_in_floats_give_the_arrays_answer():
    import jigsaw_plugin.predict.lognormal as ln

    exact = _exp_is_libm()
    rng = np.random.default_rng(9)
    for _ in range(400):
        k = int(rng.choice([1, 2, 5, 8, 12]))
        w = rng.integers(0, 3000, k).astype(float)
        mu_true, sd_true = rng.uniform(2, 10, k), rng.uniform(0.05, 2.5, k)
        capped = rng.integers(0, 500, k).astype(float) * rng.integers(0, 2, k)
        args = (w, w * mu_true, w * (sd_true**2 + mu_true**2), capped, float(rng.uniform(4, 11)),
                rng.uniform(3, 9, k), rng.uniform(0.1, 2, k), float(rng.uniform(0.5, 16)))
        got = ln.fit_censored(*args)
        want = _fit_censored_every_iteration(*args)  # every series through the arrays, all 30 iterations
        assert got[0].dtype == np.float64 and got[0].shape == (k,)
        assert _close(got[0], want[0], exact) and _close(got[1], want[1], exact)
