"""``HistoryPredictor``'s answer for a few requests, one request at a time in Python floats.

A rollout tail asks the predictor about a handful of requests at a time, and the
vectorised path costs the same ~250 numpy calls whatever the batch (140-500 us a call at
2-8 requests, most of a slow decide round's predictor time, docs/benchmarks.md). Here
the same arithmetic runs on Python floats, and only the transcendental functions go to
numpy, a few calls a stage for every request at once.

Bit for bit the vectorised path's answer (tests/test_latency_small_predictor.py checks it
on captured and random batches), because:

* ``+ - * /`` and ``sqrt`` are IEEE-exact in both, and every expression below keeps the
  vectorised code's order of operations (``a - b + c`` is ``(a - b) + c`` in both);
* ``exp``, ``log``, ``expm1`` and ``log1p`` stay numpy's (its SIMD versions differ from
  ``math``'s in the last bit for a few percent of inputs), on arrays of the same values:
  numpy's element results do not depend on the array they sit in;
* sums over turn bins repeat ``np.add.reduce``'s order (``_reduce_sum``);
* ``np.maximum`` / ``np.minimum`` propagate NaN, ``max`` / ``min`` do not: ``_npmax``
  and ``_npmin`` are numpy's rule (NaN in, NaN out);
* division by zero, which numpy answers with inf or NaN and Python raises on, does not
  arise on these paths (each denominator is bounded away from zero; see the comments).

Only the default evidence is handled here (conditioned on tokens so far, siblings, no
prompt keys); ``small_path_applies`` says when, and the vectorised path answers the rest.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.predict.model import EmpiricalTable, LengthModel
from jigsaw_plugin.predict.normal import _ERFC_COEF, _LOG2, _SQRT2

__all__ = ["SMALL_BATCH", "predict_small", "small_path_applies"]

#: Largest batch answered here: on the 64 / 8 benchmark's captured batches (the vectorised
#: path and this one alternated in one process) this one costs about 60 us plus 12 us a
#: request, the vectorised one about 200 us whatever the size up to a few dozen: even at
#: 10-12 requests, and this path's advantage grows as the batch shrinks.
SMALL_BATCH = 12

_INV_SQRT2 = 1.0 / _SQRT2  # the constants exactly as normal.py computes them
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_INF = math.inf
_TAIL_SHRINK = 16.0  # history_predictor._TAIL_SHRINK (importing it would cycle; a test checks both)
_PW_BLOCK = 128  # numpy's pairwise-summation block; longer rows are not summed here

_exp, _log, _expm1, _log1p = np.exp, np.log, np.expm1, np.log1p
_array = np.array


def _np(fn, xs: list) -> list:
    """``fn`` (a numpy ufunc) of Python floats, as Python floats."""
    return fn(_array(xs, dtype=np.float64)).tolist() if xs else []


def _npmax(a: float, b: float) -> float:
    """``np.maximum`` of two floats: NaN if either is."""
    return a if a >= b or a != a else b


def _npmin(a: float, b: float) -> float:
    """``np.minimum`` of two floats: NaN if either is."""
    return a if a <= b or a != a else b


def _reduce_sum(row: list) -> float:
    """``np.add.reduce`` of a contiguous float64 row of at most ``_PW_BLOCK``: the identity
    plus numpy's pairwise sum (a plain loop under 8 elements, else 8 running sums combined
    pairwise, then the rest in order); the identity makes an all ``-0.0`` row ``+0.0``."""
    n = len(row)
    if n < 8:
        s = 0.0
        for v in row:
            s += v
        return 0.0 + s
    r0, r1, r2, r3, r4, r5, r6, r7 = row[:8]
    i = 8
    stop = n - n % 8
    while i < stop:
        r0 += row[i]
        r1 += row[i + 1]
        r2 += row[i + 2]
        r3 += row[i + 3]
        r4 += row[i + 4]
        r5 += row[i + 5]
        r6 += row[i + 6]
        r7 += row[i + 7]
        i += 8
    s = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for v in row[i:]:
        s += v
    return 0.0 + s


def _erfc_parts(xs: list) -> tuple[list, list, list]:
    """``normal._erfc_parts`` of finite floats: lists of t, P(t), z^2 (the polynomial
    unrolled, in the loop's order: ``p = t * c0``, then ``p = (p + c) * t`` per middle
    coefficient, then ``+ c_last``)."""
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = _ERFC_COEF
    r, ts, ps, zz = _INV_SQRT2, [], [], []
    for x in xs:
        z = abs(x) * r
        t = 1.0 / (0.5 * z + 1.0)  # np.reciprocal is 1.0 / t
        ts.append(t)
        ps.append(((((((((t * c0 + c1) * t + c2) * t + c3) * t + c4) * t + c5) * t + c6) * t + c7) * t + c8) * t
                  + c9)
        zz.append(z * z)
    return ts, ps, zz


def _finite(xs: list) -> tuple[list, bool]:
    """(``xs`` with inf and NaN as 0.0, whether any was), as ``normal``'s ``xf``."""
    if all(-_INF < x < _INF for x in xs):
        return xs, False
    return [x if -_INF < x < _INF else 0.0 for x in xs], True


def inv_mills(xs: list) -> list:
    """``normal.inv_mills`` of each of ``xs`` (its two numpy ``exp`` calls as one)."""
    n = len(xs)
    xf, odd = _finite(xs)
    ts, ps, zz = _erfc_parts(xf)
    zz = [-z for z in zz]
    zz += ps
    e = _np(_exp, zz)
    out = []
    c = _INV_SQRT_2PI
    for x, t, ez2, ep in zip(xf, ts, e, e[n:]):
        if x > 30.0:  # numpy's answer is overwritten by the asymptote there
            out.append(x + 1.0 / x)
            continue
        q = ep * t * ez2 * 0.5
        if x < 0:
            q = 1.0 - q
        # q > 0 here: exp(-z^2) >= exp(-450) for |x| <= 30, and 1 - Q(|x|) >= 1/2
        out.append(ez2 / q * c)
    if odd:
        for i, x in enumerate(xs):
            if x == -_INF:
                out[i] = 0.0
            elif x == _INF:
                out[i] = _INF
    return out


def log_sf(xs: list) -> list:
    """``normal.log_sf`` of each of ``xs`` (a numpy ``log``, and ``exp`` and ``log1p``
    for the negative ones)."""
    xf, odd = _finite(xs)
    ts, ps, zz = _erfc_parts(xf)
    log2 = _LOG2
    out = [p - z2 + lt - log2 for p, z2, lt in zip(ps, zz, _np(_log, ts))]
    neg = [i for i, x in enumerate(xf) if x < 0]
    if neg:
        q = _np(_exp, [out[i] for i in neg])
        for i, v in zip(neg, _np(_log1p, [-v for v in q])):
            out[i] = v
    if odd:
        for i, x in enumerate(xs):
            if x == _INF:
                out[i] = -_INF
            elif x == -_INF:
                out[i] = 0.0
    return out


def expected_remaining(m: list, v: list, log_g: list, log_cap: list, g: list, cap: list) -> list:
    """``lognormal.expected_remaining(m, v, g, cap)`` (conditioned), with ``log_g`` =
    ``log(max(g, 0.5))`` and ``log_cap`` = ``log(cap)`` already taken."""
    n = len(m)
    # the four log_sf arguments, one list of 4N: alpha, alpha - s, beta, beta - s
    alpha, alpha_s, beta, beta_s = [], [], [], []
    sqrt = math.sqrt
    for lg, lc, a, x in zip(log_g, log_cap, m, v):
        s = sqrt(x)  # correctly rounded, as np.sqrt; > 0: x = sigma^2 * (a positive factor)
        y = (lg - a) / s
        alpha.append(y)
        alpha_s.append(y - s)
        y = (lc - a) / s
        beta.append(y)
        beta_s.append(y - s)
    alpha += alpha_s
    alpha += beta
    alpha += beta_s
    lq = log_sf(alpha)
    args, diff = [], []
    for a, x, la, las, lb, lbs in zip(m, v, lq, lq[n:], lq[2 * n:], lq[3 * n:]):
        args.append(a + 0.5 * x + las - la)
        diff.append(lbs - las)
    for la, lb in zip(lq, lq[2 * n:]):
        args.append(lb - la)
    e = _np(_exp, args)
    out = []
    for eb, em, ea, c, x in zip(e, _np(_expm1, diff), e[n:], cap, g):
        below = eb * -em
        at = c * ea
        out.append((below if -_INF < below < _INF else 0.0) + (at if -_INF < at < _INF else c) - x)
    return out


@dataclass(frozen=True, eq=False)
class _ModelScalars:
    """A fitted model's per-turn-bin figures as Python floats (made once per fit)."""

    mu: list
    sigma: list
    thr: list  # the standardised log budget per bin
    table: EmpiricalTable
    n: list  # the table's lengths per bin
    offset: list

    @classmethod
    def of(cls, model: LengthModel, log_max_tokens: float) -> "_ModelScalars":
        mu, sigma = model.mu.tolist(), model.sigma.tolist()
        table = model.table or EmpiricalTable.of(model.empirical)
        return cls(mu, sigma, [(log_max_tokens - a) / b for a, b in zip(mu, sigma)], table,
                   table.n.tolist(), table.offset.tolist())


_SCALARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LengthModel -> (log cap, _ModelScalars)


def _scalars(model: LengthModel, log_max_tokens: float) -> _ModelScalars:
    hit = _SCALARS.get(model)
    if hit is None or hit[0] != log_max_tokens:
        hit = _SCALARS[model] = (log_max_tokens, _ModelScalars.of(model, log_max_tokens))
    return hit[1]


def small_path_applies(n: int, turn_bins: int, condition: bool, siblings: bool, has_prompt_keys: bool,
                       earlier_epochs: bool) -> bool:
    """Whether ``predict_small`` answers a batch of ``n`` (else the vectorised path)."""
    return (0 < n <= SMALL_BATCH and condition and siblings and turn_bins <= _PW_BLOCK
            and not (earlier_epochs and has_prompt_keys))


def predict_small(step: list, group: list, turn: list, generated: list, max_tokens: list, history,
                  model: LengthModel, em_iterations: int) -> np.ndarray:
    """``HistoryPredictor.predict`` of one batch (its columns as Python lists) where
    ``small_path_applies``: the same float64 array, bit for bit."""
    sc = _scalars(model, history.log_max_tokens)
    last_bin = history.turn_bins - 1
    tb = [t if t < last_bin else last_bin for t in turn]
    mu = [sc.mu[b] for b in tb]
    sd = [sc.sigma[b] for b in tb]
    cap = [c if c >= 1.0 else 1.0 for c in max_tokens]  # np.maximum(max_tokens, 1.0), no NaN here
    logs = _np(_log, [x if x >= 0.5 else 0.5 for x in generated] + cap)
    log_g, log_cap = logs[:len(tb)], logs[len(tb):]

    # (b) the GRPO group effect: _group_effect, per (step, group) present
    keys = list(zip(step, group))
    index: dict = {}
    key = [index.setdefault(k, len(index)) for k in keys]
    nkeys = len(index)
    obs_n, obs_z, cap_n, cap_thr = [0.0] * nkeys, [0.0] * nkeys, [0.0] * nkeys, [0.0] * nkeys
    tables: dict = {}
    mu_t, sd_t, thr_t = sc.mu, sc.sigma, sc.thr
    for (s, gr), j in index.items():
        tab = tables[s] if s in tables else tables.setdefault(s, history.group_stats(s))
        if tab is None or gr >= tab.shape[0]:
            continue
        rows = tab[gr].tolist()  # per turn bin: count, sum of log, sum of squares, capped
        obs_n[j] = _reduce_sum([r[0] for r in rows])
        obs_z[j] = _reduce_sum([(r[1] - r[0] * a) / b for r, a, b in zip(rows, mu_t, sd_t)])
        cap_n[j] = _reduce_sum([r[3] for r in rows])
        cap_thr[j] = _reduce_sum([r[3] * x for r, x in zip(rows, thr_t)])
    cap_thr = [a / (b if b >= 1.0 else 1.0) for a, b in zip(cap_thr, cap_n)]
    rho = model.rho
    se = math.sqrt(1.0 - rho)  # > 0: rho <= model.RHO_RANGE[1] < 1, so no division by zero below
    shrink = (1.0 - rho) / rho
    c = [(lg - a) / b if x > 0 else -_INF for lg, a, b, x in zip(log_g, mu, sd, generated)]
    in_batch = [0] * nkeys
    for j in key:
        in_batch[j] += 1
    k = [a + b + m for a, b, m in zip(obs_n, cap_n, in_batch)]
    b = [z / (m + shrink) for z, m in zip(obs_z, obs_n)]
    n = len(key)
    for _ in range(em_iterations):
        bj = [b[j] for j in key]
        lam = inv_mills([(x - y) / se for x, y in zip(c, bj)] + [(x - y) / se for x, y in zip(cap_thr, b)])
        imputed = [y + se * la for y, la in zip(bj, lam)]
        acc = [0.0] * nkeys  # np.bincount(key, imputed): in request order, from 0.0
        for j, x in zip(key, imputed):
            acc[j] += x
        s_ = [z + m * (y + se * la) + a for z, m, y, la, a in zip(obs_z, cap_n, b, lam[n:], acc)]
        b = [x / (m + shrink) for x, m in zip(s_, k)]
    # k[j] >= 1 (the request itself), so each denominator is at least shrink > 0
    b_own = [(s_[j] - x) / (k[j] - 1.0 + shrink) for j, x in zip(key, imputed)]
    post_var = [1.0 / (1.0 / rho + obs_n[j] / (1.0 - rho)) for j in key]

    # the marginal and the grouped remaining, in one pass of 2N (as the vectorised path)
    v = [a * a for a in sd]
    both = expected_remaining(mu + [a + d * e for a, d, e in zip(mu, sd, b_own)],
                              v + [a * a * (pv + 1.0 - rho) for a, pv in zip(sd, post_var)],
                              log_g + log_g, log_cap + log_cap, generated + generated, cap + cap)
    marginal, grouped = both[:n], both[n:]

    base = _empirical(sc, tb, generated, cap, marginal)
    out = []
    for x, m, gm, g, mt in zip(base, marginal, grouped, generated, max_tokens):
        x = x * (gm / m if m > 0 else 1.0)
        budget = _npmax(mt - g, 0.0)  # clip_to_budget
        out.append(_npmin(_npmax(x, _npmin(1.0, budget)), budget))
    return _array(out, dtype=np.float64)


def _empirical(sc: _ModelScalars, tb: list, g: list, cap: list, marginal: list) -> list:
    """``HistoryPredictor._empirical`` (``EmpiricalTable.remaining`` row by row)."""
    table = sc.table
    has = table.has.tolist()
    rows = [i for i, b in enumerate(tb) if has[b]]
    out = list(marginal)
    if not rows:
        return out
    top = len(table.empirical[min(tb[i] for i in rows)].count_le) - 1
    suffix = table.suffix
    for i in rows:
        bin_ = tb[i]
        emp = table.empirical[bin_]
        gi, ci = g[i], cap[i]
        # np.minimum(np.maximum(x, 0), top).astype(np.intp): truncation toward zero
        above = int(emp.count_le[int(_npmin(_npmax(gi, 0.0), top))])
        at_cap = max(int(emp.count_lt[int(_npmin(_npmax(ci, 0.0), top))]), above)
        n, start = sc.n[bin_], sc.offset[bin_]
        k = float(n - above)
        total = float(suffix[start + above]) - float(suffix[start + at_cap]) + ci * (n - at_cap)
        mean = total / k - gi if k > 0 else 0.0
        w = k / (k + _TAIL_SHRINK)
        out[i] = w * mean + (1.0 - w) * marginal[i]
    return out
