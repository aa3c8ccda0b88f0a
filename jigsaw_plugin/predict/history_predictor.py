"""``HistoryPredictor``: remaining tokens of in-flight requests from what has finished.

For each request (turn bin ``t``, ``g`` tokens generated, budget ``cap``) it predicts
``E[min(L, cap) | L > g] - g`` under the capped log-normal of ``model.py``, where the
request's log-length distribution combines:

(a) the pipeline's per-turn marginal, learned online from the ``PriorConfig`` prior on;
(b) its GRPO group: the posterior of the group effect ``b`` from the finished turns of the
    same (step, group) (``k`` standardised residuals, shrinkage ``(1 - rho) / rho``);
    siblings that are still running, and finished siblings that hit the cap, are censored
    observations (``z > threshold``) and enter by EM: each is replaced by
    ``E[z | z > threshold, b]``, ``b`` re-estimated, ``em_iterations`` times. This is what
    keeps the estimate from the short-first bias: a group whose first finishers are short
    but whose other members are already long is not taken for a short group. A request
    never counts itself (leave-one-out); its own condition ``L > g`` enters in the
    truncated mean. The posterior variance counts only uncensored evidence (conservative);
(c) earlier epochs of the same ``prompt_key``: their residuals are extra observations of
    ``b``, each worth ``PriorConfig.epoch_weight`` of a sibling.

The predictive of ``log L`` is then ``N(mu_t + sigma_t * b_hat, sigma_t^2 (post_var + 1 - rho))``.
The log-normal gives the *relative* effect of (b) and (c): the prediction is the
turn bin's empirical ``E[min(L, cap) | L > g] - g`` over recent finished lengths
(``model.Empirical``; shrunk toward the log-normal's where few recent lengths exceed ``g``:
weight ``k / (k + 16)``), times the ratio of the log-normal's remaining tokens with and
without the group evidence.
Everything on the per-call path is vectorised; the model (marginals, rho) is refitted only
when the history grew by more than 1/64 (or at least one record) since the last fit or a
new step appeared.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.hookspecs import hookimpl
from jigsaw_plugin.predict.batch import RequestBatch
from jigsaw_plugin.predict.config import PriorConfig
from jigsaw_plugin.predict.history import LengthHistory
from jigsaw_plugin.predict.lognormal import FUSE_MAX_ELEMENTS, expected_remaining
from jigsaw_plugin.predict.model import EmpiricalTable, LengthModel, fit_model
from jigsaw_plugin.predict.normal import inv_mills

__all__ = ["PredictorFeatures", "HistoryPredictor", "clip_to_budget"]

_ADD, _MAX, _MIN, _ALL = np.add.reduce, np.maximum.reduce, np.minimum.reduce, np.logical_and.reduce  # unwrapped
_REFIT_FRACTION = 64  # refit once the history grew by count / 64 records
_TAIL_SHRINK = 16.0  # recent lengths above g worth as much as the log-normal tail


@dataclass(frozen=True)
class PredictorFeatures:
    """Which evidence the predictor uses (everything by default; the rest are ablations)."""

    condition_on_generated: bool = True  # E[L - g | L > g]; False: E[L] - g
    siblings: bool = True  # the GRPO group effect (b)
    earlier_epochs: bool = True  # the same prompt_key's earlier lengths (c)
    em_iterations: int = 2  # censored siblings: EM steps

    def __post_init__(self) -> None:
        if isinstance(self.em_iterations, bool) or not isinstance(self.em_iterations, int) \
                or not 1 <= self.em_iterations <= 20:
            raise SpecError("PredictorFeatures.em_iterations", self.em_iterations, "an integer in [1, 20]")


def clip_to_budget(remaining: np.ndarray, generated: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
    """Clip to ``[1, max_tokens - generated]`` (``[0, 0]`` where nothing is left)."""
    budget = np.subtract(max_tokens, generated)
    np.maximum(budget, 0.0, out=budget)
    out = np.maximum(remaining, np.minimum(1.0, budget))
    return np.minimum(out, budget, out=out)


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique`` of an int array (sorted, duplicates dropped) without its wrappers:
    the same values, a few numpy calls (this runs on every call with a rollout tail)."""
    a = np.sort(a)
    if len(a) > 1:
        a = a[np.concatenate(([True], a[1:] != a[:-1]))]
    return a


class HistoryPredictor:
    """The built-in length predictor (a pluggy plugin; see the module docstring)."""

    name = "history"

    def __init__(self, prior: PriorConfig = PriorConfig(), features: PredictorFeatures = PredictorFeatures()):
        if not isinstance(prior, PriorConfig):
            raise SpecError("HistoryPredictor.prior", prior, "a predict.PriorConfig")
        if not isinstance(features, PredictorFeatures):
            raise SpecError("HistoryPredictor.features", features, "a predict.PredictorFeatures")
        self.prior = prior
        self.features = features
        self._models: weakref.WeakKeyDictionary[LengthHistory, LengthModel] = weakref.WeakKeyDictionary()

    @hookimpl
    def jigsaw_predict_remaining(self, pipeline: str, requests, history) -> np.ndarray | None:
        if not isinstance(history, LengthHistory):
            return None  # not ours to answer: no history to learn from
        return self.predict(requests, history)

    def model(self, history: LengthHistory) -> LengthModel:
        """The fitted model of ``history`` (cached; see the refit rule above)."""
        m = self._models.get(history)
        if m is None or m.newest_step != history.newest_step or \
                history.count >= m.count + max(1, m.count // _REFIT_FRACTION):
            m = self._models[history] = fit_model(history, self.prior)
        return m

    def predict(self, requests, history: LengthHistory) -> np.ndarray:
        """Predicted remaining tokens, one per request (a tuple of ``RequestView``-like
        records or a ``RequestBatch``), clipped to ``[1, max_tokens - generated]``."""
        if not isinstance(history, LengthHistory):
            raise SpecError("history", type(history).__name__, "a predict.LengthHistory")
        batch = RequestBatch.of(requests)
        if len(batch) == 0:
            return np.zeros(0)
        model = self.model(history)
        tb = np.minimum(batch.turn, history.turn_bins - 1)
        mu = model.mu[tb]
        sd = model.sigma[tb]
        g = batch.generated
        cap = np.maximum(batch.max_tokens, 1.0)
        condition = self.features.condition_on_generated
        n = len(g)
        if not self.features.siblings:
            marginal = expected_remaining(mu, sd * sd, g, cap, condition)
        else:
            b, post_var = self._group_effect(batch, history, model, tb, mu, sd)
            m_grouped, v_grouped = mu + sd * b, sd * sd * (post_var + 1.0 - model.rho)
            if 2 * n <= FUSE_MAX_ELEMENTS:  # the marginal and the grouped in one pass of 2N
                both = expected_remaining(np.concatenate((mu, m_grouped)), np.concatenate((sd * sd, v_grouped)),
                                          np.concatenate((g, g)), np.concatenate((cap, cap)), condition)
                marginal, grouped = both[:n], both[n:]
            else:
                marginal = expected_remaining(mu, sd * sd, g, cap, condition)
                grouped = expected_remaining(m_grouped, v_grouped, g, cap, condition)
        base = self._empirical(model, tb, g if condition else np.zeros_like(g), cap, marginal)
        if not condition:
            base = base - g
        if self.features.siblings:
            with np.errstate(invalid="ignore", divide="ignore"):
                base = base * np.where(marginal > 0, grouped / marginal, 1.0)
        return clip_to_budget(base, g, batch.max_tokens)

    @staticmethod
    def _empirical(model: LengthModel, tb: np.ndarray, g: np.ndarray, cap: np.ndarray,
                   marginal: np.ndarray) -> np.ndarray:
        """The empirical remaining tokens per request, shrunk toward the log-normal's."""
        out = marginal.copy()
        table = model.table or EmpiricalTable.of(model.empirical)
        # the rows whose turn bin holds recent lengths (the others keep the log-normal's),
        # every bin's looked up at once
        has = table.has[tb]
        sel = slice(None) if _ALL(has) else has.nonzero()[0]
        mean, k = table.remaining(tb[sel], g[sel], cap[sel])
        w = k / (k + _TAIL_SHRINK)
        out[sel] = w * mean + (1.0 - w) * marginal[sel]
        return out

    def _group_effect(self, batch: RequestBatch, history: LengthHistory, model: LengthModel,
                      tb: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(b_hat, posterior variance of b) per request: see (b) and (c) above."""
        first_step = int(_MIN(batch.step))
        steps = range(first_step, int(_MAX(batch.step)) + 1)
        if len(steps) > 4 * history.window_steps:  # scattered steps: index the ones present
            steps = np.unique(batch.step).tolist()
            slot = np.searchsorted(steps, batch.step)
        else:
            slot = batch.step - first_step
        # each step's (group, turn bin, statistic) array as the history holds it (read-only)
        tables = [history.group_stats(s) for s in steps]
        width = max([int(_MAX(batch.group)) + 1] + [t.shape[0] for t in tables if t is not None])
        key = slot * width + batch.group
        if 2 * len(key) < len(steps) * width:
            # a few requests (a rollout tail): only the (step, group) pairs present, so the
            # work follows the requests, not the size of the history's group tables (the
            # keys sorted and searched: ``np.unique``'s answer without its wrappers)
            present = _sorted_unique(key)
            key = np.searchsorted(present, key)
        else:
            present = np.arange(len(steps) * width)
        nkeys = len(present)
        present_slot, present_group = np.divmod(present, width)

        obs_n = np.zeros(nkeys)  # uncensored finished evidence (epoch-weighted)
        obs_z = np.zeros(nkeys)  # sum of its standardised residuals
        cap_n = np.zeros(nkeys)  # finished siblings that hit the cap
        cap_thr = np.zeros(nkeys)  # sum of their thresholds (standardised log cap)
        thr_t = (history.log_max_tokens - model.mu) / model.sigma
        for i, tab in enumerate(tables):
            if tab is None:
                continue
            sel = ((present_slot == i) & (present_group < tab.shape[0])).nonzero()[0]
            if not len(sel):
                continue
            # the rows' statistics, each a contiguous [rows, turn bins] array (what indexing a
            # ``GroupTable`` column gave), in one gather and one copy; summed over turn bins
            count, sum_log, _, capped = tab.take(present_group[sel], axis=0).transpose(2, 0, 1).copy()
            obs_n[sel] = _ADD(count, axis=1)
            obs_z[sel] = _ADD((sum_log - count * model.mu) / model.sigma, axis=1)
            cap_n[sel] = _ADD(capped, axis=1)
            cap_thr[sel] = _ADD(capped * thr_t, axis=1)
        if self.features.earlier_epochs and batch.prompt_keys is not None:
            self._add_epochs(batch, history, model, key, obs_n, obs_z)
        cap_thr = cap_thr / np.maximum(cap_n, 1.0)

        rho = model.rho
        se = math.sqrt(1.0 - rho)
        shrink = (1.0 - rho) / rho
        with np.errstate(divide="ignore"):
            # a request that has generated nothing says nothing (threshold -inf)
            c = np.where(batch.generated > 0, (np.log(np.maximum(batch.generated, 0.5)) - mu) / sd, -np.inf)
        k = obs_n + cap_n + np.bincount(key, minlength=nkeys)
        b = obs_z / (obs_n + shrink)
        n = len(key)
        for _ in range(self.features.em_iterations):
            bj = b[key]
            # running siblings' and capped siblings' imputations in one inv_mills pass
            lam = inv_mills(np.concatenate(((c - bj) / se, (cap_thr - b) / se)))
            imputed = bj + se * lam[:n]
            s = obs_z + cap_n * (b + se * lam[n:]) + np.bincount(key, imputed, nkeys)
            b = s / (k + shrink)
        b_own = (s[key] - imputed) / (k[key] - 1.0 + shrink)  # leave the request itself out
        post_var = 1.0 / (1.0 / rho + obs_n[key] / (1.0 - rho))
        return b_own, post_var

    def _add_epochs(self, batch: RequestBatch, history: LengthHistory, model: LengthModel, key: np.ndarray,
                    obs_n: np.ndarray, obs_z: np.ndarray) -> None:
        """Earlier-epoch lengths of each group's prompt as extra, down-weighted evidence."""
        groups, first = np.unique(key, return_index=True)
        keys = [batch.prompt_keys[i] for i in first.tolist()]
        ev = history.prompt_evidence(keys, batch.step[first])
        w = self.prior.epoch_weight
        obs_n[groups] += w * ev.count.sum(axis=1)
        obs_z[groups] += w * ((ev.sum_log - ev.count * model.mu) / model.sigma).sum(axis=1)
