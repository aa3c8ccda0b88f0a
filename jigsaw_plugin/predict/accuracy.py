"""``PredictionLog``: how well remaining-length predictions matched, in bounded memory.

Executors ``note`` a request's prediction at decision points and ``finish`` it when its
turn ends; the error of every kept note is then known and accumulated. Bounds:

* per request, a note is kept only when its ``generated`` has at least doubled since the
  last kept one (first note at any ``generated``), and at most ``max_notes_per_request``:
  a request contributes checkpoints spread over its life, not one per decision round;
* at most ``max_pending`` requests with open notes (the oldest are dropped: a request that
  was aborted for good never finishes);
* the (predicted, true) pairs behind the rank correlation are a seeded reservoir of
  ``max_pairs``; the error sums are exact over every kept note.

``remaining_s_mae`` prices each note's token error at the decode step time the executor
reported with it (``step_s``), i.e. the error in seconds of the replica's drain time.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from jigsaw_plugin.ids import RequestId

__all__ = ["PredictionLog", "spearman"]


class PredictionLog:
    def __init__(self, max_notes_per_request: int = 8, max_pending: int = 200_000, max_pairs: int = 50_000,
                 seed: int = 0):
        self.max_notes_per_request = int(max_notes_per_request)
        self.max_pending = int(max_pending)
        self.max_pairs = int(max_pairs)
        self._pending: OrderedDict[RequestId, list[tuple[int, float, float]]] = OrderedDict()
        self._rng = np.random.default_rng(seed)
        self._n = 0
        self._abs_tokens = 0.0
        self._abs_s = 0.0
        self._true_tokens = 0.0
        self._pairs = np.zeros((self.max_pairs, 2))
        self._seen_pairs = 0

    def note(self, request_id: RequestId, generated: int, predicted_remaining: float, step_s: float,
             t: float) -> None:
        """A prediction made at time ``t`` for a request that had generated ``generated``."""
        notes = self._pending.get(request_id)
        if notes is None:
            self._pending[request_id] = [(int(generated), float(predicted_remaining), float(step_s))]
            if len(self._pending) > self.max_pending:
                self._pending.popitem(last=False)
            return
        last_generated = notes[-1][0]
        if len(notes) < self.max_notes_per_request and generated >= max(1, 2 * last_generated):
            notes.append((int(generated), float(predicted_remaining), float(step_s)))

    def finish(self, request_id: RequestId, final_length: int) -> None:
        """The turn ended with ``final_length`` tokens: score its notes."""
        notes = self._pending.pop(request_id, None)
        if not notes:
            return
        for generated, predicted, step_s in notes:
            true = max(0, int(final_length) - generated)
            err = abs(predicted - true)
            self._n += 1
            self._abs_tokens += err
            self._abs_s += err * step_s
            self._true_tokens += true
            self._keep_pair(predicted, true)

    def _keep_pair(self, predicted: float, true: float) -> None:
        i = self._seen_pairs
        self._seen_pairs += 1
        if i < self.max_pairs:
            self._pairs[i] = (predicted, true)
            return
        j = int(self._rng.integers(0, i + 1))  # reservoir sampling (Algorithm R)
        if j < self.max_pairs:
            self._pairs[j] = (predicted, true)

    @property
    def notes(self) -> int:
        """Scored notes so far."""
        return self._n

    def summary(self, name: str) -> dict:
        """{"name", "remaining_tokens_mae", "remaining_tokens_rel_error" (sum |error| / sum
        true remaining), "remaining_s_mae", "rank_corr" (Spearman), "notes"}; metrics are
        None before anything was scored."""
        if self._n == 0:
            return {"name": name, "remaining_tokens_mae": None, "remaining_tokens_rel_error": None,
                    "remaining_s_mae": None, "rank_corr": None, "notes": 0}
        pairs = self._pairs[: min(self._seen_pairs, self.max_pairs)]
        return {
            "name": name,
            "remaining_tokens_mae": self._abs_tokens / self._n,
            "remaining_tokens_rel_error": self._abs_tokens / self._true_tokens if self._true_tokens > 0 else None,
            "remaining_s_mae": self._abs_s / self._n,
            "rank_corr": spearman(pairs[:, 0], pairs[:, 1]),
            "notes": self._n,
        }


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their average rank."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    first = np.concatenate(([True], xs[1:] != xs[:-1]))
    starts = np.flatnonzero(first)
    ends = np.concatenate((starts[1:], [len(x)]))
    avg = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    out = np.empty(len(x))
    out[order] = np.repeat(avg, ends - starts)
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None when undefined."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else None
