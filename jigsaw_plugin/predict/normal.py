"""Vectorised standard-normal functions (numpy only: scipy is not a dependency).

``log_sf`` is the workhorse: the log of the upper tail ``Q(x) = 1 - Phi(x)``, accurate far
into both tails, so ratios of tail probabilities (truncated means, inverse Mills ratios)
are formed as differences of logs and never divide two underflowed numbers.

The complementary error function is Numerical Recipes' ``erfcc`` (Chebyshev fit, fractional
error below 1.2e-7 everywhere), written as ``erfc(z) = t * exp(-z^2 + P(t))`` for ``z >= 0``
so that its log is ``log t - z^2 + P(t)`` without underflow. The inverse CDF is Acklam's
rational approximation (relative error below 1.2e-9), used to turn ranks into normal scores.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["log_sf", "sf", "cdf", "pdf", "inv_mills", "inv_mills_float", "ppf"]

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG2 = math.log(2.0)
_ALL, _ANY = np.logical_and.reduce, np.logical_or.reduce  # ndarray.all / any, unwrapped (a hot path)
_ERFC_COEF = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
              0.09678418, 0.37409196, 1.00002368, -1.26551223)


def _erfc_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For z = |x| / sqrt(2): (t, P(t), z^2) with erfc(z) = t * exp(-z^2 + P(t)).
    In-place arithmetic: this is the predictor's hot path."""
    z = np.abs(x)
    z *= 1.0 / _SQRT2
    t = 0.5 * z
    t += 1.0
    np.reciprocal(t, out=t)
    p = t * _ERFC_COEF[0]
    for c in _ERFC_COEF[1:-1]:
        p += c
        p *= t
    p += _ERFC_COEF[-1]
    z *= z
    return t, p, z


def log_sf(x: np.ndarray | float) -> np.ndarray:
    """log(1 - Phi(x)), elementwise; -inf at +inf, 0 at -inf."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    all_finite = _ALL(finite, axis=None)
    xf = x if all_finite else np.where(finite, x, 0.0)
    t, out, z2 = _erfc_parts(xf)
    out -= z2
    out += np.log(t)
    out -= _LOG2  # log Q(|x|) = log(erfc(|x| / sqrt 2) / 2)
    neg = xf < 0
    if _ANY(neg, axis=None):  # Q(x) = 1 - Q(|x|)
        q = np.exp(out)
        np.negative(q, out=q)
        np.log1p(q, out=out, where=neg)
    if not all_finite:
        out[x == np.inf] = -np.inf
        out[x == -np.inf] = 0.0
    return out


def sf(x: np.ndarray | float) -> np.ndarray:
    """1 - Phi(x)."""
    return np.exp(log_sf(x))


def cdf(x: np.ndarray | float) -> np.ndarray:
    """Phi(x)."""
    return np.exp(log_sf(-np.asarray(x, dtype=np.float64)))


def pdf(x: np.ndarray | float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-0.5 * x * x - _LOG_SQRT_2PI)


def inv_mills(x: np.ndarray | float) -> np.ndarray:
    """phi(x) / (1 - Phi(x)): E[Z | Z > x] for a standard normal Z (0 at -inf, ~x for large x)."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    all_finite = _ALL(finite, axis=None)
    xf = x if all_finite else np.where(finite, x, 0.0)
    t, p, z2 = _erfc_parts(xf)
    np.negative(z2, out=z2)
    np.exp(z2, out=z2)  # exp(-z^2) = sqrt(2 pi) phi(x)
    q = np.exp(p)
    q *= t
    q *= z2
    q *= 0.5  # Q(|x|)
    np.subtract(1.0, q, out=q, where=xf < 0)  # Q(x) for x < 0
    with np.errstate(invalid="ignore", divide="ignore"):
        out = z2 / q
    out *= 1.0 / math.sqrt(2.0 * math.pi)
    far = xf > 30.0  # both underflow past ~37 sigma; the asymptote is exact enough there
    if _ANY(far, axis=None):
        out[far] = xf[far] + 1.0 / xf[far]
    if not all_finite:
        out[x == -np.inf] = 0.0
        out[x == np.inf] = np.inf
    return out


_INV_SQRT2 = 1.0 / _SQRT2
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def inv_mills_float(x: float) -> float:
    """``inv_mills`` of one float, in Python floats: the same operations in the same order
    (IEEE arithmetic rounds each alike; ``math.exp`` is the C library's, which numpy's
    float64 ``exp`` is on this machine's x86-64 without AVX-512), for loops over a few
    values where numpy's per-call cost is the whole cost (the censored fit's EM)."""
    if x != x:
        x = 0.0  # as ``inv_mills``: a NaN is evaluated at 0
    elif x == math.inf:
        return math.inf
    elif x == -math.inf:
        return 0.0
    if x > 30.0:
        return x + 1.0 / x
    z = abs(x) * _INV_SQRT2
    t = 1.0 / (0.5 * z + 1.0)
    p = t * _ERFC_COEF[0]
    for c in _ERFC_COEF[1:-1]:
        p = (p + c) * t
    p += _ERFC_COEF[-1]
    e = math.exp(-(z * z))
    q = math.exp(p) * t * e * 0.5
    if x < 0:
        q = 1.0 - q
    return e / q * _INV_SQRT_2PI

# Acklam's inverse normal CDF
_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
      -3.066479806614716e01, 2.506628277459239e00)
_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
      -1.328068155288572e01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
      4.374664141464968e00, 2.938163982698783e00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
_P_LOW = 0.02425


def _poly(coef: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    out = np.full_like(x, coef[0])
    for c in coef[1:]:
        out = out * x + c
    return out


def ppf(p: np.ndarray | float) -> np.ndarray:
    """The inverse of Phi for p in (0, 1); -inf / +inf at 0 / 1, nan outside."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full_like(p, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = (p > 0) & (p < _P_LOW)
        hi = (p > 1 - _P_LOW) & (p < 1)
        mid = (p >= _P_LOW) & (p <= 1 - _P_LOW)
        q = np.sqrt(-2.0 * np.log(np.where(lo, p, 0.5)))
        out = np.where(lo, _poly(_C, q) / (_poly(_D, q) * q + 1.0), out)
        q = np.sqrt(-2.0 * np.log(np.where(hi, 1.0 - p, 0.5)))
        out = np.where(hi, -_poly(_C, q) / (_poly(_D, q) * q + 1.0), out)
        q = np.where(mid, p, 0.5) - 0.5
        r = q * q
        out = np.where(mid, _poly(_A, r) * q / (_poly(_B, r) * r + 1.0), out)
    out = np.where(p == 0, -np.inf, out)
    return np.where(p == 1, np.inf, out)
