"""The fitted length model of one pipeline: per-turn log-normal marginals and the GRPO
group share of variance.

Model (log scale, standardised per turn bin ``t``)::

    log L = mu_t + sigma_t * z,   z = b_group + e,   b ~ N(0, rho),  e ~ N(0, 1 - rho)

``mu_t, sigma_t``: the censored MLE (``lognormal.fit_censored``) of the turn bin's finished
lengths, with the pooled all-turn fit as its prior (worth ``PriorConfig.weight``), which in
turn has the ``PriorConfig`` log-normal as its prior. ``rho``: the intra-class correlation
of ``z`` among the finished turns of one (step, group), the one-way ANOVA estimator over the
groups of held steps older than the newest (in a synchronous pipeline those groups are
complete; the newest step's groups are not, and the short responses that finish first would
make them look tighter than they are), pooled with ``PriorConfig.group_icc`` worth
``group_icc_weight`` groups. Capped lengths are left out of ``rho`` (their value is unknown).

The log-normal is the model of *relative* effects (siblings, earlier epochs); the *shape*
of the remaining length comes from the data: ``Empirical`` holds, per turn bin, the recent
finished lengths (``LengthHistory.recent``) sorted, with suffix sums, from which
``E[min(L, cap) | L > g]`` is exact on the empirical distribution. Real length
distributions are not log-normal (PolyTrace verl/: a long lower tail of very short answers
inflates the log-normal sigma to 0.93 while the p50-p90 range says 0.63, so the log-normal
overstates remaining tokens by 40-60% at 256-1,024 generated tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.predict.config import PriorConfig
from jigsaw_plugin.predict.history import LengthHistory
from jigsaw_plugin.predict.lognormal import fit_censored

__all__ = ["Empirical", "EmpiricalTable", "LengthModel", "fit_model", "RHO_RANGE"]

RHO_RANGE = (1e-4, 0.95)  # keeps both variance components positive
_ALL = np.logical_and.reduce  # ndarray.all without its wrapper


@dataclass(frozen=True, eq=False)
class Empirical:
    """Recent finished lengths of one turn bin, sorted, with suffix sums and, for every
    token count 0..max_tokens, how many lengths are <= it and < it (lookups instead of
    binary searches on the per-call path)."""

    lengths: np.ndarray  # float64[n], ascending
    suffix: np.ndarray  # float64[n + 1]: suffix[i] = lengths[i:].sum()
    count_le: np.ndarray  # int32[max_tokens + 1]
    count_lt: np.ndarray  # int32[max_tokens + 1]

    @classmethod
    def of(cls, lengths: np.ndarray, max_tokens: int) -> "Empirical":
        x = np.sort(np.asarray(lengths, dtype=np.float64))
        suffix = np.zeros(len(x) + 1)
        suffix[:-1] = np.cumsum(x[::-1])[::-1]
        size = int(max_tokens) + 1
        if len(x) and x[0] >= 0 and _ALL(x == np.floor(x)):
            # whole-token lengths (what a history holds): the counts at each whole token
            # from a histogram and its running sum, the same integers as the binary searches
            # below at a fraction of their cost (two searches of max_tokens + 1 points per
            # turn bin were most of a model refit, 0.3-0.5 ms inside a decide round)
            inside = x[:np.searchsorted(x, size - 1, side="right")].astype(np.intp)  # above the grid: never <= it
            hits = np.bincount(inside, minlength=size)
            le = np.cumsum(hits)
            return cls(x, suffix, le.astype(np.int32), (le - hits).astype(np.int32))
        grid = np.arange(size, dtype=np.float64)
        return cls(x, suffix, np.searchsorted(x, grid, side="right").astype(np.int32),
                   np.searchsorted(x, grid, side="left").astype(np.int32))

    def remaining(self, generated: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(E[min(L, cap) | L > g] - g, how many recent lengths exceed g) per request; the
        mean is 0 where none does (give it no weight). g and cap are read as whole tokens."""
        n = len(self.lengths)
        top = len(self.count_le) - 1
        # np.clip's values (NaN too) from its two ufuncs, without its wrappers (every call)
        above = self.count_le[np.minimum(np.maximum(generated, 0), top).astype(np.intp)]
        at_cap = np.maximum(self.count_lt[np.minimum(np.maximum(cap, 0), top).astype(np.intp)], above)
        k = (n - above).astype(np.float64)
        total = self.suffix[above] - self.suffix[at_cap] + cap * (n - at_cap)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(k > 0, total / k - generated, 0.0)
        return mean, k


@dataclass(frozen=True, eq=False)
class EmpiricalTable:
    """Every turn bin's ``Empirical`` as one set of arrays: a batch whose requests span
    several turn bins is worked on at once, bin by bin only for the two count lookups (the
    same arithmetic as ``Empirical.remaining``, element by element)."""

    empirical: tuple  # per turn bin, ``Empirical`` or None (no recent lengths)
    has: np.ndarray  # bool[T]: the bin holds recent lengths
    n: np.ndarray  # int64[T]: how many
    offset: np.ndarray  # int64[T]: where the bin's suffix sums start in ``suffix``
    suffix: np.ndarray  # float64: the bins' ``Empirical.suffix`` one after another

    @classmethod
    def of(cls, empirical: tuple) -> "EmpiricalTable":
        sizes = [0 if e is None else len(e.lengths) for e in empirical]
        suffixes = [np.zeros(1) if e is None else e.suffix for e in empirical]
        offset = np.cumsum([0] + [len(x) for x in suffixes[:-1]])
        return cls(tuple(empirical), np.asarray([e is not None for e in empirical]), np.asarray(sizes, np.int64),
                   offset.astype(np.int64), np.concatenate(suffixes))

    def remaining(self, tb: np.ndarray, generated: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``Empirical.remaining`` of each request on its own turn bin ``tb`` (every one a
        bin that ``has`` lengths)."""
        bins = np.bincount(tb).nonzero()[0].tolist()
        if not bins:  # no request on a bin with lengths
            return np.zeros(0), np.zeros(0)
        first = self.empirical[bins[0]]
        top = len(first.count_le) - 1
        at = np.minimum(np.maximum(generated, 0), top).astype(np.intp)
        at_cap = np.minimum(np.maximum(cap, 0), top).astype(np.intp)
        if len(bins) == 1:
            above, below_cap = first.count_le[at], first.count_lt[at_cap]
        else:
            above, below_cap = np.empty(len(tb), np.int32), np.empty(len(tb), np.int32)
            for b in bins:
                sel = tb == b
                above[sel] = self.empirical[b].count_le[at[sel]]
                below_cap[sel] = self.empirical[b].count_lt[at_cap[sel]]
        at_cap = np.maximum(below_cap, above)
        n = self.n[tb]
        k = (n - above).astype(np.float64)
        start = self.offset[tb]
        total = self.suffix[start + above] - self.suffix[start + at_cap] + cap * (n - at_cap)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(k > 0, total / k - generated, 0.0)
        return mean, k


@dataclass(frozen=True, eq=False)
class LengthModel:
    mu: np.ndarray  # float64[T]: mean log length per turn bin
    sigma: np.ndarray  # float64[T]: standard deviation of log length per turn bin
    rho: float  # share of the variance of z between GRPO groups
    groups_used: int  # finished groups behind the rho estimate (0: the prior alone)
    count: int  # history.count when fitted
    newest_step: int
    empirical: tuple[Empirical | None, ...]  # per turn bin; None: no recent lengths
    table: EmpiricalTable | None = None  # ``empirical`` as one table (None, a model built by hand: made at each read)


def fit_model(history: LengthHistory, prior: PriorConfig) -> LengthModel:
    st = history.marginal()
    mu0 = np.array([math.log(prior.median_fraction * history.max_tokens)])
    var0 = np.array([prior.sigma**2])
    pooled_mu, pooled_sd = fit_censored(
        np.array([st.weight.sum()]), np.array([st.sum_log.sum()]), np.array([st.sumsq_log.sum()]),
        np.array([st.capped.sum()]), history.log_max_tokens, mu0, var0, prior.weight)
    t = history.turn_bins
    mu, sd = fit_censored(st.weight, st.sum_log, st.sumsq_log, st.capped, history.log_max_tokens,
                          np.full(t, pooled_mu[0]), np.full(t, pooled_sd[0] ** 2), prior.weight)
    rho_hat, groups = _group_icc(history, mu, sd)
    w0 = prior.group_icc_weight
    rho = (w0 * prior.group_icc + groups * rho_hat) / (w0 + groups)
    rho = float(min(max(rho, RHO_RANGE[0]), RHO_RANGE[1]))
    turns, lengths = history.recent()
    bins = np.minimum(turns, t - 1)
    empirical = tuple(Empirical.of(lengths[bins == b], history.max_tokens) if np.any(bins == b) else None
                      for b in range(t))
    return LengthModel(mu, sd, rho, groups, history.count, history.newest_step, empirical,
                       EmpiricalTable.of(empirical))


def _group_icc(history: LengthHistory, mu: np.ndarray, sd: np.ndarray) -> tuple[float, int]:
    """ANOVA ICC(1) of standardised log lengths over the held groups of older steps."""
    n_parts, z_parts, zz_parts = [], [], []
    for step in history.window():
        if step >= history.newest_step:
            continue
        tab = history.group_table(step)
        n = tab.count
        z = ((tab.sum_log - n * mu) / sd).sum(axis=1)
        zz = ((tab.sumsq_log - 2.0 * mu * tab.sum_log + n * mu**2) / sd**2).sum(axis=1)
        ng = n.sum(axis=1)
        keep = ng >= 2
        n_parts.append(ng[keep])
        z_parts.append(z[keep])
        zz_parts.append(zz[keep])
    if not n_parts:
        return 0.0, 0
    ng, z, zz = np.concatenate(n_parts), np.concatenate(z_parts), np.concatenate(zz_parts)
    g = len(ng)
    total = ng.sum()
    if g < 2 or total <= g:
        return 0.0, 0
    between_ss = (z**2 / ng).sum() - z.sum() ** 2 / total
    within_ss = zz.sum() - (z**2 / ng).sum()
    msb = between_ss / (g - 1)
    msw = within_ss / (total - g)
    k0 = (total - (ng**2).sum() / total) / (g - 1)
    denom = msb + (k0 - 1.0) * msw
    if denom <= 0:
        return 0.0, 0
    return float(min(max((msb - msw) / denom, 0.0), RHO_RANGE[1])), g
