"""The capped log-normal: truncated means and a censored fit, vectorised.

A response's length is modelled as ``L = min(L*, cap)`` with ``log L* ~ N(m, v)``: the
point mass at the cap is DAPO's truncation (a response that hits ``max_tokens`` stops
there). Two operations:

* ``expected_remaining``: ``E[min(L*, cap) | L* > g] - g`` for a request that has
  generated ``g`` tokens and is still running, formed from log tail probabilities
  (``normal.log_sf``) so it stays finite far into the tail;
* ``fit_censored``: the maximum-likelihood ``(m, v)`` of lengths of which some are capped
  (censored at ``log cap``), by EM on sufficient statistics, with a normal prior worth a
  pseudo-count, for several independent series (one per turn bin), each on its own.
"""

from __future__ import annotations

import math

import numpy as np

from jigsaw_plugin.predict.normal import inv_mills_float, log_sf

__all__ = ["expected_remaining", "fit_censored", "FUSE_MAX_ELEMENTS", "SIGMA_FLOOR"]

#: Largest array (elements) the vectorised paths stack several computations into.
FUSE_MAX_ELEMENTS = 4096
SIGMA_FLOOR = 0.05  # a degenerate history (every length equal) still gets a spread
_EM_ITERATIONS = 30


def expected_remaining(m: np.ndarray, v: np.ndarray, generated: np.ndarray, cap: np.ndarray,
                       condition: bool = True) -> np.ndarray:
    """``E[min(L*, cap) | L* > generated] - generated`` for ``log L* ~ N(m, v)``.

    ``condition=False`` drops the condition (the unconditioned marginal, an ablation).
    The result is not clipped; callers clip it to the request's budget.
    """
    s = np.sqrt(v)
    log_cap = np.log(cap)
    beta = (log_cap - m) / s
    # the four tail probabilities in one log_sf pass (one set of array operations, not four)
    if condition:
        alpha = (np.log(np.maximum(generated, 0.5)) - m) / s
        lq_alpha, lq_alpha_s, lq_beta, lq_beta_s = _log_sf_many(alpha, alpha - s, beta, beta - s)
    else:
        lq_alpha = 0.0
        lq_alpha_s = 0.0
        lq_beta, lq_beta_s = _log_sf_many(beta, beta - s)
    with np.errstate(over="ignore", invalid="ignore"):
        # E[L*; g < L* < cap] / Q(alpha) = e^{m + v/2} (Q(alpha - s) - Q(beta - s)) / Q(alpha)
        below_cap = np.exp(m + 0.5 * v + lq_alpha_s - lq_alpha) * -np.expm1(lq_beta_s - lq_alpha_s)
        at_cap = cap * np.exp(lq_beta - lq_alpha)  # cap * P(L* >= cap | L* > g)
    out = np.where(np.isfinite(below_cap), below_cap, 0.0) + np.where(np.isfinite(at_cap), at_cap, cap)
    return out - generated


def _log_sf_many(*xs: np.ndarray) -> list[np.ndarray]:
    """``log_sf`` of several arrays of one shape: as one array while it is small (one set of
    numpy calls instead of several: the per-call overhead dominates small batches), apart
    once the stacked temporaries would outgrow the CPU cache."""
    shape = np.shape(xs[0])
    if len(shape) != 1 or any(np.shape(x) != shape for x in xs):
        xs = np.broadcast_arrays(*xs)
    if xs[0].size * len(xs) > FUSE_MAX_ELEMENTS:
        return [log_sf(x) for x in xs]
    if xs[0].ndim != 1:
        return list(log_sf(np.stack(xs)))
    # rows of one length: ``np.stack``'s array (the same contiguous rows) without its wrappers
    return list(log_sf(np.concatenate(xs).reshape(len(xs), -1)))


def fit_censored(weight: np.ndarray, sum_log: np.ndarray, sumsq_log: np.ndarray, capped: np.ndarray,
                 log_cap: float, prior_mean: np.ndarray, prior_var: np.ndarray, prior_weight: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, standard deviation) of log length per series, from uncapped statistics
    (weight, sum, sum of squares), the weight of capped lengths (known only to exceed
    ``log_cap``) and a normal prior worth ``prior_weight`` observations.

    Each series is fitted on its own, in Python floats (``_fit_one``): the model's fits
    are of one series and of a few turn bins, where numpy's per-call cost was nearly all
    of a fit's 0.5-1 ms; its EM stops at its own fixed point, bit for bit, so the answer is
    that of the series' row of the arrays' EM run to the end (tested)."""
    rows = np.broadcast_arrays(*(np.asarray(a, float) for a in (weight, sum_log, sumsq_log, capped, prior_mean,
                                                                   prior_var)))
    fits = [_fit_one(*row, log_cap, prior_weight) for row in zip(*(a.ravel().tolist() for a in rows))]
    shape = rows[0].shape
    return (np.array([m for m, _ in fits], float).reshape(shape),
            np.array([sd for _, sd in fits], float).reshape(shape))


def _fit_one(weight: float, sum_log: float, sumsq_log: float, capped: float, prior_mean: float, prior_var: float,
             log_cap: float, prior_weight: float) -> tuple[float, float]:
    """``fit_censored`` of one series in Python floats. Its EM stops when an iteration
    returns its input bit for bit (every later one would return it again); a series with
    nothing capped is at that point from the start."""
    floor = SIGMA_FLOOR**2
    n = weight + capped + prior_weight
    base_sum = sum_log + prior_weight * prior_mean
    base_sq = sumsq_log + prior_weight * (prior_var + prior_mean * prior_mean)
    mu = (base_sum + capped * log_cap) / n
    var = base_sq / n - mu * mu
    var = floor if var < floor else var  # np.maximum: a NaN stays NaN
    if not capped > 0:
        return mu, math.sqrt(var)
    for _ in range(_EM_ITERATIONS):
        sd = math.sqrt(var)
        a = (log_cap - mu) / sd
        lam = inv_mills_float(a)
        e_y = mu + sd * lam
        e_yy = var * (1.0 + a * lam - lam * lam) + e_y * e_y
        mu_next = (base_sum + capped * e_y) / n
        var_next = (base_sq + capped * e_yy) / n - mu_next * mu_next
        var_next = floor if var_next < floor else var_next
        if mu_next == mu and var_next == var:
            break
        mu, var = mu_next, var_next
    return mu, math.sqrt(var)
