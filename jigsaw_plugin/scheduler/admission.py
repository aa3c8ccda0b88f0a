"""Admission limits: how many sequences a rollout replica may run so that their KV cache
stays within its capacity as they grow (docs/simulator.md, "Admission limits").

An engine (vLLM) admits a waiting request whenever its KV cache holds the request's
context *now*. The admitted sequences then grow by one token each per decode step; when
the cache is full the newest are preempted and later recomputed from their prompt and the
tokens they had. At long contexts such a cache overflows again and again, and the
recomputes take a large share of the rollout. A policy that predicts how many tokens each
sequence still generates can hold the waiting ones back instead: it admits the queue's
head only while the set's expected KV peak stays within the cache.

Pure functions of arrays (tokens), no policy state: the jigsaw policy calls them with its
request views' predictions (``Jigsaw._limit_admission``) and, before a rollout's requests
reach an engine, with the pipeline's recent finished lengths.
"""

from __future__ import annotations

import numpy as np

__all__ = ["peak_kv_tokens", "fitting", "trade_count", "FittingMemo", "HeldFit", "kv_moments", "spread_of", "launch_limit"]


def peak_kv_tokens(held: np.ndarray, remaining: np.ndarray) -> float:
    """The most KV (tokens) the sequences hold together if each generates its ``remaining``
    tokens from now, one per decode step, and nothing else is admitted: the cache grows by
    one token per running sequence per step and drops as sequences end, so its peak is just
    before one ends. With the sequences by remaining tokens, longest first, just before
    the j-th longest ends the first j hold ``held`` plus ``remaining[j]`` tokens each."""
    if not len(held):
        return 0.0
    order = np.argsort(-np.asarray(remaining, float), kind="stable")
    h = np.asarray(held, float)[order]
    r = np.maximum(np.asarray(remaining, float)[order], 0.0)
    return float(np.max(np.cumsum(h) + np.arange(1, len(h) + 1) * r))


def fitting(held: np.ndarray, remaining: np.ndarray, capacity: float, shape: np.ndarray | None = None,
            margin_sd: float = 0.0, running: int = 0, guess: int | None = None, most: int | None = None) -> int:
    """The most sequences, the first ones of ``held`` / ``remaining`` (running, then waiting
    in the order the engine admits them), whose set's KV peak stays within ``capacity``. A
    sequence added never lowers the peak. Fewer than the running ones: the running set
    itself is expected to overflow the cache, and an engine that then admits whatever a
    finished sequence frees preempts again and again (each preemption re-prefills the
    sequence's whole context later); a batch limit at this count sheds the excess instead.

    ``shape``: the sorted lengths of recently finished sequences over their mean (a unit-mean
    sample of how lengths spread), or None. With it, each sequence's remaining tokens are
    taken as its prediction times a draw of that spread, and the peak is that of the
    expected KV (``kv_moments``): a point prediction treats every sequence as ending at its
    mean, which for long-tailed lengths overstates the peak several times over (most end
    well before the mean and free their cache for the few that run long). ``margin_sd``:
    the peak is taken that many standard deviations above the expected KV (each sequence
    still running or not as an independent draw; ``kv_moments``): a set admitted up to its
    expected peak overflows about half the time, and each overflow preempts a sequence
    that is re-prefilled later. Without ``shape``, the peak of the point predictions
    (``peak_kv_tokens``), by bisection. ``running``: how many of the first sequences are
    running (likely to fit: the evaluation with ``shape`` takes them in its first block; the
    count is the same whatever it is). ``guess``: the count expected (the replica's last
    answer, ``FittingMemo``): the first block then ends just past it, the same count.
    ``most``: with ``shape``, a caller to which any count of at least ``most`` means the same
    (an engine's ``max_num_seqs``): the sums stop there, and the answer is at most ``most``
    (below it, the same count: the evaluation grid is still the whole set's). A 64 / 8
    replica holding 4,000 requests with room for 2,300 at 1,024 sequences a batch summed
    all 2,300 each round (5 ms)."""
    n = len(held)
    if n == 0:
        return 0
    if shape is not None and len(shape):
        rows = guess + 2 if guess is not None else running + _FIRST_ROWS
        return _fitting_expected(np.asarray(held, float), np.asarray(remaining, float), capacity, shape, margin_sd,
                                 rows, n if most is None else min(n, most))
    if peak_kv_tokens(held, remaining) <= capacity:
        return n
    lo, hi = 0, n  # lo fits (or is 0); find the largest k that fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if peak_kv_tokens(held[:mid], remaining[:mid]) <= capacity:
            lo = mid
        else:
            hi = mid
    return lo


class FittingMemo:
    """``fitting``'s last answer for each key (a replica), returned while its arguments are
    equal, element by element; any difference computes it again. Several decide rounds run
    at one instant (a decision's effects are decided on at once) and a replica that did not
    decode in between (a prefill, a weight load) asks with the same arrays: on a large mix
    (L9018) about a third of the calls. Where they differ, the last answer is ``fitting``'s
    guess: a replica's count moves little from round to round, so the sums stop just past
    it (on L9003's calls about 0.7x the rows of its running sequences and 32 more, which
    the first block held otherwise). ``traded`` keeps ``trade_count``'s answer (while the
    fitting count is the same). Keeps only the keys asked since the last ``round``."""

    __slots__ = ("_last", "_now", "_traded_last", "_traded_now")

    def __init__(self):
        self._last: dict = {}
        self._now: dict = {}
        self._traded_last: dict = {}
        self._traded_now: dict = {}

    def round(self) -> None:
        """A new decide round: what the last one did not ask is forgotten."""
        self._last, self._now = self._now, {}
        self._traded_last, self._traded_now = self._traded_now, {}

    def fitting(self, key, held: np.ndarray, remaining: np.ndarray, capacity: float, shape: np.ndarray | None,
                margin_sd: float, running: int, most: int | None = None) -> int:
        args = (capacity, margin_sd, running, most)
        got = self._last.get(key) or self._now.get(key)
        if got is not None and got[0] == args and _same(got[1], held) and _same(got[2], remaining) \
                and (got[3] is shape or (shape is not None and got[3] is not None and _same(got[3], shape))):
            n = got[4]
        else:
            n = fitting(held, remaining, capacity, shape, margin_sd, running, None if got is None else got[4], most)
        self._now[key] = (args, held, remaining, shape, n)
        return n

    def traded(self, key, first: int, top: int, price) -> int:
        """``trade_count``'s answer for ``key``: ``price()`` computes it, unless the last
        round that asked (or this one) asked with the same ``first`` and ``top``; then that
        answer is kept. Not the arrays' equality, as ``fitting``'s: a replica's sequences
        change every round as they decode, its fitting count far less often, and the trade
        is priced over the steps until a fifth of that count's set has ended; on a large mix
        (L9018) the trade, priced whenever the arrays changed, took the decision p50 from
        3,675 to 6,690 us."""
        got = self._traded_last.get(key) or self._traded_now.get(key)
        if got is not None and got[0] == (first, top):
            n = got[1]
        else:
            n = price()
        self._traded_now[key] = ((first, top), n)
        return n


class HeldFit:
    """``fitting`` of a replica's sequences (``held``, ``remaining``: running first) followed
    by sequences that may join it, asked for several candidate sets in one round (the
    preempted requests of each sibling, ``move_preempted``). The held sequences' expected-KV
    sums are computed once: each ``count`` continues them with the candidates', as
    ``_fitting_expected`` continues one block's sums with the next (``cumsum`` adds in
    order), on the same grid while no candidate's prediction reaches past the held ones'
    longest; otherwise, or without ``shape``, it is ``fitting`` itself. The same count as
    ``fitting`` of the joined arrays (tested); on a large mix (L9106) those calls had been
    86 ms of a slow round's 95 (a replica's few hundred running sequences priced again for
    each sibling's candidates)."""

    __slots__ = ("held", "remaining", "capacity", "shape", "margin_sd", "running", "_top", "_sums")

    def __init__(self, held: np.ndarray, remaining: np.ndarray, capacity: float, shape: np.ndarray | None,
                 margin_sd: float, running: int):
        self.held, self.remaining = np.asarray(held, float), np.asarray(remaining, float)
        self.capacity, self.shape, self.margin_sd, self.running = capacity, shape, margin_sd, running
        self._top = float(np.max(self.remaining, initial=1.0))
        self._sums = None  # (grid, first held row over capacity or None, last mean row, last variance row)

    def count(self, held: np.ndarray, remaining: np.ndarray) -> int:
        """``fitting`` of the held sequences followed by ``held`` / ``remaining``."""
        more_h, more_r = np.asarray(held, float), np.asarray(remaining, float)
        shape = self.shape
        n0 = len(self.held)
        if (shape is None or not len(shape) or not n0
                or float(np.max(more_r, initial=1.0)) > self._top):
            return fitting(np.concatenate((self.held, more_h)), np.concatenate((self.remaining, more_r)),
                           self.capacity, shape, self.margin_sd, self.running)
        if self._sums is None:
            t = _grid(self.remaining, shape)
            zero = np.zeros((1, len(t)))
            self._sums = (t, *_block(self.held, self.remaining, self.capacity, shape, self.margin_sd, t, zero, zero))
        t, over, mean_sum, var_sum = self._sums
        if over is not None:
            return over
        if not len(more_h):
            return n0
        more_over, _, _ = _block(more_h, more_r, self.capacity, shape, self.margin_sd, t, mean_sum, var_sum)
        return n0 + (len(more_h) if more_over is None else more_over)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b))


_POINTS = 48  # times at which the expected KV is evaluated
_FIRST_ROWS = 32  # sequences past the running ones whose expected KV ``fitting`` computes first


def _fitting_expected(held: np.ndarray, remaining: np.ndarray, capacity: float, shape: np.ndarray,
                      margin_sd: float, rows: int, most: int) -> int:
    """``fitting`` with ``shape``: the first k sequences fit while the peak over time of
    their summed expected KV (plus ``margin_sd`` of its deviation) stays within
    ``capacity``. The sums run over the sequences in order, a block at a time (``rows``,
    then doubling), each block's sums started from the last one's, so that a long queue behind
    a full replica (a 72B PPO step's 2,048 requests on a few replicas) is not evaluated
    past the first sequence that does not fit: the same sums, in the same order, as over
    all of them at once (``cumsum`` adds in order), so the count does not depend on the
    blocks (tested). No further than ``most`` sequences (``fitting``'s)."""
    n = most
    t = _grid(remaining, shape)  # over every sequence, as the whole set's evaluation
    mean_sum, var_sum = np.zeros((1, len(t))), np.zeros((1, len(t)))
    done = 0
    while done < n:
        end = min(n, done + rows)
        over, mean_sum, var_sum = _block(held[done:end], remaining[done:end], capacity, shape, margin_sd, t,
                                         mean_sum, var_sum)
        if over is not None:
            return done + over
        done, rows = end, 2 * rows
    return n


def _block(held: np.ndarray, remaining: np.ndarray, capacity: float, shape: np.ndarray, margin_sd: float,
           t: np.ndarray, mean_sum: np.ndarray, var_sum: np.ndarray) -> tuple:
    """One block of ``_fitting_expected``'s sums: (the first of these sequences whose set's
    total is over ``capacity``, or None; the sums through the block's last sequence), the
    block's expected KV added in order to the sums of the sequences before it."""
    mean, var = kv_moments(held, remaining, shape, t)
    means = np.cumsum(np.concatenate((mean_sum, mean)), axis=0)[1:]  # the first k + 1, k = done, ...
    total = means
    if margin_sd > 0:
        variances = np.cumsum(np.concatenate((var_sum, var)), axis=0)[1:]
        total = means + margin_sd * np.sqrt(variances)
        var_sum = variances[-1:]
    over = np.flatnonzero(~(total.max(axis=1) <= capacity))  # NaN counts as over
    return (int(over[0]) if len(over) else None), means[-1:], var_sum


def _grid(remaining: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """Decode steps from now at which to evaluate the expected KV: up to the longest
    sequence's prediction times the spread's longest draw."""
    top = float(np.max(remaining, initial=1.0)) * float(shape[-1])
    return np.linspace(0.0, max(top, 1.0), _POINTS)


def kv_moments(held: np.ndarray, remaining: np.ndarray, shape: np.ndarray,
               t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of each sequence's KV (tokens) after ``t`` decode steps, one row
    per sequence: it holds ``held + t`` tokens while it still runs, which it does with
    probability ``p = P(X > t / remaining)`` for ``X`` drawn from ``shape``, else none."""
    running = _running(remaining, shape, t)
    kv = np.asarray(held, float)[:, None] + t[None, :]
    mean = kv * running
    return mean, mean * kv * (1.0 - running)


_TRADE_STEP = 1.125  # candidate counts past the fitting one grow by this factor
# a count past the fitting one is taken only where its rate beats the fitting count's by this
# factor: the model leaves out what a preemption costs beyond its recompute (the sequence's
# wait for a slot, the newest sequence's whole context dropped for a small excess); at 1.0
# it moved 18 of the 60 synthetic mixes, +0.07% geometric mean (s46 +4.5%), at 1.25 two
# (+0.01%); s23000's agent -11.6% and -11.8% (with the memo of stop 91's final form
# -11.9%: docs/simulator.md, "Admission limits")
_TRADE_MIN_GAIN = 1.25
_TRADE_GIVE_UP = 0.9  # counts are tried upward until one's rate falls below this x the best's
_TRADE_POINTS = 24  # decode steps at which ``trade_count`` evaluates each candidate


def trade_count(held: np.ndarray, remaining: np.ndarray, capacity: float, shape: np.ndarray, first: int,
                top: int, step_s, recompute_s_per_token: float, horizon: float = 0.8) -> int:
    """The count of sequences (the first ones of ``held`` / ``remaining``, as ``fitting``'s)
    at which a replica decodes fastest with its overflows priced: ``first`` (``fitting``'s
    count, whose expected peak fits) or more, up to ``top``.

    Each candidate set runs as ``kv_moments`` expects it to, with no admission after it: a
    cache whose expected KV is over ``capacity`` runs full, its running sequences thinned
    in proportion (the engine preempts the newest), and drops the excess, each token to be
    prefilled again (``recompute_s_per_token``); a decode step costs ``step_s(batch,
    kv_tokens)`` (arrays: ``CostModel.decode_steps_s``). Its rate: expected tokens decoded
    over the steps' seconds and the recompute's, from now until the fitting set has lost
    ``1 - horizon`` of its running sequences (past that the queue would refill their
    slots, which the model leaves out: over a whole drain a larger set always looks
    faster, its batch thinning later). The best rate wins, the smaller count on a tie,
    where it beats the fitting count's by ``_TRADE_MIN_GAIN``; counts are tried upward, a
    batch at a time, until one's rate falls below ``_TRADE_GIVE_UP`` of the best.

    Why: the peak rule holds a full cache's batch at what its expected peak allows. Where
    decode steps are bound by their KV reads and prefill is cheap (a 14B agent's
    9K-token turns on A100s, ``benchmarks/single_job.py``'s s23000) more sequences in the
    same full cache yield more tokens a step than their recompute costs; where a larger
    batch barely speeds a step and prefill is dear (a 32B on H20s) it does not."""
    n = min(len(held), int(top))
    if first >= n or shape is None or not len(shape):
        return first
    held, remaining = np.asarray(held, float)[:n], np.asarray(remaining, float)[:n]
    k0 = max(1, first)
    wide = _grid(remaining, shape)
    base = _running(remaining[:k0], shape, wide).sum(axis=0)
    end = float(wide[max(1, int(np.sum(base >= horizon * base[0])) - 1)])
    t = np.linspace(0.0, max(end, 1.0), _TRADE_POINTS)
    dt = float(t[1] - t[0])
    rows = _Rows(held, remaining, shape, t)
    best, best_rate, k = first, -1.0, k0
    while True:  # a batch of counts at a time, each up to twice the last batch's end
        ks = [k]
        while ks[-1] < n and ks[-1] < 2 * k:
            ks.append(min(n, max(ks[-1] + 1, int(ks[-1] * _TRADE_STEP))))
        m, b = rows.upto(np.asarray(ks))
        scale = np.where(m > capacity, capacity / np.maximum(m, 1e-9), 1.0)
        excess = np.maximum(m - capacity, 0.0)
        dropped = excess[:, 0] + np.sum(np.maximum(np.diff(excess, axis=1), 0.0), axis=1)
        seconds = np.sum(step_s(b * scale, np.minimum(m, capacity)), axis=1) + dropped * recompute_s_per_token / dt
        rates = np.sum(b * scale, axis=1) / np.maximum(seconds, 1e-12)
        i = int(np.argmax(rates))
        if best_rate < 0:
            first_rate = float(rates[0])  # ``k0``'s: ``first``'s, or one sequence's where it is 0
        if rates[i] > best_rate:
            best, best_rate = ks[i], float(rates[i])
        if ks[-1] >= n or rates[-1] < _TRADE_GIVE_UP * best_rate:
            break
        k = min(n, max(ks[-1] + 1, int(ks[-1] * _TRADE_STEP)))
    return first if best_rate < _TRADE_MIN_GAIN * first_rate else max(best, first)


class _Rows:
    """``trade_count``'s running sums of the sequences' expected KV and running counts at
    each of ``t``'s steps, computed a block of sequences at a time as the counts tried reach
    them (a long queue behind a full replica is not evaluated past the count that loses)."""

    __slots__ = ("held", "remaining", "shape", "t", "kv", "running")

    def __init__(self, held: np.ndarray, remaining: np.ndarray, shape: np.ndarray, t: np.ndarray):
        self.held, self.remaining, self.shape, self.t = held, remaining, shape, t
        self.kv = np.zeros((0, len(t)))
        self.running = np.zeros((0, len(t)))

    def upto(self, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(expected KV, expected running sequences) of the first ``k`` sequences by step,
        one row for each ``k`` of ``ks``."""
        have, k = len(self.kv), int(np.max(ks))
        if k > have:
            end = min(len(self.held), max(k, 2 * have, 64))
            run = _running(self.remaining[have:end], self.shape, self.t)
            kv = (self.held[have:end, None] + self.t[None, :]) * run
            last_kv = self.kv[-1] if have else np.zeros(len(self.t))
            last_run = self.running[-1] if have else np.zeros(len(self.t))
            self.kv = np.concatenate((self.kv, last_kv + np.cumsum(kv, axis=0)))
            self.running = np.concatenate((self.running, last_run + np.cumsum(run, axis=0)))
        return self.kv[ks - 1], self.running[ks - 1]


def _running(remaining: np.ndarray, shape: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The probability that each sequence still runs after ``t`` decode steps (one row a
    sequence): ``P(X > t / remaining)`` for ``X`` drawn from ``shape``, as ``kv_moments``."""
    r = np.maximum(np.asarray(remaining, float), 1.0)
    return 1.0 - np.searchsorted(shape, t[None, :] / r[:, None], side="right") / len(shape)


def spread_of(lengths: np.ndarray) -> np.ndarray | None:
    """``fitting``'s ``shape``: the lengths sorted, over their mean (None: none or all 0)."""
    lengths = np.asarray(lengths, float)
    mean = float(lengths.mean()) if len(lengths) else 0.0
    return np.sort(lengths) / mean if mean > 0 else None


def launch_limit(lengths: np.ndarray, context: float, capacity: float) -> int | None:
    """The batch limit for a replica whose requests have not reached it yet: as many
    sequences as the cache holds at their predicted peak when they start together, each
    with ``context`` tokens and a length drawn from ``lengths`` (the pipeline's recent
    finished lengths: what the predictor's marginal is learned from). Per sequence the
    cache then holds ``(context + t) x P(L > t)`` tokens after ``t`` steps on average;
    its peak is at one of the observed lengths. None: no lengths observed yet."""
    lengths = np.asarray(lengths, float)
    if not len(lengths) or capacity <= 0:
        return None
    desc = np.sort(lengths)[::-1]
    survive = np.arange(1, len(desc) + 1) / len(desc)  # P(L >= desc[j])
    per_seq = float(np.max((context + desc) * survive))
    if per_seq <= 0:
        return None
    return max(1, int(capacity // per_seq))
